"""``y = x @ W.T`` for the few rows of a decode or verification step, on CPU, from one copy of ``W``.

A decode step multiplies every weight matrix by one row; a verification step by
``1 + draft length`` rows (2 to ~33), a batch of them several times that. PyTorch's default route for these (MKL's sgemm
through ``F.linear``) is tuned for large matrices: its cost grows steeply with the row
count, which would eat most of what verifying a long draft saves.

Where the C kernels are built (:mod:`promptlookup.runtime.kernels`, route ``gemv``), the
layer holds the row-major weight only, and products of up to :data:`GEMV_MAX_ROWS` rows run
through :func:`~promptlookup.runtime.kernels.fp32_product`: it streams the weight once for
every row count and is row-invariant, so a one-row decoding step and a verification step
compute bitwise the same values for the same row. Larger products (prefill) run through
MKL on the same weight (``W @ x.T`` is what MKL streams fastest); with ``packed_copy`` a
oneDNN-reordered second copy serves them instead (``gemv+onednn``). A tied LM head streams
the embedding table itself. docs/benchmarks.md ("CPU kernels") has the measurements that
chose these routes.

Without the C kernels, the product runs through oneDNN (``torch.ops.mkldnn._linear_pointwise``) on a copy of the weight
reordered once, at load time, into oneDNN's blocked layout, and then **drops the
row-major original**, so the weights live in memory once. oneDNN's JIT kernels use the
widest vector instructions the CPU has, and their cost is nearly flat from 4 to ~16
rows; fewer rows are padded to :data:`ONEDNN_MIN_ROWS`, since its kernels for one or two
rows run slower than its four-row kernel.

One exception keeps a row-major tensor on purpose: a layer whose weight is already held
elsewhere (the LM head of a model with tied embeddings shares the embedding table) is
given that tensor as ``small_rows_weight``, and runs its 1-2 row products through MKL as
``W @ x.T``, which streams a large matrix fastest; it costs no memory, since the table is
resident anyway. docs/benchmarks.md has the measured kernel costs and the memory figure.

Both kernels compute the same fp32 product; only the summation order differs, exactly as
between two MKL calls with different row counts. When oneDNN is missing or refuses the
weight's dtype, the layer keeps its row-major weight and every row count uses MKL
(``CpuLinear.kernel`` says which route is in use).

Invariant: outputs are contiguous ``[rows, out_features]`` (row-major), so that the
elementwise ops and the attention kernel downstream see dense rows; a column-major
result (what ``(W @ x.T).T`` is) sends ``scaled_dot_product_attention`` to its slow
reference path and the next matmul to a slow MKL route.
"""
from __future__ import annotations

import torch

from . import kernels
from .kernels import step_ops

GEMV_MAX_ROWS = 96  # with the C kernels, products of this many rows or fewer use them (as fast as MKL up to 96, slower beyond)
MKL_MAX_ROWS = 2  # with a shared row-major weight, products of this many rows or fewer use MKL
ONEDNN_MIN_ROWS = 4  # oneDNN runs fewer rows faster when padded to this many (its small-row kernels are slower)


def _pack_for_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` reordered for oneDNN, or ``None`` if this build or dtype cannot use it."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)
        probe = torch.zeros(MKL_MAX_ROWS + 1, weight.shape[1], dtype=weight.dtype)
        torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return packed


def _mkl(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` as ``weight @ x.T`` (streams ``weight`` fastest); one row is padded to two."""
    rows = x.shape[0]
    if rows == 1:  # a matrix-vector product: two rows run about twice as fast
        x = torch.cat([x, x.new_zeros(1, x.shape[1])])
    return torch.mm(weight, x.t()).t()[:rows].contiguous()


class CpuLinear:
    """A frozen linear layer's product on CPU, holding its weight once.

    With the C kernels: the row-major ``weight`` ``[out, in]`` is kept (or, when given,
    ``small_rows_weight``, which must equal it and is held by someone else anyway) and serves
    every row count (:data:`GEMV_MAX_ROWS` or fewer through the C kernel, more through MKL);
    ``packed_copy`` adds oneDNN's reordered copy for the larger products. Without them:
    ``weight`` is reordered for oneDNN and the row-major tensor is not kept (unless oneDNN
    cannot take it); ``small_rows_weight`` then serves products of at most
    :data:`MKL_MAX_ROWS` rows through MKL. Cost per call: one product of ``rows x in x
    out``, bound by reading the weight for the row counts of decoding.
    """

    __slots__ = ("packed", "plain", "small_rows_weight", "bias", "gemv")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        small_rows_weight: torch.Tensor | None = None,
        packed_copy: bool = False,
    ) -> None:
        weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.small_rows_weight = None if small_rows_weight is None else small_rows_weight.detach()
        self.gemv = None
        if kernels.isa() != "reference" and weight.dtype == torch.float32 and weight.device.type == "cpu":
            row_major = (self.small_rows_weight if self.small_rows_weight is not None else weight).contiguous()
            self.gemv = kernels.fp32_product(row_major)
            if self.small_rows_weight is not None and row_major.data_ptr() != self.small_rows_weight.data_ptr():
                self.small_rows_weight = None  # a contiguous copy was made: hold that one instead
            self.plain = row_major if self.small_rows_weight is None else None
            self.packed = _pack_for_onednn(weight) if packed_copy else None
            return
        self.packed = _pack_for_onednn(weight)
        self.plain = weight if self.packed is None else None  # the fallback route keeps it

    @property
    def kernel(self) -> str:
        """``gemv`` (the C kernel; MKL for many rows), ``gemv+onednn`` (oneDNN's copy for many
        rows); without the C kernels ``onednn`` (every row count), ``mkl+onednn`` (few rows on
        the shared weight) or ``mkl``."""
        if self.gemv is not None:
            return "gemv" if self.packed is None else "gemv+onednn"
        if self.packed is None:
            return "mkl"
        return "mkl+onednn" if self.small_rows_weight is not None else "onednn"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if self.gemv is not None and (rows <= GEMV_MAX_ROWS or self.packed is None):
            if rows <= GEMV_MAX_ROWS:
                y = self.gemv(x)
            else:
                w = self.plain if self.plain is not None else self.small_rows_weight
                y = torch.mm(x.contiguous(), w.t())
            return y if self.bias is None else y + self.bias
        x = x.contiguous()
        if self.packed is not None and (self.small_rows_weight is None or rows > MKL_MAX_ROWS):
            if rows < ONEDNN_MIN_ROWS:
                x = torch.cat([x, x.new_zeros(ONEDNN_MIN_ROWS - rows, x.shape[1])])
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")[:rows]
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = _mkl(self.plain if self.plain is not None else self.small_rows_weight, x)
        return y if self.bias is None else y + self.bias

    def kernel_operands(self) -> tuple[int, int, int, int, int] | None:
        """``(weight address, 0, 0, 0, 0)``: the C kernels' fp32 product on the row-major weight, as
        :func:`~promptlookup.runtime.kernels.step_ops.layer_records` takes it (products of up to
        :data:`GEMV_MAX_ROWS` rows); ``None`` where this layer does not run it (no C kernels, a bias)."""
        if self.gemv is None or self.bias is not None:
            return None
        weight = self.plain if self.plain is not None else self.small_rows_weight
        return (weight.data_ptr(), 0, 0, step_ops.KINDS["fp32"], 0)

    def resident_bytes(self) -> int:
        """Bytes of weight this layer alone keeps alive (the shared ``small_rows_weight`` excluded)."""
        held = self.packed if self.packed is not None else self.plain
        n = 0 if held is None else held.numel() * held.element_size()
        return n + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())
