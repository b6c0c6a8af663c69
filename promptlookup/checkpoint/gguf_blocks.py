"""GGUF's quantized blocks taken over as int4 or int8 groups of 32, with no float round trip.

GGUF stores a quantized row as blocks of 32 weights (``ggml``'s block formats):

- ``Q4_1`` (20 bytes): ``d`` f16, ``m`` f16, 16 bytes of codes; ``w = q * d + m``.
- ``Q4_0`` (18 bytes): ``d`` f16, 16 bytes of codes; ``w = (q - 8) * d``.
- ``Q8_0`` (34 bytes): ``d`` f16, 32 int8 codes; ``w = q * d``.

In the 4-bit ones, byte ``j`` of the codes holds weight ``j`` in its low nibble and weight
``j + 16`` in its high nibble. Both are exactly the kernels' int4 with ``group_size`` 32:
``code = q``, ``scale = d``, ``offset = m`` (``Q4_1``) or ``-8 * d`` (``Q4_0``), so the
dequantized weights equal ``gguf``'s own dequantization. The kernels' int8 per group of 32
(``W8A16_GPTQ``) holds all three exactly: the same codes (``Q8_0``: ``offset = 0``) as int8.
Other targets (int8 per channel, int4 per channel, another group size, ``Q8_0`` into int4)
do not match: those projections are dequantized (by transformers, as for an unquantized
conversion) and requantized, and :func:`prequantized_from_gguf` says so.

llama.cpp stores Q and K rows permuted for its rotary layout; the permutation moves whole
rows (blocks never cross rows), so it is undone on codes and scales alike, as transformers
undoes it on the float weights. Cost: one pass over the projections' raw bytes.

A float conversion reads the same blocks (:func:`float_state_from_gguf`): ``F32``, ``F16``,
``BF16`` and the three block formats above, dequantized by ``gguf``'s own formulas in
float32 (``d * q + m``, ``d * (q - 8)``, ``q * d``), so each weight is bitwise the one
transformers' GGUF loader gives; a file with a tensor in another format (the k-quants) or
under a name not mapped here is left to that loader. Tensors are located by
:func:`~.gguf_header.read_gguf_tensors` and read through a memory map.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UserError, one_line
from .gguf_header import GGUFTensor, read_gguf_tensors
from .layout import (HF_DOWN, HF_EMBEDDING, HF_FINAL_NORM, HF_GATE, HF_INPUT_NORM, HF_K, HF_LM_HEAD, HF_O,
                     HF_POST_NORM, HF_Q, HF_UP, HF_V, hf_layer_name)
from .quant_spec import GROUP_SCALE, GROUP_ZERO, QuantSpec
from .quantize import pack_int4

BLOCK = 32
EXACT_TYPES = {"int4": ("Q4_0", "Q4_1"), "int8": ("Q4_0", "Q4_1", "Q8_0")}  # target precision -> block types
# GGUF tensor name (under blk.{i}.) -> Hugging Face suffix (under model.layers.{i}.)
GGUF_PROJECTIONS = {
    "attn_q": HF_Q, "attn_k": HF_K, "attn_v": HF_V, "attn_output": HF_O,
    "ffn_gate": HF_GATE, "ffn_up": HF_UP, "ffn_down": HF_DOWN,
}
GGUF_TABLES = {"token_embd.weight": HF_EMBEDDING, "output.weight": HF_LM_HEAD}  # with --quantize_lm_head
PROJECTION_SUFFIXES = frozenset(GGUF_PROJECTIONS.values())
GGUF_NORMS = {"attn_norm": HF_INPUT_NORM, "ffn_norm": HF_POST_NORM}  # under blk.{i}., weight
GGUF_GLOBALS = {**GGUF_TABLES, "output_norm.weight": HF_FINAL_NORM}


BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def raw_rows(path: Path, tensor: GGUFTensor) -> np.ndarray:
    """``tensor``'s bytes as uint8 ``[rows, bytes per row]`` (a read-only memory map), for a
    kind in ``FLOAT_BYTES`` or ``BLOCK_BYTES``; a tensor running past the file's end, or a row
    that is not whole blocks, is a :class:`UserError`."""
    cols = tensor.shape[-1]
    rows = int(np.prod(tensor.shape[:-1], dtype=np.int64)) if len(tensor.shape) > 1 else 1
    if tensor.kind in FLOAT_BYTES:
        row_bytes = cols * FLOAT_BYTES[tensor.kind]
    elif cols % BLOCK:
        raise UserError(f"cannot read GGUF file {path}: {tensor.name} has rows of {cols}, not whole {tensor.kind} blocks")
    else:
        row_bytes = cols // BLOCK * BLOCK_BYTES[tensor.kind]
    try:
        return np.memmap(path, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(rows, row_bytes))
    except (ValueError, OSError) as exc:
        raise UserError(f"cannot read GGUF file {path}; it is corrupt or truncated at {tensor.name} "
                        f"({one_line(exc)})") from None


def dequantize_rows(raw: np.ndarray, kind: str) -> np.ndarray:
    """Rows of ``kind`` (uint8 ``[rows, bytes per row]``) as float32 ``[rows, columns]``:
    ``gguf``'s dequantization, operation for operation (so bitwise its values)."""
    if kind == "F32":
        return np.ascontiguousarray(raw).view(np.float32).copy()
    if kind == "F16":
        return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)
    if kind == "BF16":
        return (np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    rows, blocks = raw.shape[0], _blocks(raw, kind)
    d = _f16(blocks, 0)[..., None]
    if kind == "Q8_0":
        out = blocks[..., 2:].copy().view(np.int8).astype(np.float32) * d
    else:
        codes = _nibbles(blocks, kind)
        if kind == "Q4_1":
            out = d * codes.astype(np.float32) + _f16(blocks, 2)[..., None]
        else:
            out = d * (codes.astype(np.int8) - np.int8(8)).astype(np.float32)
    return out.reshape(rows, -1)


def _rotary_heads(config: Any) -> dict[str, int]:
    """The head counts whose llama.cpp row permutation Q and K weights undo (HF suffix -> heads)."""
    return {HF_Q: config.num_attention_heads, HF_K: config.num_key_value_heads or config.num_attention_heads}


def _hf_name(name: str) -> tuple[str, str | None] | None:
    """A GGUF tensor name's Hugging Face name and layer suffix (None for a global), or None."""
    if name in GGUF_GLOBALS:
        return GGUF_GLOBALS[name], None
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight":
        suffix = GGUF_PROJECTIONS.get(parts[2]) or GGUF_NORMS.get(parts[2])
        if suffix is not None:
            return hf_layer_name(int(parts[1]), suffix), suffix
    return None


def float_state_from_gguf(path: Path, config: Any) -> dict[str, torch.Tensor] | None:
    """Every tensor of the Llama GGUF file ``path`` as a float32 Hugging Face state dict
    (Q and K rows unpermuted with ``config``'s head counts), or None where a tensor is in a
    format or under a name this module does not read (the caller then uses transformers'
    loader). Cost: one pass over the file's tensor bytes."""
    tensors = read_gguf_tensors(path)
    known = [(t, _hf_name(t.name)) for t in tensors]
    if any(hf is None or (t.kind not in FLOAT_BYTES and t.kind not in BLOCK_BYTES) for t, hf in known):
        return None
    heads = _rotary_heads(config)
    state: dict[str, torch.Tensor] = {}
    for tensor, (name, suffix) in known:
        weight = torch.from_numpy(dequantize_rows(raw_rows(path, tensor), tensor.kind)).reshape(tensor.shape)
        state[name] = unpermute_rows(weight, heads[suffix]).contiguous() if suffix in heads else weight
    return state


def _blocks(raw: np.ndarray, kind: str) -> np.ndarray:
    """``kind`` rows (uint8 ``[rows, blocks * bytes]``) as ``[rows, blocks, bytes]``."""
    return np.ascontiguousarray(raw).reshape(raw.shape[0], -1, BLOCK_BYTES[kind])


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block, widened to float32 (exact)."""
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles(blocks: np.ndarray, kind: str) -> np.ndarray:
    """The 4-bit codes of ``Q4_0``/``Q4_1`` blocks (``[rows, blocks, bytes]``) as uint8 ``[rows,
    blocks, 32]``: byte j's low nibble is weight j, its high nibble weight j + 16."""
    qs = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def blocks_to_int4(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Q4_0``/``Q4_1`` rows (uint8 ``[rows, blocks * bytes]``) -> ``(codes uint8 [rows, 32 *
    blocks], scale f32 [rows, blocks], offset f32 [rows, blocks])`` with ``w = code * scale +
    offset``. Exact: the f16 ``d``/``m`` widen to f32 without rounding."""
    rows = raw.shape[0]
    blocks = _blocks(raw, kind)
    d = _f16(blocks, 0)
    offset = _f16(blocks, 2) if kind == "Q4_1" else np.float32(-8.0) * d
    codes = _nibbles(blocks, kind)
    return (torch.from_numpy(codes.reshape(rows, -1).copy()), torch.from_numpy(np.ascontiguousarray(d)),
            torch.from_numpy(np.ascontiguousarray(offset)))


def blocks_to_int8(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Q8_0``/``Q4_0``/``Q4_1`` rows -> ``(codes int8 [rows, 32 * blocks], scale f32 [rows,
    blocks], offset f32 [rows, blocks])`` with ``w = code * scale + offset``. Exact."""
    if kind != "Q8_0":
        codes, scale, offset = blocks_to_int4(raw, kind)
        return codes.to(torch.int8), scale, offset
    rows = raw.shape[0]
    blocks = _blocks(raw, kind)
    d = _f16(blocks, 0)
    codes = blocks[..., 2:].copy().view(np.int8)
    return (torch.from_numpy(codes.reshape(rows, -1).copy()), torch.from_numpy(np.ascontiguousarray(d)),
            torch.zeros(d.shape, dtype=torch.float32))


def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a Q or K weight (whole rows move)."""
    rows = t.shape[0]
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def prequantized_from_gguf(path: Path, spec: QuantSpec, config: Any) -> tuple[dict[str, dict[str, torch.Tensor]], list[str]]:
    """The projections of ``path`` (and with ``spec.lm_head`` its embedding table and LM head)
    whose blocks ``spec`` can take over exactly (HF name -> stored tensors,
    :func:`~.quantize.quantize_weight`'s layout), and the notes to print about the rest. Exact
    only for groups of 32: int4 on Q4_0/Q4_1 blocks, int8 on those and on Q8_0 blocks."""
    exact = EXACT_TYPES[spec.precision] if spec.group_size == BLOCK else ()
    heads = _rotary_heads(config)
    out: dict[str, dict[str, torch.Tensor]] = {}
    requantized: dict[str, int] = {}
    for tensor in read_gguf_tensors(path):
        name, suffix = _hf_name(tensor.name) or (None, None)
        if not (suffix in PROJECTION_SUFFIXES or (spec.lm_head and tensor.name in GGUF_TABLES)):
            continue
        kind = tensor.kind
        if kind not in exact:
            requantized[kind] = requantized.get(kind, 0) + 1
            continue
        to_codes = blocks_to_int8 if spec.precision == "int8" else blocks_to_int4
        codes, scale, offset = to_codes(raw_rows(path, tensor), kind)
        if suffix in heads:
            codes, scale, offset = (unpermute_rows(t, heads[suffix]) for t in (codes, scale, offset))
        weight = codes.contiguous() if spec.precision == "int8" else pack_int4(codes)
        out[name] = {"weight": weight, GROUP_SCALE: scale.contiguous(), GROUP_ZERO: offset.contiguous()}
    notes = []
    if out:
        notes.append(f"{len(out)} tensors taken over exactly from the GGUF's blocks "
                     f"({spec.precision}, groups of {BLOCK}): no float round trip")
    for kind, count in sorted(requantized.items()):
        target = f"{spec.precision} {'in groups of ' + str(spec.group_size) if spec.group_size else 'per channel'}"
        why = (f"{target} is not its grid, {'int4 or ' if kind != 'Q8_0' else ''}int8 in groups of {BLOCK}"
               if kind in EXACT_TYPES["int8"] else "it is not a block format taken over")
        noun = "tensor is" if count == 1 else "tensors are"
        notes.append(f"{count} {kind} {noun} dequantized and requantized to {spec.quant_algo} ({why})")
    return out, notes
