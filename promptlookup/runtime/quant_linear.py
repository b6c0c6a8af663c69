"""A weight-only int8/int4 linear layer: ``y = x @ W.T`` with ``W`` held as its codes and scales.

Holds exactly the tensors of :mod:`promptlookup.runtime.kernels`' contract (int8
``qweight [out, in]`` + ``scale [out]``; int8 per group ``qweight [out, in]`` and int4
``qweight [out, in // 2]``, each + ``scale`` and ``offset [out, in // group_size]``), nothing
else: no float copy of ``W`` stays resident. On the CPU every product goes through
``kernels.linear_int8`` / ``linear_int8_groups`` / ``linear_int4``
(row-invariant, so greedy speculative output equals plain output on a quantized engine);
the activations are taken to float32 for the call and the result returned in ``x``'s dtype.
A product of more than :data:`~.cpu_linear.GEMV_MAX_ROWS` rows (a prefill, or a batch's
verification step of that many rows) takes the float32 layer's route instead: the weight is
dequantized :data:`PREFILL_BLOCK` output rows at a time (a transient float block, never a
resident copy) and multiplied by MKL, which runs a long prompt's product several times
faster than the few-row kernels. Like the float32 route beyond that bound, it is not
row-invariant: a prompt is prefilled the same way whatever the decoding, and greedy identity
holds bitwise for steps of up to ``GEMV_MAX_ROWS`` rows, as in float32.
On a CUDA GPU every product goes through :func:`.gpu_quant.linear` (Triton; row-invariant too,
reading the codes, never a float copy).

Fusing (:meth:`QuantLinear.fuse`) concatenates output rows, codes and scales alike; every
part must share the precision and the group size.
"""
from __future__ import annotations

import torch

from . import gpu_quant, kernels
from .cpu_linear import GEMV_MAX_ROWS
from .kernels import step_ops

PREFILL_BLOCK = 1024  # output rows dequantized at a time for a product of more than GEMV_MAX_ROWS rows


class QuantLinear:
    """One projection on int8 weights (per output channel: ``group_size is None``; per group:
    with ``offset`` and ``group_size``) or int4 weights (per group).

    Cost per call: the kernel's, about one pass over ``qweight`` (the CPU's reference path,
    without the C kernels, dequantizes the matrix once per call).
    """

    __slots__ = ("qweight", "scale", "offset", "group_size", "bias")

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None,
                 group_size: int | None = None, bias: torch.Tensor | None = None) -> None:
        if qweight.dtype == torch.int8 and offset is None:
            if group_size is not None or scale.dim() != 1 or scale.shape[0] != qweight.shape[0]:
                raise ValueError("int8 weights per channel take one float32 scale per output row and no offset")
        elif qweight.dtype in (torch.int8, torch.uint8):
            name, width = ("int8", qweight.shape[1]) if qweight.dtype == torch.int8 else ("int4", qweight.shape[1] * 2)
            if group_size is None or group_size < 1 or width % group_size or (name == "int4" and group_size % 2):
                raise ValueError(f"{name} weights per group take a group size dividing the row (even for int4)")
            groups = width // group_size
            if offset is None or tuple(scale.shape) != (qweight.shape[0], groups) or scale.shape != offset.shape:
                raise ValueError(f"{name} per-group scale/offset must be [{qweight.shape[0]}, {groups}]")
        else:
            raise ValueError(f"quantized weights are int8 or uint8 (packed int4), not {qweight.dtype}")
        self.qweight = qweight.contiguous()
        self.scale = scale.float().contiguous()
        self.offset = None if offset is None else offset.float().contiguous()
        self.group_size = group_size
        self.bias = bias

    @property
    def precision(self) -> str:
        return "int8" if self.qweight.dtype == torch.int8 else "int4"

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @classmethod
    def fuse(cls, parts: list["QuantLinear"]) -> "QuantLinear":
        """One layer whose output rows are ``parts``' rows in order (gpt-fast's Q/K/V fusion)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        if any(p.precision != first.precision or p.group_size != first.group_size for p in parts):
            raise ValueError("fused quantized projections must share precision and group size")
        biases = [p.bias for p in parts]
        bias = None if any(b is None for b in biases) else torch.cat(biases)
        offset = None if first.offset is None else torch.cat([p.offset for p in parts])
        return cls(torch.cat([p.qweight for p in parts]), torch.cat([p.scale for p in parts]), offset,
                   first.group_size, bias)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``[out, in]`` weight this layer stands for (a new tensor)."""
        return self._dequantize(self.qweight, self.scale, self.offset).to(dtype)

    def _dequantize(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        if offset is None:
            return q.float() * scale.view(-1, 1)
        if q.dtype == torch.int8:
            return kernels.dequantize_int8_groups(q, scale, offset, self.group_size)
        return kernels.dequantize_int4(q, scale, offset, self.group_size)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """float32 rows ``index`` of the weight (``codes[row] * scale[row] (+ offset[row])``):
        an embedding lookup on a quantized table, equal to ``dequantize()[index]``. Cost:
        O(len(index) * in)."""
        offset = None if self.offset is None else self.offset.index_select(0, index)
        return self._dequantize(self.qweight.index_select(0, index), self.scale.index_select(0, index), offset)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cuda":
            y = gpu_quant.linear(x, self.qweight, self.scale, self.offset, self.group_size)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        if x.device.type != "cpu":
            raise ValueError(f"quantized products run on the CPU or a CUDA GPU, not {x.device}")
        dtype = x.dtype
        x32 = x.float().contiguous()
        if x32.dim() == 2 and x32.shape[0] > GEMV_MAX_ROWS:
            y = self._prefill_product(x32)
        elif self.offset is None:
            y = kernels.linear_int8(x32, self.qweight, self.scale)
        elif self.qweight.dtype == torch.int8:
            y = kernels.linear_int8_groups(x32, self.qweight, self.scale, self.offset, self.group_size)
        else:
            y = kernels.linear_int4(x32, self.qweight, self.scale, self.offset, self.group_size)
        if self.bias is not None:
            y = y + self.bias.float()
        return y if dtype == torch.float32 else y.to(dtype)

    def _prefill_product(self, x32: torch.Tensor) -> torch.Tensor:
        """``x32 @ W.T`` for many rows: :data:`PREFILL_BLOCK` weight rows at a time dequantized
        (:meth:`dequantize`'s values) and multiplied by MKL. Cost: one dequantization of the
        weight per call, O(out * in), plus the product; memory: one block of floats."""
        out = self.qweight.shape[0]
        y = x32.new_empty(x32.shape[0], out)
        for n0 in range(0, out, PREFILL_BLOCK):
            n1 = min(out, n0 + PREFILL_BLOCK)
            offset = None if self.offset is None else self.offset[n0:n1]
            torch.mm(x32, self._dequantize(self.qweight[n0:n1], self.scale[n0:n1], offset).t(), out=y[:, n0:n1])
        return y

    def kernel_operands(self) -> tuple[int, int, int, int, int] | None:
        """``(codes, scale, offset, kind, group size)`` (addresses, then sizes; 0 where absent;
        kind 1 int8, 2 int4, 3 int8 per group) of the C kernel's product, as
        :func:`~promptlookup.runtime.kernels.step_ops.layer_records` takes it; ``None`` where this
        layer does not run it (not on the CPU, no C kernels, a bias)."""
        if self.bias is not None or self.qweight.device.type != "cpu" or kernels.isa() == "reference":
            return None
        if self.offset is None:
            return (self.qweight.data_ptr(), self.scale.data_ptr(), 0, step_ops.KINDS["int8"], 0)
        kind = step_ops.KINDS["int8g" if self.qweight.dtype == torch.int8 else "int4"]
        return (self.qweight.data_ptr(), self.scale.data_ptr(), self.offset.data_ptr(), kind, self.group_size)

    def to(self, device: torch.device | str) -> "QuantLinear":
        """This layer's tensors on ``device`` (a new layer; self when already there)."""
        if self.qweight.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return QuantLinear(move(self.qweight), move(self.scale), move(self.offset), self.group_size, move(self.bias))

    def resident_bytes(self) -> int:
        """Bytes this layer keeps alive: codes, scales, offsets and bias."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale, self.offset, self.bias)
                   if t is not None)
