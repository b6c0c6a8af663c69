"""Attention that reads the paged KV pool in place, through FlexAttention's block sparsity.

The gather route (:meth:`~.paged_llama.PagedLlama.paged_forward` with ``read_slots``)
copies every sequence's attended K/V rows out of the pool, per layer and step, into a
``[B, KVH, K, D]`` tensor; a compiled or captured step then has ``K`` in its shape. Here
the pool itself is the key and value tensor, and nothing is copied:

- keys/values: one layer's pool ``[KVH, S, D]`` (``S = num_blocks * block_size`` slots),
  viewed as ``[B, KVH, S, D]`` with a zero batch stride;
- which blocks a sequence visits: a FlexAttention ``BlockMask`` whose KV block is the
  pool's block, so its block indices *are* the sequence's block table. Blocks wholly
  before the step's first row (``base``) are "full" (every row sees all of them, no mask
  evaluated); the rest, up to the context length, are "partial";
- inside partial blocks, a ``mask_mod`` maps a physical slot back to the sequence's
  logical position through the inverse of its block table, and applies the step's rule
  (:class:`~.paged_llama.SequenceRows`): a row sees every cached position ``< base`` and,
  among the step's rows, its ancestors and itself, so chains and token trees are one path.

Shapes. Everything is built from ``[B]``, ``[B, MB]`` and ``[B, Q, Q]`` integer tensors
(``MB`` the most blocks a sequence can hold) and the pool's fixed sizes, so a step's graph
depends on ``(B, Q)`` alone, never on the context length.

Cost per layer: for sequence ``b``, ``Q`` query rows against ``ceil(ctx_b / block_size)``
blocks; per step (shared by the layers) the block mask: an ``O(B * num_blocks)`` inverse
table and ``O(B * MB)`` indices. Exactness: the same softmax over the same keys as the
gather route; the summation order differs, so results agree to rounding.

``flex_attention`` must run under ``torch.compile`` (:mod:`.compiled`) to be fast: called
eagerly, PyTorch computes it densely over the whole pool (fine for tests, slow otherwise).

Where the compiled kernels are wrong, and what guards against it:

- **CPU, AVX2, 8-slot blocks** (PyTorch 2.13). Inductor's CPU FlexAttention template forms
  ``q @ k.T`` per KV block with a micro-GEMM whose key tile is 16 columns. A block of fewer
  columns goes to its "n-tail" kernel, and that kernel's transposing variant (taken when
  the head dimension is a multiple of the vector width and below 24) computes and stores
  a whole 16-column tile anyway: it reads keys of the neighbouring pool block and writes
  over the next query row's scores. With 256-bit vectors (8 floats) an 8-slot block meets
  every condition for head dimensions 8 and 16; 512-bit vectors never take that variant
  below 16 columns, which is why AVX-512 machines passed. Hence :data:`MIN_BLOCK_SLOTS`:
  the compiled route refuses pool blocks below a whole key tile, on every device (Triton's
  tiles on a GPU need at least 16 keys as well).
- **GPU, several rows per sequence** (PyTorch 2.11, H100): see :func:`gpu_kernel_options`.
- Beside both rules, :func:`check_compiled_attention` compiles this module's attention for
  a runner's exact shapes and compares it with the eager computation before the first
  step; a mismatch refuses the compiled route in one line (``UserError``).
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import UserError
from torch.nn.attention.flex_attention import BlockMask, flex_attention

Q_BLOCK = 128  # FlexAttention's default query block: a step's rows are one block up to 128
MIN_BLOCK_SLOTS = 16  # the compiled kernels' key tile: smaller pool blocks are refused (module docstring)
NOT_OWNED = 1 << 40  # logical block number of a pool block outside a sequence's table (masked)

# PyTorch >= 2.6 can skip the transposed (backward-only) indices; older ones cannot.
_SKIP_Q_BLOCKS = {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters else {}


def pool_block_mask(
    tables: torch.Tensor,
    ctx: torch.Tensor,
    base: torch.Tensor,
    visible: torch.Tensor,
    block_size: int,
    num_blocks: int,
) -> BlockMask:
    """The block mask of a padded step over the whole pool.

    ``tables[b, j]``: physical block of sequence ``b``'s logical block ``j`` (entries past
    ``ceil(ctx[b] / block_size)`` are ignored, and a sequence's live entries are distinct).
    ``ctx[b]``: slots of ``b`` attended, the step's rows included; ``base[b]``: the first
    row's logical slot; ``visible[b, r, c]``: row ``r`` sees row ``c`` (nonzero). Every row
    must see at least one slot (padded rows see row 0), so every softmax is finite.
    """
    B, MB = tables.shape
    Q = visible.shape[1]
    used = (ctx + block_size - 1) // block_size  # [B] blocks holding the context
    full = torch.minimum(base // block_size, used)  # [B] blocks wholly before the first row
    col = torch.arange(MB, device=tables.device).view(1, MB)
    # physical block -> logical block, per sequence; NOT_OWNED elsewhere
    unowned = torch.full((B, num_blocks), NOT_OWNED, dtype=torch.long, device=tables.device)
    mine = torch.where(col < used.view(B, 1), col.expand(B, MB), NOT_OWNED)
    logical_of = unowned.scatter_reduce(1, tables, mine, reduce="amin")
    partial = tables.gather(1, (col + full.view(B, 1)).clamp(max=MB - 1))

    # The mask reads its tables through flat (1-D) indices: inductor's CPU FlexAttention
    # template has read 2-D indexed tables wrongly (PyTorch 2.13; the tests check the result).
    logical_flat, visible_flat = logical_of.reshape(-1), visible.reshape(-1)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, row: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        pos = logical_flat[b * num_blocks + slot // block_size] * block_size + slot % block_size
        rel = pos - base[b]
        own = visible_flat[(b * Q + row) * Q + rel.clamp(0, Q - 1)] != 0
        return (pos < ctx[b]) & ((rel < 0) | ((rel < Q) & own))

    # the block mask's KV extent must cover the pool: pad the index lists to num_blocks columns
    pad = (0, num_blocks - MB)
    full_idx, partial = F.pad(tables, pad), F.pad(partial, pad)
    q_blocks = -(-Q // Q_BLOCK)  # every query block of a sequence visits the same pool blocks

    def per_q_block(t: torch.Tensor) -> torch.Tensor:  # [B, ...] -> [B, 1, q_blocks, ...] int32
        return t.to(torch.int32).view(B, 1, 1, *t.shape[1:]).expand(B, 1, q_blocks, *t.shape[1:]).contiguous()

    return BlockMask.from_kv_blocks(
        per_q_block(used - full),
        per_q_block(partial),
        per_q_block(full),
        per_q_block(full_idx),
        BLOCK_SIZE=(Q_BLOCK, block_size),
        mask_mod=mask_mod,
        seq_lengths=(Q, num_blocks * block_size),
        **_SKIP_Q_BLOCKS,
    )


def pool_attention(
    q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, block_mask: BlockMask, scale: float
) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, Q, D]`` over one layer's pool ``[KVH, S, D]`` (read in place) under ``block_mask``."""
    B = q.shape[0]
    keys = pool_k.unsqueeze(0).expand(B, -1, -1, -1)
    values = pool_v.unsqueeze(0).expand(B, -1, -1, -1)
    return flex_attention(q, keys, values, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != pool_k.shape[0],
                          kernel_options=gpu_kernel_options(q, block_mask.BLOCK_SIZE[1]))


def gpu_kernel_options(q: torch.Tensor, block_size: int) -> dict | None:
    """Triton kernel options for a step of ``q.shape[2]`` rows over pool blocks of ``block_size`` slots.

    On a GPU, inductor picks its "decoding" kernel for short queries; with more than one
    row per sequence under a grouped-query mask it gave wrong logits (PyTorch 2.11, H100;
    ``tests/runtime/test_cuda.py`` checks the result), so steps of several rows use the
    general kernel. Either kernel's key tile (``BLOCK_N``) must divide the pool's block
    (the general kernel also serves one-row steps where the head groups are not a power
    of two, as SmolLM2's 9 heads over 3)."""
    if q.device.type != "cuda":
        return None
    tile = {"BLOCK_N": min(block_size, 64)}  # the key tile must divide a pool block, whichever kernel runs
    return tile if q.shape[2] == 1 else {**tile, "FORCE_USE_FLEX_ATTENTION": True}


PROBE_ATOL = 1e-3  # fp32 attention outputs of unit-scale inputs agree to ~1e-6; a wrong kernel is off by O(1)


def check_block_size(block_size: int) -> None:
    """Refuse (one line, :class:`UserError`) pool blocks smaller than the compiled kernels' key tile."""
    if block_size < MIN_BLOCK_SLOTS:
        raise UserError(f"--torch_compile inductor needs KV blocks of at least {MIN_BLOCK_SLOTS} tokens (the compiled "
                        f"attention kernels' key tile), but this engine's --tokens_per_block is {block_size}; rebuild "
                        f"it with --tokens_per_block {MIN_BLOCK_SLOTS} or more, or use --torch_compile off")


def check_compiled_attention(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
                             block_size: int, rows: int = 4) -> float:
    """Compile :func:`pool_attention` for these shapes and compare it with the eager result
    on a probe step (two sequences over shuffled blocks, contexts ending mid-block, a
    two-branch token tree of ``rows`` rows). Returns the largest difference; raises
    :class:`UserError` (one line) when it exceeds :data:`PROBE_ATOL` (scaled for half
    precision), or when ``block_size`` fails :func:`check_block_size`.

    Cost: one compile of the attention alone (seconds on a CPU; memoised per process, for
    each vector width inductor is told to use, and cached by inductor across processes)
    and two small attention calls."""
    import torch._inductor.config as inductor_config

    return _probe(device, dtype, heads, kv_heads, head_dim, block_size, rows, inductor_config.cpp.simdlen)


def _compile_attention() -> Callable[..., torch.Tensor]:
    """:func:`pool_attention` compiled as the compiled forward compiles it (static shapes, one graph)."""
    return torch.compile(pool_attention, backend="inductor", dynamic=False, fullgraph=True)


@functools.lru_cache(maxsize=None)
def _probe(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, block_size: int, rows: int,
           simdlen: int | None) -> float:
    check_block_size(block_size)
    gen = torch.Generator().manual_seed(0)
    num_blocks, width = 12, 4
    pool_k = torch.randn(kv_heads, num_blocks * block_size, head_dim, generator=gen)
    pool_v = torch.randn(kv_heads, num_blocks * block_size, head_dim, generator=gen)
    q = torch.randn(2, heads, rows, head_dim, generator=gen)
    tables = torch.tensor([[7, 2, 10, 0], [4, 9, 1, 5]])[:, :width]
    ctx = torch.tensor([2 * block_size + 3, 3 * block_size + rows])
    base = ctx - rows
    from .paged_llama import row_tree  # the step's tree rule (imported here: paged_llama imports this module)

    parents = ([-1, 0, 0] + list(range(2, rows - 1)))[:rows]  # rows 1 and 2 both follow row 0
    _, seen = row_tree(parents, rows)
    visible = torch.tensor([[(bits >> c) & 1 for c in range(rows)] for bits in seen]).expand(2, rows, rows).contiguous()
    args = [t.to(device=device, dtype=dtype) for t in (q, pool_k, pool_v)]
    mask = pool_block_mask(*(t.to(device) for t in (tables, ctx, base, visible)), block_size, num_blocks)
    scale = head_dim ** -0.5
    with warnings.catch_warnings():  # eager flex_attention warns that it is unfused: here that is the point
        warnings.simplefilter("ignore", UserWarning)
        want = pool_attention(*args, mask, scale).float()
    got = _compile_attention()(*args, mask, scale).float()
    err = (got - want).abs().max().item()
    tolerance = PROBE_ATOL if dtype == torch.float32 else 50 * PROBE_ATOL
    if not err <= tolerance:
        raise UserError(f"--torch_compile inductor computes wrong attention on this machine ({device}, "
                        f"--tokens_per_block {block_size}, head size {head_dim}: off by {err:.3g} in a probe step); "
                        f"use --torch_compile off, or another --tokens_per_block")
    return err
