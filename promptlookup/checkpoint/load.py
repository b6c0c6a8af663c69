"""TensorRT-LLM checkpoint (or engine) directory -> HF ``LlamaForCausalLM`` on CPU.

The inverse of :mod:`promptlookup.checkpoint.convert`: read ``config.json`` (a checkpoint
config, or an engine config whose ``pretrained_config`` holds one), read every
``rank{N}.safetensors``, check each holds exactly the tensors its rank should with the
right shapes, merge the tensor/pipeline shards (dropping duplicated K/V heads and vocab
padding) and load them into a ``LlamaForCausalLM`` built offline from the config.
O(model size) time; the merged tensors become the model's parameters, so peak memory is
about one copy of the weights (two when the dtype changes or shards must be concatenated).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..errors import UserError
from . import layout as L
from .sharding import unshard_layer, unshard_lm_head
from .quant_spec import GROUP_SCALE, GROUP_ZERO, PER_CHANNEL_SCALE, QuantSpec
from .quantize import dequantize, quantized_shapes, unshard_quantized, unshard_quantized_lm_head
from .config import (
    llama_config_from_checkpoint,
    quant_spec_of,
    read_checkpoint_config,
    torch_dtype,
    unwrap_config,
    validate_checkpoint_config,
)

SCALE_PARTS = ("." + PER_CHANNEL_SCALE, "." + GROUP_SCALE, "." + GROUP_ZERO)

__all__ = ["llama_config_from_checkpoint", "load_checkpoint", "load_checkpoint_state", "read_checkpoint_config"]


def _read_rank(directory: Path, layout: L.Layout, rank: int, quant: QuantSpec | None = None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / L.rank_file(rank)
    if not path.is_file():
        raise UserError(f"checkpoint {directory} is incomplete: {path.name} is missing "
                        f"(config.json says tp_size={layout.tp_size}, pp_size={layout.pp_size})")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {' '.join(str(exc).split())}") from None
    floats = L.expected_shapes(layout, *layout.coords(rank))
    typed = quantized_shapes(quant, floats) if quant is not None else {k: (v, None) for k, v in floats.items()}
    expected = {name: shape for name, (shape, _) in typed.items()}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise UserError(f"checkpoint {directory} is incomplete: {path.name} lacks {len(missing)} tensors "
                        f"(e.g. {missing[0]})")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise UserError(f"{path.name} holds tensors this loader does not understand (e.g. {unexpected[0]}); "
                        f"the checkpoint does not match its config.json's quantization")
    for name, (shape, dtype) in typed.items():
        if tuple(tensors[name].shape) != shape:
            raise UserError(f"{path.name}: {name} has shape {tuple(tensors[name].shape)}, expected {shape}; "
                            f"the checkpoint does not match its config.json")
        if dtype is not None and tensors[name].dtype != dtype:
            raise UserError(f"{path.name}: {name} is {tensors[name].dtype}, expected {dtype} for its quantization")
    return tensors


def merge_ranks(
    ranks: list[Mapping[str, torch.Tensor]], layout: L.Layout, tie_word_embeddings: bool,
    quant: QuantSpec | None = None,
) -> dict[str, torch.Tensor]:
    """Per-rank TensorRT-LLM tensors (indexed by global rank) -> a HF Llama state dict.
    With ``quant``, each projection appears as its stored parts under HF names
    (``...q_proj.weight`` the codes, ``...q_proj.per_channel_scale`` etc.)."""
    def rank_of(tp_rank: int, pp_rank: int) -> Mapping[str, torch.Tensor]:
        return ranks[layout.rank(tp_rank, pp_rank)]

    state: dict[str, torch.Tensor] = {}
    for pp_rank in range(layout.pp_size):
        for local, index in enumerate(layout.pp_layers(pp_rank)):
            if quant is None:
                per_tp = [{suffix: rank_of(t, pp_rank)[L.layer_name(local, suffix)] for suffix in L.LAYER_WEIGHTS}
                          for t in range(layout.tp_size)]
                merged = unshard_layer(per_tp, layout)
            else:
                prefix = L.layer_name(local, "")
                per_tp = [{k.removeprefix(prefix): v for k, v in rank_of(t, pp_rank).items() if k.startswith(prefix)}
                          for t in range(layout.tp_size)]
                merged = unshard_quantized(quant, per_tp, layout)
                for suffix in (L.INPUT_NORM, L.POST_NORM):
                    merged[L.SIMPLE_LAYER_WEIGHTS[suffix][0]] = per_tp[0][suffix]
            for suffix, tensor in merged.items():
                state[L.hf_layer_name(index, suffix)] = tensor
    first, last = 0, layout.pp_size - 1
    state[L.HF_FINAL_NORM] = rank_of(0, last)[L.FINAL_NORM]
    if quant is not None and quant.lm_head:  # the table and the head as codes and scales
        parts = ("weight", *quant.tensor_suffixes())
        for part in parts:
            state[_named(L.HF_EMBEDDING, part)] = rank_of(0, first)[_named(L.EMBEDDING, part)]
        if tie_word_embeddings:  # one table: the head's parts are the embedding's tensors
            head = {part: state[_named(L.HF_EMBEDDING, part)] for part in parts}
        else:
            head = unshard_quantized_lm_head(
                quant, [{part: rank_of(t, last)[_named(L.LM_HEAD, part)] for part in parts}
                        for t in range(layout.tp_size)], layout)
        for part, t in head.items():
            state[_named(L.HF_LM_HEAD, part)] = t
        return state
    state[L.HF_EMBEDDING] = rank_of(0, first)[L.EMBEDDING]
    if tie_word_embeddings:
        state[L.HF_LM_HEAD] = state[L.HF_EMBEDDING]
    else:
        state[L.HF_LM_HEAD] = unshard_lm_head([rank_of(t, last)[L.LM_HEAD] for t in range(layout.tp_size)], layout)
    return state


def _named(weight_name: str, part: str) -> str:
    """``lm_head.weight`` + ``per_channel_scale`` -> ``lm_head.per_channel_scale``."""
    return weight_name.removesuffix("weight") + part


def empty_llama(config) -> LlamaForCausalLM:
    """Construct without random initialisation (the weights are overwritten next)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: initialise normally (slower, same result)
        return LlamaForCausalLM(config)
    with no_init_weights():
        return LlamaForCausalLM(config)


def load_checkpoint_state(
    directory: str | os.PathLike[str],
    config: Mapping[str, Any] | None = None,
    dtype: str | None = None,
    device: str = "cpu",
    dequantized: bool = False,
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """A checkpoint/engine directory's merged weights (Hugging Face names) and config.

    A weight-only quantized checkpoint gives each projection's stored parts (codes and
    scales, as :func:`merge_ranks` names them; ``dtype`` applies to the float tensors only),
    or with ``dequantized`` the float weights they stand for (in ``dtype``).

    ``config``: the (checkpoint or engine) config dict if the caller already read it.
    ``dtype``: ``None`` -> float32; ``"auto"`` -> the checkpoint's storage dtype.
    ``device``: where the tensors end up (moved one at a time, so a GPU load never holds
    a second copy of the whole model on the host). With tied
    embeddings ``lm_head.weight`` is the embedding tensor itself. The caller owns the
    tensors: nothing else references them. Raises :class:`UserError` for a missing,
    incomplete or inconsistent directory.
    """
    directory = Path(directory)
    cfg = unwrap_config(config) if config is not None else read_checkpoint_config(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint directory {directory} does not exist; create it with convert_checkpoint.py")
    layout = validate_checkpoint_config(cfg)
    quant = quant_spec_of(cfg)
    target = torch_dtype(cfg["dtype"] if dtype == "auto" else dtype or "float32")
    llama_config = llama_config_from_checkpoint(cfg)
    llama_config.dtype = target
    ranks = [_read_rank(directory, layout, rank, quant) for rank in range(layout.world_size)]
    state = merge_ranks(ranks, layout, llama_config.tie_word_embeddings, quant)
    del ranks
    if quant is not None and dequantized:
        _dequantize_state(quant, state, layout.num_layers)
    # The rank files are memory-mapped: a tensor kept as read would keep the whole file's
    # mapping (and every page touched while loading) resident, so each tensor gets its own
    # storage here, one at a time. A tied tensor stays one tensor.
    moved: dict[int, torch.Tensor] = {}
    for name, tensor in state.items():
        if id(tensor) not in moved:
            out = tensor.to(device=device, dtype=None if _keeps_dtype(name, tensor) else target)
            moved[id(tensor)] = out.clone() if out.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr() else out
        state[name] = moved[id(tensor)]
    del moved
    return llama_config, state


def _keeps_dtype(name: str, tensor: torch.Tensor) -> bool:
    """Quantized codes (integers) and their float32 scales keep their dtype on load."""
    return not tensor.is_floating_point() or name.endswith(SCALE_PARTS)


def _dequantize_state(quant: QuantSpec, state: dict[str, torch.Tensor], num_layers: int) -> None:
    """Replace each projection's stored parts in ``state`` by the float32 weight they stand for."""
    from .quant_spec import HF_QUANT_LINEARS

    for index in range(num_layers):
        for suffix in HF_QUANT_LINEARS:
            base = L.hf_layer_name(index, suffix).removesuffix("weight")
            parts = {part: state.pop(base + part) for part in ("weight", *quant.tensor_suffixes())}
            state[base + "weight"] = dequantize(quant, parts)
    if quant.lm_head:
        tables: dict[int, torch.Tensor] = {}  # a tied head stays the table's tensor
        for name in (L.HF_EMBEDDING, L.HF_LM_HEAD):
            parts = {part: state.pop(_named(name, part)) for part in ("weight", *quant.tensor_suffixes())}
            key = id(parts["weight"])
            if key not in tables:
                tables[key] = dequantize(quant, parts)
            state[name] = tables[key]


def load_checkpoint(
    directory: str | os.PathLike[str], config: Mapping[str, Any] | None = None, dtype: str | None = None
) -> LlamaForCausalLM:
    """Load a checkpoint/engine directory as an eval-mode ``LlamaForCausalLM`` on CPU
    (arguments and errors as :func:`load_checkpoint_state`); a quantized checkpoint's
    projections are dequantized (the float weights the int8/int4 engine computes with)."""
    llama_config, state = load_checkpoint_state(directory, config, dtype, dequantized=True)
    target = llama_config.dtype
    # Adopt the merged tensors as the parameters (no copy when the dtype already matches).
    model = empty_llama(llama_config)
    model.load_state_dict(state, strict=True, assign=True)
    if llama_config.tie_word_embeddings:
        model.tie_weights()
    model.config.dtype = target
    return model.to(target).eval()
