"""``y = x @ W.T`` for the few rows of a decode or verification step, on CPU.

A decode step multiplies every weight matrix by one row; a verification step by
``1 + draft length`` rows (2 to ~33). PyTorch's default route for these (MKL's sgemm
through ``F.linear``) is tuned for large matrices, so this module picks, per call, the
faster of two kernels by row count:

- **1-2 rows: MKL as ``W @ x.T``.** At this size the matmul only streams the weights from
  memory; this operand order streams them fastest. One row (a matrix-vector product) is
  padded to two, which MKL runs faster.
- **3+ rows: oneDNN** (``torch.ops.mkldnn._linear_pointwise``) on a copy of the weight
  reordered once, at load time, into oneDNN's blocked layout. Its JIT kernels use the
  widest vector instructions the CPU has, and their cost grows far more slowly with the
  row count than MKL's.

One-token steps, in turn, run slower through oneDNN than through MKL (hence the split).
The flatter cost curve over the row count is what makes verifying long drafts pay off on
a CPU; docs/benchmarks.md has the measured step costs with and without this module.

Both kernels compute the same fp32 product; only the summation order differs, exactly as
between two MKL calls with different row counts. The reordered copy doubles the memory of
the linear weights. When oneDNN is missing or refuses the weight's dtype, every row count
uses the MKL route (``CpuLinear.kernel`` says which is in use).

Invariant: outputs are contiguous ``[rows, out_features]`` (row-major), so that the
elementwise ops and the attention kernel downstream see dense rows; a column-major
result (what ``(W @ x.T).T`` is) sends ``scaled_dot_product_attention`` to its slow
reference path and the next matmul to a slow MKL route.
"""
from __future__ import annotations

import torch
from torch import nn

ONEDNN_MIN_ROWS = 3


def _pack_for_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` reordered for oneDNN, or ``None`` if this build or dtype cannot use it."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)
        probe = torch.zeros(ONEDNN_MIN_ROWS, weight.shape[1], dtype=weight.dtype)
        torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return packed


class CpuLinear:
    """A frozen ``nn.Linear``'s product on CPU, by the faster kernel for each row count.

    Cost per call: one GEMM of ``rows x in x out``; rows 1-2 stream the weight at memory
    bandwidth, 3+ rows run oneDNN's blocked kernel.
    """

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, layer: nn.Linear) -> None:
        self.weight = layer.weight.detach()
        self.bias = None if layer.bias is None else layer.bias.detach()
        self.packed = _pack_for_onednn(self.weight)

    @property
    def kernel(self) -> str:
        return "mkl+onednn" if self.packed is not None else "mkl"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        x = x.contiguous()
        if self.packed is not None and rows >= ONEDNN_MIN_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if rows == 1:  # a matrix-vector product: two rows run about twice as fast
            x = torch.cat([x, x.new_zeros(1, x.shape[1])])
        y = torch.mm(self.weight, x.t()).t()[:rows].contiguous()
        return y if self.bias is None else y + self.bias
