"""Weight-only int8/int4 quantization of the decoder's linear weights (TensorRT-LLM's
``--use_weight_only``), stored in the layout of :mod:`promptlookup.runtime.kernels`' contract.

What ``convert_checkpoint.py`` writes, per quantized linear ``P`` (e.g.
``transformer.layers.0.attention.qkv``), ``[out, in]`` being the float weight's shape:

============  ===========================  ===============================================
quant_algo    ``P.weight``                 scales
============  ===========================  ===============================================
W8A16         int8 ``[out, in]``           ``P.per_channel_scale`` f32 ``[out]``
W4A16         uint8 ``[out, in // 2]``     ``P.per_channel_scale`` f32 ``[out]`` (symmetric:
                                           offset ``-8 * scale``)
W8A16_GPTQ    int8 ``[out, in]``           ``P.weights_scaling_factor`` and ``P.zero``, f32
                                           ``[out, in // group_size]``
W4A16_GPTQ    uint8 ``[out, in // 2]``     the same
============  ===========================  ===============================================

int8 per group: ``W = code * scale + offset`` per group, codes -128..127 (``P.zero`` is that
additive ``offset``, TensorRT-LLM's GPTQ ``zero`` for signed codes).

int4 codes are 0..15, two per byte (column ``2j`` in the low nibble); ``W = code * scale +
offset`` per group. ``P.zero`` holds that additive ``offset`` (TensorRT-LLM's GPTQ ``zero``
is the additive term for signed codes, ``code - 8``: ours is theirs minus ``8 * scale``).

Quantization is round-to-nearest, so every element lies within half a step of its
dequantized value: int8 and int4 per channel are symmetric (``scale = max|w| / 127`` and
``/ 7``, as TensorRT-LLM's ``symmetric_quantize``), int4 and int8 per group are asymmetric
(``scale = (max - min) / 15`` or ``/ 255``, the group's minimum at the lowest code).
Cost: O(weights), a few temporaries the size of one matrix in float32.
"""
from __future__ import annotations

from typing import Mapping

import torch

from .layout import EMBEDDING, LM_HEAD, Layout
from .quant_spec import GROUP_SCALE, GROUP_ZERO, PER_CHANNEL_SCALE, QUANT_LINEARS, QuantSpec
from .sharding import shard_lm_head, shard_linears, unshard_lm_head, unshard_linears

# --- the numerics ---------------------------------------------------------------------------

def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 ``[out, in]`` -> ``[out, in // 2]``, column ``2j`` in the low nibble."""
    codes = codes.to(torch.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weight of int4 codes (packed, :func:`pack_int4`) with per-group
    ``scale`` and ``offset`` ``[out, in // group_size]``: ``code * scale + offset``."""
    out = qweight.shape[0]
    groups = unpack_int4(qweight).float().view(out, -1, group_size)
    return groups.mul_(scale.unsqueeze(-1)).add_(offset.unsqueeze(-1)).view(out, -1)  # in place: no temporaries


def dequantize_int8_groups(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                           group_size: int) -> torch.Tensor:
    """The float32 ``[out, in]`` weight of int8 codes with per-group ``scale`` and ``offset``."""
    out, in_ = qweight.shape
    groups = qweight.float().view(out, -1, group_size)
    return groups.mul_(scale.unsqueeze(-1)).add_(offset.unsqueeze(-1)).view(out, in_)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(qweight int8 [out, in], scale f32 [out])``, symmetric per output channel."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def quantize_int4_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed uint8 [out, in // 2], scale f32 [out])``, symmetric per output channel
    (codes ``round(w / scale) + 8``, offset ``-8 * scale``)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
    codes = (torch.round(w / scale[:, None]).clamp_(-8, 7) + 8).to(torch.uint8)
    return pack_int4(codes), scale.contiguous()


def quantize_int4_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed uint8 [out, in // 2], scale f32 [out, groups], offset f32 [out, groups])``,
    asymmetric per group of ``group_size`` input columns (``offset`` = the group's minimum)."""
    w = weight.detach().float()
    out, width = w.shape
    groups = w.view(out, width // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = torch.where(hi > lo, (hi - lo) / 15.0, torch.ones_like(lo))
    codes = torch.round((groups - lo.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp_(0, 15).to(torch.uint8)
    return pack_int4(codes.view(out, width)), scale.contiguous(), lo.contiguous()


def quantize_int8_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(codes int8 [out, in], scale f32 [out, groups], offset f32 [out, groups])``,
    asymmetric per group of ``group_size`` input columns: code ``c`` in -128..127 stands for
    ``c * scale + offset``, ``offset = min + 128 * scale`` (the minimum at code -128; a
    constant group has ``scale`` 0, so its value is ``offset`` exactly)."""
    w = weight.detach().float()
    out, width = w.shape
    groups = w.view(out, width // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = (hi - lo) / 255.0  # 0 for a constant group: code 0 and offset = its value, exactly
    offset = lo + 128.0 * scale
    step = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    codes = torch.round((groups - offset.unsqueeze(-1)) / step).clamp_(-128, 127)
    codes = torch.where(scale.unsqueeze(-1) > 0, codes, torch.zeros_like(codes)).to(torch.int8)
    return codes.view(out, width).contiguous(), scale.contiguous(), offset.contiguous()


def int4_offset(spec: QuantSpec, tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(scale, offset, group_size)`` of one int4 linear's stored tensors (suffix -> tensor)
    in the contract's ``[out, groups]`` form; per channel is one group of the whole row."""
    if spec.group_size is None:
        scale = tensors[PER_CHANNEL_SCALE].float().view(-1, 1)
        width = tensors["weight"].shape[1] * 2
        return scale, -8.0 * scale, width
    return tensors[GROUP_SCALE].float(), tensors[GROUP_ZERO].float(), spec.group_size


def quantize_weight(spec: QuantSpec, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """One float weight ``[out, in]`` -> its stored tensors, suffix (``weight``, scales) -> tensor."""
    if spec.precision == "int8" and spec.group_size is None:
        q, scale = quantize_int8(weight)
        return {"weight": q, PER_CHANNEL_SCALE: scale}
    if spec.precision == "int8":
        q, scale, offset = quantize_int8_groups(weight, spec.group_size)
        return {"weight": q, GROUP_SCALE: scale, GROUP_ZERO: offset}
    if spec.group_size is None:
        q, scale = quantize_int4_channel(weight)
        return {"weight": q, PER_CHANNEL_SCALE: scale}
    q, scale, offset = quantize_int4_groups(weight, spec.group_size)
    return {"weight": q, GROUP_SCALE: scale, GROUP_ZERO: offset}


def dequantize(spec: QuantSpec, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The float32 ``[out, in]`` weight that stored tensors (suffix -> tensor) stand for:
    the dequantizers above, which ``runtime.kernels`` uses as its contract's formulas."""
    q = tensors["weight"]
    if spec.precision == "int8" and spec.group_size is None:
        return q.float() * tensors[PER_CHANNEL_SCALE].float().view(-1, 1)
    if spec.precision == "int8":
        return dequantize_int8_groups(q, tensors[GROUP_SCALE].float(), tensors[GROUP_ZERO].float(), spec.group_size)
    scale, offset, group = int4_offset(spec, tensors)
    return dequantize_int4(q, scale, offset, group)


# --- placement in the rank files ------------------------------------------------------------

def _base(suffix: str) -> str:
    return suffix.removesuffix("weight")


def shard_quantized(spec: QuantSpec, hf_parts: Mapping[str, Mapping[str, torch.Tensor]],
                    layout: Layout) -> list[dict[str, torch.Tensor]]:
    """One layer's quantized projections, HF suffix -> stored tensors (part -> tensor), to one
    ``{TensorRT-LLM suffix: tensor}`` per tensor rank (``attention.qkv.weight``,
    ``attention.qkv.per_channel_scale``, ...). Rows go where the float weight's rows go;
    per-group scales are split with their columns (:func:`check_spec` keeps groups whole);
    a per-channel scale is whole on the ranks of a layer split on its input columns (the
    layer is quantized whole, then split). Slicing only: exact."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.tp_size)]
    for part in ("weight", *spec.tensor_suffixes()):
        per_row = part == PER_CHANNEL_SCALE
        hf = {name: (t[part].view(-1, 1) if per_row else t[part]) for name, t in hf_parts.items()}
        for r, shard in enumerate(shard_linears(hf, layout, replicate_row_parallel=per_row)):
            for trt, t in shard.items():
                ranks[r][_base(trt) + part] = t.reshape(-1) if per_row else t
    return ranks


def unshard_quantized(spec: QuantSpec, ranks: list[Mapping[str, torch.Tensor]],
                      layout: Layout) -> dict[str, torch.Tensor]:
    """Inverse of :func:`shard_quantized`, keyed by HF suffix with the part's name
    (``self_attn.q_proj.weight``, ``self_attn.q_proj.per_channel_scale``, ...)."""
    hf: dict[str, torch.Tensor] = {}
    for part in ("weight", *spec.tensor_suffixes()):
        per_row = part == PER_CHANNEL_SCALE
        parts = [{trt: (r[_base(trt) + part].view(-1, 1) if per_row else r[_base(trt) + part])
                  for trt in QUANT_LINEARS} for r in ranks]
        for name, t in unshard_linears(parts, layout, replicate_row_parallel=per_row).items():
            hf[_base(name) + part] = t.reshape(-1) if per_row else t
    return hf


def shard_quantized_lm_head(spec: QuantSpec, parts: Mapping[str, torch.Tensor], layout: Layout) -> list[dict[str, torch.Tensor]]:
    """A quantized LM head's stored tensors (part -> tensor, rows = vocabulary rows) to one
    ``{part: tensor}`` per tensor rank: every part is split on its rows as the float head is
    (zero-padded to the padded vocabulary). Slicing only: exact."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.tp_size)]
    for part in ("weight", *spec.tensor_suffixes()):
        t = parts[part]
        for r, shard in enumerate(shard_lm_head(t.view(-1, 1) if t.dim() == 1 else t, layout)):
            ranks[r][part] = shard.reshape(-1) if t.dim() == 1 else shard
    return ranks


def unshard_quantized_lm_head(spec: QuantSpec, ranks: list[Mapping[str, torch.Tensor]], layout: Layout) -> dict[str, torch.Tensor]:
    """Inverse of :func:`shard_quantized_lm_head` (padding rows dropped)."""
    out = {}
    for part in ("weight", *spec.tensor_suffixes()):
        one_dim = ranks[0][part].dim() == 1
        t = unshard_lm_head([r[part].view(-1, 1) if one_dim else r[part] for r in ranks], layout)
        out[part] = t.reshape(-1) if one_dim else t
    return out


def quantized_shapes(spec: QuantSpec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """A rank file's expected ``{name: (shape, dtype or None)}`` once quantized, from its float
    shapes (:func:`~.layout.expected_shapes`): each projection's ``weight`` becomes its codes
    and gains its scales; every other tensor keeps its shape (dtype ``None``: the float dtype)."""
    out: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {}
    for name, shape in shapes.items():
        suffix = next((s for s in QUANT_LINEARS if name.endswith("." + s)), None)
        if suffix is None and not (spec.lm_head and name in (EMBEDDING, LM_HEAD)):
            out[name] = (shape, None)
            continue
        rows, cols = shape
        base = name.removesuffix("weight")
        if spec.precision == "int8":
            out[name] = ((rows, cols), torch.int8)
        else:
            out[name] = ((rows, cols // 2), torch.uint8)
        if spec.group_size is None:
            out[base + PER_CHANNEL_SCALE] = ((rows,), torch.float32)
        else:
            out[base + GROUP_SCALE] = ((rows, cols // spec.group_size), torch.float32)
            out[base + GROUP_ZERO] = ((rows, cols // spec.group_size), torch.float32)
    return out
