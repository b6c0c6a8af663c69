"""Weight-only int8/int4 products on a CUDA GPU: ``y = x @ W.T`` reading the codes, not a float ``W``.

The GPU twin of :mod:`.kernels`' C products, over the same contract (the tensors of
:class:`~.quant_linear.QuantLinear`): ``x [M, K]`` float32, bfloat16 or float16; the weight as

- int8 per channel: codes int8 ``[N, K]``, ``scale [N]``: ``W = code * scale``;
- int8 per group: codes int8 ``[N, K]``, ``scale`` and ``offset [N, K // group]``:
  ``W = code * scale + offset``;
- int4 per group: codes 0..15 packed two a byte, uint8 ``[N, K // 2]`` (column ``2j`` in the low
  nibble), ``scale`` and ``offset [N, K // group]`` (per channel is one group of the whole row).

``y [M, N]`` comes back in ``x``'s dtype. Worked example, int4 in groups of 32 with ``K = 64``:
row ``n`` of the codes is 32 bytes; weight ``(n, 37)`` is the high nibble of byte 18, in group 1,
so it stands for ``code * scale[n, 1] + offset[n, 1]``.

How: one Triton program per tile of ``BLOCK_N`` outputs by 16 rows of ``x`` (and by one slice of
``K`` where the output tiles alone are too few to keep every multiprocessor busy, as in a one-row
step of a 2048-wide projection). It loads a tile of codes with their scales, dequantizes it in
registers to ``x``'s dtype (so the weight is the one ``QuantLinear.dequantize(x.dtype)`` gives,
up to where a multiply-add rounds once), and multiplies on ``tl.dot`` with float32 sums: tensor
cores in half precision, exact float32 products (``ieee``) in float32. int4 loads a contiguous
tile of bytes and multiplies its low nibbles with the even columns of ``x`` and its high
nibbles with the odd ones (two dots). The slices' partial sums go to a float32 buffer that a
second kernel adds up in slice order.

Invariant: **row-invariant**. Row ``i`` of ``y`` depends on ``x[i]`` and the weight alone, never
on ``M``: the tile sizes and the slicing of ``K`` are chosen from ``(N, K)`` and the GPU, and each
output's sum runs in the same order whatever the other rows. So greedy speculative decoding on a
quantized engine equals plain greedy decoding on a GPU, as the C kernels make it on the CPU.

Cost: the codes and scales are read once per 16 rows of ``x`` (1 byte a weight for int8, half a
byte for int4, plus 8 bytes of scale and offset per group); one row costs the same as 16. Each
new ``(kind, dtype, group)`` compiles once per process (about a second). Measured speeds:
``bench/bench_gpu_quant.py`` and docs/benchmarks.md.

Triton runs on CUDA tensors; with ``TRITON_INTERPRET=1`` set before import it runs the same
kernels on CPU tensors (slow; how the kernels are checked on a machine without a GPU).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import lru_cache

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only torch: no Triton, and no GPU to run it on
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROWS = 16  # rows of x per program (tl.dot's smallest tile)
KINDS = {"int8": 1, "int4": 2, "int8g": 3}  # as step_ops.KINDS numbers the C kernels' kinds


def available() -> bool:
    """Whether these products can run here (Triton importable)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _dequantize(code, s_ptr, z_ptr, rn, n_ok, k0, groups_per_row,
                    KIND: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    COLUMN_STEP: tl.constexpr, COLUMN_FIRST: tl.constexpr):
        """``code * scale + offset`` for a float32 tile of codes whose column ``j`` is weight column
        ``k0 + COLUMN_FIRST + COLUMN_STEP * j`` (int4's even or odd columns: step 2). Columns past
        the row (``groups_per_row * GROUP``) read no scale; their codes are 0 and their ``x`` is 0."""
        if KIND == 1:
            return code  # per channel: the scale multiplies the sums
        elif GROUP % BLOCK_K == 0:  # the tile lies in one group of each row: one scale a row
            g = rn * groups_per_row + k0 // GROUP
            ok = n_ok & (k0 // GROUP < groups_per_row)  # (a slice's last steps may lie past K)
            return code * tl.load(s_ptr + g, mask=ok, other=0.0)[:, None] \
                + tl.load(z_ptr + g, mask=ok, other=0.0)[:, None]
        elif BLOCK_K % GROUP == 0:  # whole groups in the tile: one scale a group, broadcast over it
            PER: tl.constexpr = BLOCK_K // GROUP
            column = k0 // GROUP + tl.arange(0, PER)
            g = rn[:, None] * groups_per_row + column[None, :]
            ok = n_ok[:, None] & (column < groups_per_row)[None, :]
            w = code.reshape(BLOCK_N, PER, GROUP // COLUMN_STEP) * tl.load(s_ptr + g, mask=ok, other=0.0)[:, :, None] \
                + tl.load(z_ptr + g, mask=ok, other=0.0)[:, :, None]
            return w.reshape(BLOCK_N, BLOCK_K // COLUMN_STEP)
        else:  # any other group size (a row's whole width, for int4 per channel): a look-up per weight
            rk = k0 + COLUMN_FIRST + COLUMN_STEP * tl.arange(0, BLOCK_K // COLUMN_STEP)
            g = rn[:, None] * groups_per_row + rk[None, :] // GROUP
            ok = n_ok[:, None] & (rk < groups_per_row * GROUP)[None, :]
            return code * tl.load(s_ptr + g, mask=ok, other=0.0) + tl.load(z_ptr + g, mask=ok, other=0.0)

    @triton.jit
    def _product(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, K, k_slice, groups_per_row,
                 KIND: tl.constexpr, GROUP: tl.constexpr, IEEE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """``y[slice, m, n] = sum over this program's slice of K of x[m, k] * W[n, k]``."""
        rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < M
        n_ok = rn < N
        k_first = tl.program_id(2) * k_slice
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, k_slice, BLOCK_K):
            k0 = k_first + step
            if KIND == 2:  # int4: a contiguous tile of bytes; low nibbles are the even columns
                rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                byte = tl.load(q_ptr + rn[:, None] * (K // 2) + rb[None, :],
                               mask=n_ok[:, None] & (rb < K // 2)[None, :], other=0)
                even = _dequantize((byte & 15).to(tl.float32), s_ptr, z_ptr, rn, n_ok, k0, groups_per_row,
                                   KIND, GROUP, BLOCK_N, BLOCK_K, 2, 0)
                odd = _dequantize((byte >> 4).to(tl.float32), s_ptr, z_ptr, rn, n_ok, k0, groups_per_row,
                                  KIND, GROUP, BLOCK_N, BLOCK_K, 2, 1)
                x_ok = m_ok[:, None] & (2 * rb < K)[None, :]
                x_even = tl.load(x_ptr + rm[:, None] * K + 2 * rb[None, :], mask=x_ok, other=0.0)
                x_odd = tl.load(x_ptr + rm[:, None] * K + 2 * rb[None, :] + 1, mask=x_ok, other=0.0)
                if IEEE:
                    acc += tl.dot(x_even, tl.trans(even.to(x_even.dtype)), input_precision="ieee")
                    acc += tl.dot(x_odd, tl.trans(odd.to(x_odd.dtype)), input_precision="ieee")
                else:
                    acc += tl.dot(x_even, tl.trans(even.to(x_even.dtype)))
                    acc += tl.dot(x_odd, tl.trans(odd.to(x_odd.dtype)))
            else:
                rk = k0 + tl.arange(0, BLOCK_K)
                k_ok = rk < K
                x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                code = tl.load(q_ptr + rn[:, None] * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
                w = _dequantize(code.to(tl.float32), s_ptr, z_ptr, rn, n_ok, k0, groups_per_row,
                                KIND, GROUP, BLOCK_N, BLOCK_K, 1, 0)
                if IEEE:
                    acc += tl.dot(x, tl.trans(w.to(x.dtype)), input_precision="ieee")
                else:
                    acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        if KIND == 1:
            acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
        out = y_ptr + tl.program_id(2) * M * N + rm[:, None] * N + rn[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _sum_slices(p_ptr, y_ptr, count, SLICES: tl.constexpr, BLOCK: tl.constexpr):
        """``y[i] = p[0, i] + p[1, i] + ...``, in slice order."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < count
        acc = tl.load(p_ptr + i, mask=ok, other=0.0)
        for s in tl.static_range(1, SLICES):
            acc += tl.load(p_ptr + s * count + i, mask=ok, other=0.0)
        tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class Plan:
    """How one ``[N, K]`` weight's products are tiled: a function of ``(N, K)``, the layout and
    the GPU alone (never of the rows), which is what makes them row-invariant."""

    block_n: int
    block_k: int
    k_slice: int  # columns of K per slice, a multiple of block_k
    slices: int


# (BLOCK_N, BLOCK_K) per kind, chosen on an H200 with bench/bench_gpu_quant.py --blocks
# (docs/benchmarks.md). A group that neither divides BLOCK_K nor is a multiple of it (int8 in
# groups of 192, int4 per channel on a row that is no multiple of BLOCK_K) looks its scale up
# per weight; that branch takes LOOKUP_BLOCKS, the tiles it was verified with (at 64x256 in
# float32 it needs more shared memory than an H200 has).
BLOCKS = {"int8": (32, 256), "int8g": (32, 128), "int4": (64, 256)}
LOOKUP_BLOCKS = {"int8g": (32, 128), "int4": (32, 256)}
SLICE_TARGET = 2  # programs per multiprocessor that one tile of rows should make
NUM_WARPS = 4


@lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def plan(n: int, k: int, multiprocessors: int, block_n: int = 32, block_k: int = 128) -> Plan:
    """The tiling of an ``[n, k]`` weight on a GPU of ``multiprocessors``: output tiles of
    ``block_n``, and ``K`` cut into slices of at least two ``block_k`` steps until one tile of
    rows makes about ``SLICE_TARGET`` programs per multiprocessor."""
    tiles = -(-n // block_n)
    steps = -(-k // block_k)
    slices = max(1, min(steps // 2, -(-SLICE_TARGET * multiprocessors // tiles)))
    k_slice = -(-steps // slices) * block_k
    return Plan(block_n, block_k, k_slice, -(-k // k_slice))


def linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
           group_size: int | None, blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """``x @ W.T`` for the weight of the contract above (``offset`` None: int8 per channel).
    ``x [..., K]`` may have any leading shape; the result has ``x``'s leading shape and dtype.
    ``blocks`` (``(BLOCK_N, BLOCK_K)``, powers of two, at least 16) overrides :data:`BLOCKS` for
    benchmarks: rows stay invariant only among calls with the same blocks."""
    if triton is None:
        raise RuntimeError("weight-only products on a GPU need Triton (pip install triton)")
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError(f"gpu_quant.linear runs on CUDA tensors, got {x.device}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    kind = "int8" if offset is None else "int8g" if qweight.dtype == torch.int8 else "int4"
    n = qweight.shape[0]
    k = qweight.shape[1] * (2 if kind == "int4" else 1)
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    group = k if offset is None else k // offset.shape[1]
    if blocks is None:
        blocks = BLOCKS[kind]
        if offset is not None and group % blocks[1] and blocks[1] % group:
            blocks = LOOKUP_BLOCKS[kind]
    p = plan(n, k, 4 if INTERPRET else _multiprocessors(x.device.index or 0), *blocks)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    target = y if p.slices == 1 else torch.empty((p.slices, m, n), dtype=torch.float32, device=x.device)
    grid = (-(-n // p.block_n), -(-m // ROWS), p.slices)
    with _on(x.device):
        _product[grid](x2, qweight, scale, scale if offset is None else offset, target, m, n, k, p.k_slice,
                       k // group, KIND=KINDS[kind], GROUP=1 if offset is None else group,
                       IEEE=x.dtype == torch.float32, BLOCK_M=ROWS, BLOCK_N=p.block_n, BLOCK_K=p.block_k,
                       num_warps=NUM_WARPS)
        if p.slices > 1:
            block = 1024
            _sum_slices[(-(-(m * n) // block),)](target, y, m * n, SLICES=p.slices, BLOCK=block)
    return y.reshape(*lead, n)


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """The context that makes ``device`` current for a launch (Triton launches on the current GPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
