"""The per-row work of a decoder layer around its products, in C, on the CPU, in float32.

:class:`~promptlookup.runtime.paged_llama.PagedLlama` runs a CPU float32 step through these
(where the C module ``_step_ops``, built from ``step_ops.c`` by ``make native``, is present):

- :func:`rms_norm`: ``h += delta`` (optional, the residual add) then ``y = w * (h * rsqrt(mean(h²) + eps))``,
  Hugging Face's ``LlamaRMSNorm`` arithmetic;
- :func:`rotary_write`: Q and K rotated by the rotary table rows of their positions (bitwise
  :func:`~promptlookup.runtime.rotary.apply_rotary`), Q returned as ``[rows, H, D]``, K and V
  written into the layer's pool at the write slots;
- :func:`attention`: the rows' attention over the pool (the keys each row sees, from the
  layout's read slots and mask), ``[rows, H * D]``;
- :func:`silu_mul`: ``silu(gate) * up`` of a fused gate/up product.

Invariant (step_ops.c): every output row is bitwise the same for any number of rows in the
call and on every instruction-set path, and an attention row depends only on the ordered
list of keys it sees, so a row of a verification step (a chain or a token tree) equals the
same row of a plain decoding step bitwise. The values differ from PyTorch's kernels by
rounding only (another summation order; exp within 2 ulp).

Cost: see step_ops.c; one call replaces 5-30 PyTorch operators. The arguments are checked
here (dtype, device, contiguity, shapes), as the C code trusts them.
"""
from __future__ import annotations

import importlib
from types import ModuleType

import torch

MAX_ATTENTION_ROWS = 64  # query rows per sequence up to which attention runs here (prefill: PyTorch's SDPA)


def _load() -> ModuleType | None:
    try:
        return importlib.import_module(f"{__package__}._step_ops")
    except ImportError:
        return None


_C: ModuleType | None = _load()


def available() -> bool:
    """Whether the C module is built (else the model runs these steps through PyTorch)."""
    return _C is not None


_HAS_PRODUCT = False


def set_product(capsule: object) -> None:
    """Install gemv.c's product (its module's ``product`` capsule) for :func:`layers`."""
    global _HAS_PRODUCT
    if _C is not None:
        _C.set_product(capsule)
        _HAS_PRODUCT = True


def runs_layers() -> bool:
    """Whether :func:`layers` can run (both C modules built)."""
    return _HAS_PRODUCT


def set_level(level: int) -> None:
    """Run on instruction-set level ``level`` (0 generic, 1 AVX2, 2 AVX-512): the results are
    the same on each; :func:`promptlookup.runtime.kernels.set_isa` calls this."""
    if _C is not None:
        _C.set_isa(level)


def _dense(t: torch.Tensor, name: str, dtype: torch.dtype = torch.float32) -> None:
    if t.dtype is not dtype or not t.is_contiguous() or not t.is_cpu:  # the cheap tests: ~120 calls a step
        raise ValueError(f"{name} must be a contiguous {dtype} tensor on the CPU, got {t.dtype} "
                         f"(contiguous: {t.is_contiguous()}) on {t.device}")


KV_DTYPES = (torch.float32, torch.float16)  # the pool element types the C code reads and writes


def _pool_half(pool_k: torch.Tensor, pool_v: torch.Tensor) -> int:
    """1 where the pool ``pool_k``/``pool_v`` holds float16, 0 for float32 (both contiguous CPU
    tensors of one of :data:`KV_DTYPES`, the same for K and V), as the C code takes it."""
    if pool_k.dtype not in KV_DTYPES or pool_v.dtype is not pool_k.dtype:
        raise ValueError(f"the K/V pool must be float32 or float16 (one for K and V), got {pool_k.dtype} and "
                         f"{pool_v.dtype}")
    _dense(pool_k, "pool_k", pool_k.dtype)
    _dense(pool_v, "pool_v", pool_k.dtype)
    return int(pool_k.dtype is torch.float16)


def _in_range(what: str, name: str, index: torch.Tensor, size: int) -> None:
    """The C code reads ``table[index]`` unchecked: every index must be in ``[0, size)``."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(f"{what}: {name} must be in [0, {size}), got [{int(index.min())}, {int(index.max())}]")


def _check_keys(what: str, batch: int, per_seq: int, kv_len: int, slots: int, read_slots: torch.Tensor | None,
                start: int, mask: torch.Tensor | None) -> None:
    """The keys of attention: ``read_slots`` ``[batch, kv_len]`` or one contiguous run inside a
    pool of ``slots`` slots, and the ``[batch, per_seq, kv_len]`` mask, as the C code reads them."""
    if read_slots is not None:
        _dense(read_slots, "read_slots", torch.long)
        if read_slots.shape != (batch, kv_len):
            raise ValueError(f"{what}: read_slots {tuple(read_slots.shape)}, want {(batch, kv_len)}")
        _in_range(what, "read_slots", read_slots, slots)
    elif batch != 1 or start + kv_len > slots:
        raise ValueError(f"{what}: contiguous keys need one sequence inside the pool ({start}+{kv_len} > {slots})")
    if mask is not None:
        _dense(mask, "mask", torch.bool)
        if mask.shape != (batch, per_seq, kv_len):
            raise ValueError(f"{what}: mask {tuple(mask.shape)}, want {(batch, per_seq, kv_len)}")


def _check_rotary(what: str, cos: torch.Tensor, sin_signed: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, rows: int, head_dim: int, pool_slots: int) -> None:
    """The rotary table ``[positions, head_dim]`` and the rows' positions and write slots
    ``[rows]``, each index inside what the C code reads."""
    _dense(cos, "cos")
    _dense(sin_signed, "sin")
    _dense(positions, "positions", torch.long)
    _dense(slots, "slots", torch.long)
    if cos.shape[1:] != (head_dim,) or sin_signed.shape != cos.shape or positions.shape != (rows,) \
            or slots.shape != (rows,):
        raise ValueError(f"{what}: table {tuple(cos.shape)} for head size {head_dim}, positions "
                         f"{tuple(positions.shape)}, slots {tuple(slots.shape)} for {rows} rows")
    _in_range(what, "positions", positions, cos.shape[0])
    _in_range(what, "slots", slots, pool_slots)


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of the rows of ``h`` ``[rows, n]`` times ``weight`` ``[n]``, as a new tensor;
    with ``delta`` (same shape), ``h += delta`` first, in place (the residual add)."""
    _dense(h, "h")
    _dense(weight, "weight")
    if h.dim() != 2 or weight.shape != (h.shape[1],) or (delta is not None and delta.shape != h.shape):
        raise ValueError(f"rms_norm: h {tuple(h.shape)}, weight {tuple(weight.shape)}"
                         f"{'' if delta is None else f', delta {tuple(delta.shape)}'}")
    if delta is not None:
        _dense(delta, "delta")
    y = torch.empty_like(h)
    _C.rms_norm(h.data_ptr(), 0 if delta is None else delta.data_ptr(), weight.data_ptr(), y.data_ptr(),
                h.shape[0], h.shape[1], eps)
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[:, :n]) * gate_up[:, n:]`` ``[rows, n]`` for ``gate_up`` ``[rows, 2n]``."""
    _dense(gate_up, "gate_up")
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be [rows, 2n], got {tuple(gate_up.shape)}")
    n = gate_up.shape[1] // 2
    out = gate_up.new_empty(gate_up.shape[0], n)
    _C.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], n)
    return out


def rotary_write(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, positions: torch.Tensor,
                 slots: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, heads: int) -> torch.Tensor:
    """Q ``[rows, heads, D]`` rotated, from a fused ``qkv`` ``[rows, (heads + 2 KVH) * D]``;
    K (rotated) and V written into ``pool_k``/``pool_v`` ``[KVH, S, D]`` at ``slots`` ``[rows]``
    (float32, or float16 rounded to nearest even: :func:`store_half`).
    ``cos``/``sin_signed``: the rotary table ``[positions, D]`` (:class:`~promptlookup.runtime.rotary.RotaryTable`)."""
    _dense(qkv, "qkv")
    half = _pool_half(pool_k, pool_v)
    kvh, s, d = pool_k.shape
    rows = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (heads + 2 * kvh) * d or pool_v.shape != pool_k.shape:
        raise ValueError(f"rotary_write: qkv {tuple(qkv.shape)}, pool {tuple(pool_k.shape)}, heads {heads}")
    _check_rotary("rotary_write", cos, sin_signed, positions, slots, rows, d, s)
    q = qkv.new_empty(rows, heads, d)
    _C.rotary_write(qkv.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(), positions.data_ptr(), slots.data_ptr(),
                    q.data_ptr(), pool_k.data_ptr(), pool_v.data_ptr(), rows, qkv.shape[1], heads, kvh, d, s, half)
    return q


def attention(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, batch: int, kv_len: int,
              scale: float, read_slots: torch.Tensor | None = None, start: int = 0,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[batch * Q, H, D]`` over the pool ``[KVH, S, D]``, as ``[batch * Q, H * D]``.

    Sequence ``b``'s keys ``j < kv_len`` sit at slots ``read_slots[b, j]`` (``[batch, kv_len]``),
    or at ``start + j`` when ``read_slots`` is ``None`` (one sequence, contiguous blocks);
    ``mask`` ``[batch, Q, kv_len]`` bool says which keys each row sees (``None``: all). A float16
    pool's K/V are widened to float32 as read (exact); the arithmetic is float32's."""
    _dense(q, "q")
    half = _pool_half(pool_k, pool_v)
    rows, h, d = q.shape
    kvh, s, _ = pool_k.shape
    if rows % batch or pool_v.shape != pool_k.shape or pool_k.shape[2] != d or h % kvh:
        raise ValueError(f"attention: q {tuple(q.shape)}, pool {tuple(pool_k.shape)}, batch {batch}")
    per_seq = rows // batch
    _check_keys("attention", batch, per_seq, kv_len, s, read_slots, start, mask)
    o = q.new_empty(rows, h * d)
    _C.attention(q.data_ptr(), pool_k.data_ptr(), pool_v.data_ptr(),
                 0 if read_slots is None else read_slots.data_ptr(), 0 if mask is None else mask.data_ptr(),
                 o.data_ptr(), batch, per_seq, h, kvh, d, kv_len, s, start, half, scale)
    return o


RECORD = 23  # int64 fields of one layer's record (step_ops.c: 4 projections x 5, then 3 norms)
KINDS = {"fp32": 0, "int8": 1, "int4": 2, "int8g": 3}  # a projection's kind in its record (gemv.c's KIND_ values)


def layer_records(layers: list[tuple[tuple[int, ...], ...]], norms: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The ``[L, RECORD]`` int64 table :func:`layers` reads: for each layer its four projections'
    kernel operands (``(weight, scale, offset, kind, group_size)`` addresses and sizes, 0 where
    absent: :meth:`~promptlookup.runtime.cpu_linear.CpuLinear.kernel_operands`) in the order qkv, o,
    gate/up, down, then the addresses of its input norm, its post-attention norm and the next
    layer's input norm (0 for the last). The caller keeps every tensor alive as long as the table."""
    rows = []
    for i, (projections, (input_norm, post_norm)) in enumerate(zip(layers, norms)):
        for t in (input_norm, post_norm):
            _dense(t, "norm")
        following = norms[i + 1][0].data_ptr() if i + 1 < len(norms) else 0
        rows.append([v for op in projections for v in op] + [input_norm.data_ptr(), post_norm.data_ptr(), following])
    table = torch.tensor(rows, dtype=torch.long)
    if table.shape[1:] != (RECORD,):
        raise ValueError(f"layer records must have {RECORD} fields, got {tuple(table.shape)}")
    return table


def layers(h: torch.Tensor, records: torch.Tensor, pool_k: list[torch.Tensor], pool_v: list[torch.Tensor],
           cos: torch.Tensor, sin_signed: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, *,
           heads: int, intermediate: int, eps: float, scale: float, batch: int, kv_len: int,
           read_slots: torch.Tensor | None = None, start: int = 0, mask: torch.Tensor | None = None,
           row_at: torch.Tensor | None = None, per_seq: int | None = None) -> None:
    """Every decoder layer of a step over the residual rows ``h`` ``[batch * Q, hidden]``, in place,
    in one call: the operations of the functions above and of the products (gemv.c), in the
    order ``PagedLlama`` calls them one by one, so bitwise the same values, without a return to
    Python between them. ``records``: :func:`layer_records`; ``pool_k``/``pool_v``: each
    layer's pool ``[KVH, S, D]`` (float32 or float16, one type for all); the rest as
    :func:`rotary_write` and :func:`attention`.

    A batch's real rows only (its sequences padded to ``per_seq = Q`` rows each): ``h``,
    ``positions`` and ``slots`` hold those rows, and ``row_at`` ``[rows]`` (int64) gives each
    one's place ``b * Q + qi`` in the padded step (its mask row and its sequence's keys). A row
    computes what it computes in the padded step, bitwise; the padding is never computed."""
    _dense(h, "h")
    _dense(records, "records", torch.long)
    n_layers = records.shape[0]
    kvh, s, d = pool_k[0].shape
    rows, hidden = h.shape
    half = _pool_half(pool_k[0], pool_v[0])
    for t in (*pool_k, *pool_v):
        if t.shape != (kvh, s, d):
            raise ValueError("layers: every layer's pool must have one shape")
        _dense(t, "pool", pool_k[0].dtype)
    if len(pool_k) != n_layers or len(pool_v) != n_layers or (row_at is None and rows % batch):
        raise ValueError(f"layers: h {tuple(h.shape)}, {n_layers} records, {len(pool_k)} pools, batch {batch}")
    _check_rotary("layers", cos, sin_signed, positions, slots, rows, d, s)
    if row_at is None:
        per_seq = rows // batch
    else:
        _dense(row_at, "row_at", torch.long)
        if per_seq is None or row_at.shape != (rows,):
            raise ValueError(f"layers: row_at {tuple(row_at.shape)} for {rows} rows needs per_seq")
        _in_range("layers", "row_at", row_at, batch * per_seq)
    _check_keys("layers", batch, per_seq, kv_len, s, read_slots, start, mask)
    pools = torch.tensor([[k.data_ptr(), v.data_ptr()] for k, v in zip(pool_k, pool_v)], dtype=torch.long)
    _C.layers(h.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(), positions.data_ptr(), slots.data_ptr(),
              0 if read_slots is None else read_slots.data_ptr(), 0 if mask is None else mask.data_ptr(),
              records.data_ptr(), pools.data_ptr(), 0 if row_at is None else row_at.data_ptr(), rows, hidden, heads,
              kvh, d, intermediate, s, batch, per_seq, kv_len, start, n_layers, half, eps, scale)


def store_half(x: torch.Tensor) -> torch.Tensor:
    """``x`` (contiguous float32 on the CPU) rounded to float16 by the current path, as
    :func:`rotary_write` stores K/V in a float16 pool: to nearest even, the bits of
    ``x.to(torch.float16)`` for every value but NaNs' payloads (for tests)."""
    _dense(x, "x")
    out = torch.empty(x.shape, dtype=torch.float16)
    _C.store_half(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def exp(x: float) -> float:
    """The kernels' ``e^x`` of one float32 (for tests of its accuracy)."""
    return _C.exp(x)
