"""HF ``LlamaForCausalLM`` -> TensorRT-LLM checkpoint directory.

Output (names and placement: :mod:`~promptlookup.checkpoint.layout`; the
tensor operations: :mod:`~promptlookup.checkpoint.sharding`)::

    output_dir/
      config.json             TensorRT-LLM PretrainedConfig (architecture, sizes, mapping, ...)
      rank0.safetensors ...   one file per rank, rank = pp_rank * tp_size + tp_rank
      tokenizer files         when a tokenizer is given (chat template included)

The directory is assembled in a hidden sibling and renamed into place only when complete,
so a failure never leaves a partial checkpoint. Work is O(model size) time (plus the
replicated tensors) and O(one pipeline stage's weights) extra memory: stages are sharded
and written one at a time.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

from ..fsutil import atomic_output_dir, atomic_write_json
from . import layout as L
from .sharding import shard_layer, shard_lm_head
from .config import CHECKPOINT_KIND, checkpoint_config, resolve_dtype, torch_dtype
from .quant_spec import HF_QUANT_LINEARS, QUANT_LINEARS, QuantSpec
from .quantize import quantize_weight, shard_quantized, shard_quantized_lm_head

# Already quantized projections (e.g. GGUF Q4_1 blocks taken over exactly): full HF name ->
# stored tensors (part -> tensor), in the layout :func:`quantize_weight` returns.
Prequantized = dict[str, dict[str, torch.Tensor]]

__all__ = ["checkpoint_config", "convert_model"]


def _source_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _quantized_layer(index: int, source: dict[str, torch.Tensor], quant: QuantSpec,
                     prequantized: Prequantized) -> dict[str, dict[str, torch.Tensor]]:
    """Layer ``index``'s projections as stored tensors, HF suffix -> part -> tensor:
    taken from ``prequantized`` where present, else quantized from the float ``source``."""
    out = {}
    for suffix in HF_QUANT_LINEARS:
        name = L.hf_layer_name(index, suffix)
        out[suffix] = prequantized[name] if name in prequantized else quantize_weight(quant, source[name])
    return out


def _stage_tensors(state: dict[str, torch.Tensor], layout: L.Layout, pp_rank: int,
                   progress: tqdm | None, quant: QuantSpec | None = None,
                   source: dict[str, torch.Tensor] | None = None,
                   prequantized: Prequantized | None = None) -> list[dict[str, torch.Tensor]]:
    """The tensors of every tensor rank of one pipeline stage (possibly views of ``state``).
    With ``quant``, the projections are quantized (from ``source``, the uncast weights) and
    stored as their codes and scales (:mod:`.quantize`)."""
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.tp_size)]
    for local, index in enumerate(layout.pp_layers(pp_rank)):
        hf_layer = {suffix: state[L.hf_layer_name(index, suffix)] for suffix in L.HF_LAYER_WEIGHTS}
        for tp_rank, shard in enumerate(shard_layer(hf_layer, layout)):
            if quant is not None:
                shard = {s: t for s, t in shard.items() if s not in QUANT_LINEARS}
            ranks[tp_rank].update({L.layer_name(local, suffix): t for suffix, t in shard.items()})
        if quant is not None:
            parts = _quantized_layer(index, source, quant, prequantized or {})
            for tp_rank, shard in enumerate(shard_quantized(quant, parts, layout)):
                ranks[tp_rank].update({L.layer_name(local, suffix): t for suffix, t in shard.items()})
        if progress is not None:
            progress.update(1)
    table = quant is not None and quant.lm_head  # --quantize_lm_head: the table and head too
    pre = prequantized or {}
    if layout.is_first_stage(pp_rank):
        if table:  # replicated on every rank, as the float table
            parts = pre.get(L.HF_EMBEDDING) or quantize_weight(quant, source[L.HF_EMBEDDING])
            for rank in ranks:
                rank.update({_named(L.EMBEDDING, part): t for part, t in parts.items()})
        else:
            for rank in ranks:
                rank[L.EMBEDDING] = state[L.HF_EMBEDDING]
    if layout.is_last_stage(pp_rank):
        if table:  # a tied head is the table: the same codes (quantization is deterministic)
            head = source.get(L.HF_LM_HEAD, source[L.HF_EMBEDDING])
            tied = _same_storage(head, source[L.HF_EMBEDDING])
            parts = pre.get(L.HF_LM_HEAD) or (pre.get(L.HF_EMBEDDING) if tied else None) or quantize_weight(quant, head)
            heads = shard_quantized_lm_head(quant, parts, layout)
            for rank, parts in zip(ranks, heads):
                rank.update({_named(L.LM_HEAD, part): t for part, t in parts.items()})
        else:
            for rank, head in zip(ranks, shard_lm_head(state[L.HF_LM_HEAD], layout)):
                rank[L.LM_HEAD] = head
        for rank in ranks:
            rank[L.FINAL_NORM] = state[L.HF_FINAL_NORM]
    return ranks


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.data_ptr() == b.data_ptr()


def _named(weight_name: str, part: str) -> str:
    """``lm_head.weight`` + ``per_channel_scale`` -> ``lm_head.per_channel_scale``."""
    return weight_name.removesuffix("weight") + part


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write one rank file; every tensor becomes its own contiguous copy (no shared storage)."""
    owned = {name: t.clone(memory_format=torch.contiguous_format) for name, t in tensors.items()}
    save_file(owned, str(path), metadata={"format": "pt"})


def _default_permissions(directory: Path) -> None:
    """Give the directory and its files the modes a plain ``mkdir``/``open`` would (umask)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def convert_model(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | os.PathLike[str],
    *,
    dtype: str = "auto",
    tp_size: int = 1,
    pp_size: int = 1,
    progress: bool = False,
    quant: QuantSpec | None = None,
    prequantized: Prequantized | None = None,
) -> Path:
    """Write ``model`` (and ``tokenizer``, if any) as a TensorRT-LLM checkpoint; return its path.

    ``dtype`` is the storage dtype: ``auto`` keeps the model's dtype except float32, which
    is stored as float16 (as TensorRT-LLM does). ``quant``: weight-only int8/int4 of the
    decoder's projections (the embedding, LM head and norms stay in ``dtype``, unless
    ``quant.lm_head`` quantizes the LM head and the embedding table too), quantized
    from the model's own (uncast) weights, except those ``prequantized`` gives already
    quantized. Raises :class:`UserError` when the model cannot be split by
    ``tp_size``/``pp_size`` (or its groups would be), or the output location is unusable.
    """
    target = resolve_dtype(dtype, _source_dtype(model))
    cfg = checkpoint_config(model.config, target, tp_size, pp_size, quant)
    layout = L.Layout.from_config(cfg)
    cast = torch_dtype(target)
    with torch.no_grad():
        source = {name: t.detach() for name, t in model.state_dict().items()}
        state = {name: t.to(cast) for name, t in source.items()}
    # Tied models may omit lm_head from the state dict; TensorRT-LLM always stores it.
    state.setdefault(L.HF_LM_HEAD, state[L.HF_EMBEDDING])

    output_dir = Path(output_dir)
    with atomic_output_dir(output_dir, CHECKPOINT_KIND) as tmp:
        bar = tqdm(total=layout.num_layers, desc="converting layers", unit="layer",
                   disable=not progress)
        with bar:
            for pp_rank in range(layout.pp_size):
                stage = _stage_tensors(state, layout, pp_rank, bar, quant, source, prequantized)
                for tp_rank, tensors in enumerate(stage):
                    _save(tensors, tmp / L.rank_file(layout.rank(tp_rank, pp_rank)))
        atomic_write_json(tmp / "config.json", cfg)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        _default_permissions(tmp)  # temporary dirs/files are created private (0700/0600)
    return output_dir
