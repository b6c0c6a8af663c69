"""GGUF's 4-bit blocks taken over as int4 groups of 32, with no float round trip.

GGUF stores a quantized row as blocks of 32 weights (``ggml``'s block formats):

- ``Q4_1`` (20 bytes): ``d`` f16, ``m`` f16, 16 bytes of codes; ``w = q * d + m``.
- ``Q4_0`` (18 bytes): ``d`` f16, 16 bytes of codes; ``w = (q - 8) * d``.

In both, byte ``j`` of the codes holds weight ``j`` in its low nibble and weight
``j + 16`` in its high nibble. Both are exactly the kernels' int4 with ``group_size`` 32:
``code = q``, ``scale = d``, ``offset = m`` (``Q4_1``) or ``-8 * d`` (``Q4_0``), so the
dequantized weights equal ``gguf``'s own dequantization. ``Q8_0`` (32 int8 weights, one
scale per block) does not match per-channel int8, and other targets (int8, int4 per
channel, another group size) do not match 4-bit blocks of 32: those projections are
dequantized (by transformers, as for an unquantized conversion) and requantized, and
:func:`prequantized_from_gguf` says so.

llama.cpp stores Q and K rows permuted for its rotary layout; the permutation moves whole
rows (blocks never cross rows), so it is undone on codes and scales alike, as transformers
undoes it on the float weights. Cost: one pass over the projections' raw bytes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UserError, one_line
from .layout import HF_DOWN, HF_GATE, HF_K, HF_O, HF_Q, HF_UP, HF_V, hf_layer_name
from .quant_spec import GROUP_SCALE, GROUP_ZERO, QuantSpec
from .quantize import pack_int4

BLOCK = 32
EXACT_TYPES = ("Q4_0", "Q4_1")
# GGUF tensor name (under blk.{i}.) -> Hugging Face suffix (under model.layers.{i}.)
GGUF_PROJECTIONS = {
    "attn_q": HF_Q, "attn_k": HF_K, "attn_v": HF_V, "attn_output": HF_O,
    "ffn_gate": HF_GATE, "ffn_up": HF_UP, "ffn_down": HF_DOWN,
}


def blocks_to_int4(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Q4_0``/``Q4_1`` rows (uint8 ``[rows, blocks * bytes]``) -> ``(codes uint8 [rows, 32 *
    blocks], scale f32 [rows, blocks], offset f32 [rows, blocks])`` with ``w = code * scale +
    offset``. Exact: the f16 ``d``/``m`` widen to f32 without rounding."""
    size = {"Q4_0": 18, "Q4_1": 20}[kind]
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_1":
        offset = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., 4:]
    else:
        offset = np.float32(-8.0) * d
        qs = blocks[..., 2:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # weights 0..15, then 16..31
    return (torch.from_numpy(codes.reshape(rows, -1).copy()), torch.from_numpy(np.ascontiguousarray(d)),
            torch.from_numpy(np.ascontiguousarray(offset)))


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a Q or K weight (whole rows move)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def prequantized_from_gguf(path: Path, spec: QuantSpec, config: Any) -> tuple[dict[str, dict[str, torch.Tensor]], list[str]]:
    """The projections of ``path`` whose blocks ``spec`` can take over exactly (HF name ->
    stored tensors, :func:`~.quantize.quantize_weight`'s layout), and the notes to print
    about the rest. Exact only for ``spec`` int4 with groups of 32 on Q4_0/Q4_1 blocks."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # damaged files raise several types
        raise UserError(f"cannot read GGUF file {path}: {one_line(exc)}") from None
    exact = spec.precision == "int4" and spec.group_size == BLOCK
    heads = {HF_Q: config.num_attention_heads, HF_K: config.num_key_value_heads or config.num_attention_heads}
    out: dict[str, dict[str, torch.Tensor]] = {}
    requantized: dict[str, int] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in GGUF_PROJECTIONS:
            continue
        kind = tensor.tensor_type.name
        suffix = GGUF_PROJECTIONS[parts[2]]
        if not (exact and kind in EXACT_TYPES):
            requantized[kind] = requantized.get(kind, 0) + 1
            continue
        codes, scale, offset = blocks_to_int4(np.asarray(tensor.data), kind)
        if suffix in heads:
            codes, scale, offset = (unpermute_rows(t, heads[suffix]) for t in (codes, scale, offset))
        out[hf_layer_name(int(parts[1]), suffix)] = {"weight": pack_int4(codes), GROUP_SCALE: scale.contiguous(),
                                                    GROUP_ZERO: offset.contiguous()}
    notes = []
    if out:
        notes.append(f"{len(out)} projections taken over exactly from the GGUF's 4-bit blocks "
                     f"(int4, groups of {BLOCK}): no float round trip")
    for kind, count in sorted(requantized.items()):
        why = ("its blocks are 32 int8 weights with one scale, not per-channel int8" if kind == "Q8_0"
               else f"{spec.quant_algo} with {'groups of ' + str(spec.group_size) if spec.group_size else 'one scale per channel'} "
                    f"is not its grid (int4 groups of {BLOCK})" if kind in EXACT_TYPES
               else "it is not a 4-bit block format")
        notes.append(f"{count} {kind} projections are dequantized and requantized to {spec.quant_algo} ({why})")
    return out, notes
