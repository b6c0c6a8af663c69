"""Splitting Hugging Face Llama weights into TensorRT-LLM rank shards, and merging them back.

Every ``shard_*`` function has its ``unshard_*`` inverse directly below it: for every
valid :class:`~promptlookup.checkpoint.layout.Layout`, ``unshard_x(shard_x(w)) == w``
exactly, since sharding only slices, zero-pads and repeats rows or columns (never any
arithmetic). Where each piece goes is documented in :mod:`promptlookup.checkpoint.layout`.

Each function is O(size of the tensors it touches). Results may be views sharing storage
with the input and with one another (a slice, a replicated norm, a lone shard): copy them
contiguously before handing them to ``safetensors``.
"""
from __future__ import annotations

from typing import Mapping

import torch

from ..errors import UserError
from .layout import HF_K, HF_Q, HF_V, QKV, SIMPLE_LAYER_WEIGHTS, Layout


def _cat(parts: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat`` that does not copy a lone part (tp_size == 1 is the common case)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _chunks(weight: torch.Tensor, parts: int, dim: int) -> list[torch.Tensor]:
    assert weight.shape[dim] % parts == 0, (tuple(weight.shape), parts, dim)
    return list(torch.chunk(weight, parts, dim=dim))


# --- plain column/row parallel weights -----------------------------------------------------

def shard_linear(weight: torch.Tensor, tp_size: int, dim: int | None) -> list[torch.Tensor]:
    """Split on ``dim`` into ``tp_size`` equal parts (``None``: replicate)."""
    if dim is None:
        return [weight] * tp_size
    return _chunks(weight, tp_size, dim)


def unshard_linear(parts: list[torch.Tensor], dim: int | None) -> torch.Tensor:
    """Inverse of :func:`shard_linear` (replicated weights: the first copy)."""
    if dim is None:
        return parts[0]
    return _cat(parts, dim)


# --- fused q/k/v --------------------------------------------------------------------------

def shard_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Per tensor rank ``[q_r; k_r; v_r]``, K/V heads repeated when fewer than ranks."""
    reps = layout.kv_repeats
    if reps > 1:
        k = _repeat_heads(k, layout.num_kv_heads, reps)
        v = _repeat_heads(v, layout.num_kv_heads, reps)
    qs, ks, vs = (_chunks(w, layout.tp_size, 0) for w in (q, k, v))
    return [torch.cat(triple, dim=0) for triple in zip(qs, ks, vs)]


def unshard_qkv(parts: list[torch.Tensor], layout: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`shard_qkv`: the full ``(q, k, v)``, one copy of each K/V head."""
    q_rows = layout.num_heads // layout.tp_size * layout.head_size
    kv_rows = max(1, layout.num_kv_heads // layout.tp_size) * layout.head_size
    qs, ks, vs = [], [], []
    for part in parts:
        if part.shape[0] != q_rows + 2 * kv_rows:
            raise UserError(f"attention.qkv shard has {part.shape[0]} rows, expected {q_rows + 2 * kv_rows} "
                            f"for this model and tp_size; the checkpoint is inconsistent with its config.json")
        q, k, v = torch.split(part, [q_rows, kv_rows, kv_rows], dim=0)
        qs.append(q)
        ks.append(k)
        vs.append(v)
    # With duplication, ranks r*reps .. r*reps+reps-1 hold copies of K/V head r: keep one.
    keep = slice(None, None, layout.kv_repeats)
    return _cat(qs), _cat(ks[keep]), _cat(vs[keep])


def _repeat_heads(weight: torch.Tensor, num_heads: int, reps: int) -> torch.Tensor:
    """Rows grouped by head ``[h0; h1; ...]`` -> ``[h0 x reps; h1 x reps; ...]``."""
    per_head = weight.reshape(num_heads, 1, -1, weight.shape[-1])
    return per_head.expand(num_heads, reps, -1, -1).reshape(-1, weight.shape[-1])


# --- vocabulary-sized weights -------------------------------------------------------------

def shard_lm_head(weight: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Pad with zero rows to a multiple of ``tp_size``, then split on dim 0."""
    pad = layout.padded_vocab_size - weight.shape[0]
    if pad:
        weight = torch.nn.functional.pad(weight, (0, 0, 0, pad))
    return _chunks(weight, layout.tp_size, 0)


def unshard_lm_head(parts: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    """Inverse of :func:`shard_lm_head`: concatenate and drop the padding rows."""
    return _cat(parts)[: layout.vocab_size]


# --- whole decoder layers -----------------------------------------------------------------

def shard_layer(hf: Mapping[str, torch.Tensor], layout: Layout) -> list[dict[str, torch.Tensor]]:
    """One decoder layer: HF suffix -> tensor, to one ``{TRT suffix: tensor}`` per tensor rank."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.tp_size)]
    for r, qkv in enumerate(shard_qkv(hf[HF_Q], hf[HF_K], hf[HF_V], layout)):
        ranks[r][QKV] = qkv
    for trt, (hf_name, dim) in SIMPLE_LAYER_WEIGHTS.items():
        for r, part in enumerate(shard_linear(hf[hf_name], layout.tp_size, dim)):
            ranks[r][trt] = part
    return ranks


def unshard_layer(ranks: list[Mapping[str, torch.Tensor]], layout: Layout) -> dict[str, torch.Tensor]:
    """Inverse of :func:`shard_layer`."""
    q, k, v = unshard_qkv([r[QKV] for r in ranks], layout)
    hf = {HF_Q: q, HF_K: k, HF_V: v}
    for trt, (hf_name, dim) in SIMPLE_LAYER_WEIGHTS.items():
        hf[hf_name] = unshard_linear([r[trt] for r in ranks], dim)
    return hf


# --- the linear weights alone (quantized parts) ------------------------------------------

def shard_linears(
    hf: Mapping[str, torch.Tensor], layout: Layout, *, replicate_row_parallel: bool = False
) -> list[dict[str, torch.Tensor]]:
    """:func:`shard_layer` for the seven projections only (HF suffix -> one tensor whose rows
    are the weight's output rows: a quantized weight, or its scales). ``replicate_row_parallel``:
    the tensors hold one value per output row (a per-channel scale, ``[out, 1]``), so the
    row-parallel layers (split on their input columns) get the whole tensor on every rank."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.tp_size)]
    for r, qkv in enumerate(shard_qkv(hf[HF_Q], hf[HF_K], hf[HF_V], layout)):
        ranks[r][QKV] = qkv
    for trt, (hf_name, dim) in SIMPLE_LAYER_WEIGHTS.items():
        if dim is None:
            continue  # a norm
        split = None if replicate_row_parallel and dim == 1 else dim
        for r, part in enumerate(shard_linear(hf[hf_name], layout.tp_size, split)):
            ranks[r][trt] = part
    return ranks


def unshard_linears(
    ranks: list[Mapping[str, torch.Tensor]], layout: Layout, *, replicate_row_parallel: bool = False
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`shard_linears`."""
    q, k, v = unshard_qkv([r[QKV] for r in ranks], layout)
    hf = {HF_Q: q, HF_K: k, HF_V: v}
    for trt, (hf_name, dim) in SIMPLE_LAYER_WEIGHTS.items():
        if dim is None:
            continue
        split = None if replicate_row_parallel and dim == 1 else dim
        hf[hf_name] = unshard_linear([r[trt] for r in ranks], split)
    return hf
