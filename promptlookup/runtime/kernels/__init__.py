"""Products ``y = x @ W.T`` for the few rows of a decode or verification step, on weights
held in fp32 or weight-only int8/int4 (activations stay fp32).

The contract every implementation here keeps (the C kernels and the reference below):

- ``x``: float32 ``[rows, in]``, contiguous; the result: float32 ``[rows, out]``, contiguous.
- int8 (per channel): ``qweight`` int8 ``[out, in]``, ``scale`` float32 ``[out]``;
  ``W[o, i] = qweight[o, i] * scale[o]``.
- int4 (per group of ``group_size`` input columns, ``in % group_size == 0``, ``group_size``
  even): ``qweight`` uint8 ``[out, in // 2]``, column ``2j`` in the low nibble and ``2j + 1``
  in the high nibble, codes 0..15; ``scale`` and ``offset`` float32 ``[out, in // group_size]``;
  ``W[o, i] = code[o, i] * scale[o, g] + offset[o, g]`` with ``g = i // group_size``
  (TensorRT-LLM's symmetric int4 is ``offset = -8 * scale``; GGUF's Q4_1 is its ``min``).
- **Row invariance**: each output element is bitwise the same whatever the number of rows
  in the call and the row's place among them, so a one-row decoding step and a many-row
  verification step compute the same logits for the same prefix, and greedy speculative
  output equals plain greedy output on a quantized engine.

:func:`isa` names the instruction-set path in use.
"""
from __future__ import annotations

import torch


def isa() -> str:
    """The instruction-set path the products run on: ``"reference"`` (PyTorch, this module)."""
    return "reference"


def linear_int8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T`` (reference: one row at a time, so row-invariant)."""
    w = qweight.float() * scale.view(-1, 1)
    return torch.stack([torch.mv(w, row) for row in x]) if x.shape[0] else x.new_zeros(0, w.shape[0])


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weight of an int4 layer (see the module docstring)."""
    out = qweight.shape[0]
    codes = torch.stack([qweight & 0xF, qweight >> 4], dim=-1).view(out, -1).float()
    groups = codes.view(out, -1, group_size)
    return (groups * scale.unsqueeze(-1) + offset.unsqueeze(-1)).view(out, -1)


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """``x @ W.T`` for an int4 weight (reference: dequantize, then one row at a time)."""
    w = dequantize_int4(qweight, scale, offset, group_size)
    return torch.stack([torch.mv(w, row) for row in x]) if x.shape[0] else x.new_zeros(0, w.shape[0])
