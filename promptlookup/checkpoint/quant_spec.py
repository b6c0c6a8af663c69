"""Which weight-only quantization a checkpoint holds (TensorRT-LLM's ``quantization`` entry),
and whether a model's geometry admits it. Pure Python (no torch): the command line checks
flags with it before anything is loaded. The numerics and the tensor placement live in
:mod:`promptlookup.checkpoint.quantize`.

TensorRT-LLM's ``convert_checkpoint.py --use_weight_only --weight_only_precision P`` writes
``quant_algo`` ``W8A16`` (int8) or ``W4A16`` (int4), both one scale per output channel;
its grouped forms with zero points are ``W8A16_GPTQ`` and ``W4A16_GPTQ`` (``group_size``,
``has_zero_point``), which ``--per_group`` selects here (int8 per group is what GGUF's
``Q8_0``/``Q4_0``/``Q4_1`` blocks are, with groups of 32).

TensorRT-LLM keeps the LM head and the embedding table in the float dtype by default
(``exclude_modules`` lists them); ``examples/quantization/quantize.py --quantize_lm_head``
quantizes the LM head too. Here ``--quantize_lm_head`` (``QuantSpec.lm_head``) quantizes the
LM head *and* the embedding table with the projections' precision and groups (per row of the
``[vocab, hidden]`` table), so a tied model holds one quantized table for both; the
``quantization`` entry's ``exclude_modules`` then lists neither.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Mapping

from ..errors import UserError
from .layout import DENSE, FC, GATE, HF_DOWN, HF_GATE, HF_K, HF_O, HF_Q, HF_UP, HF_V, PROJ, QKV, Layout

WEIGHT_ONLY_PRECISIONS = ("int8", "int4")
DEFAULT_GROUP_SIZE = 128  # TensorRT-LLM's --group_size default
QUANT_LINEARS: tuple[str, ...] = (QKV, DENSE, FC, GATE, PROJ)  # TensorRT-LLM suffixes quantized
HF_QUANT_LINEARS: tuple[str, ...] = (HF_Q, HF_K, HF_V, HF_O, HF_GATE, HF_UP, HF_DOWN)
PER_CHANNEL_SCALE = "per_channel_scale"
GROUP_SCALE = "weights_scaling_factor"
GROUP_ZERO = "zero"
EXCLUDED_BY_DEFAULT = ("lm_head", "transformer.vocab_embedding")  # what the default writes
# TensorRT-LLM's quantize_layers (tensorrt_llm/quantization/quantize.py) applies this list when
# exclude_modules is empty or None; with --quantize_lm_head we write it less lm_head and the
# embedding (an empty list would read as the default there, so it is not written empty).
TRTLLM_DEFAULT_EXCLUDES = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                           "*shared_expert_gate")
WITH_LM_HEAD = tuple(p for p in TRTLLM_DEFAULT_EXCLUDES if p not in ("*lm_head", "*vocab_embedding"))
ALGOS = {("int8", False): "W8A16", ("int4", False): "W4A16", ("int8", True): "W8A16_GPTQ",
         ("int4", True): "W4A16_GPTQ"}


@dataclass(frozen=True)
class QuantSpec:
    """Which weight-only quantization a checkpoint holds: ``precision`` ``int8``/``int4``,
    ``group_size`` ``None`` for one scale per output channel."""

    precision: str
    group_size: int | None = None
    lm_head: bool = False  # the LM head and the embedding table quantized too (--quantize_lm_head)

    @property
    def quant_algo(self) -> str:
        return ALGOS[(self.precision, self.group_size is not None)]

    @property
    def bits(self) -> int:
        return 8 if self.precision == "int8" else 4

    def config(self) -> dict[str, Any]:
        """The checkpoint config's ``quantization`` entry (TensorRT-LLM's QuantConfig keys)."""
        return {
            "quant_algo": self.quant_algo,
            "kv_cache_quant_algo": None,
            "group_size": self.group_size if self.group_size is not None else DEFAULT_GROUP_SIZE,
            "has_zero_point": self.group_size is not None,
            "pre_quant_scale": False,
            "exclude_modules": list(WITH_LM_HEAD if self.lm_head else EXCLUDED_BY_DEFAULT),
        }

    @classmethod
    def from_config(cls, quant: Mapping[str, Any] | None) -> "QuantSpec | None":
        """The spec of a checkpoint config's ``quantization`` entry; ``None`` when unquantized.
        Raises :class:`UserError` for an algorithm this runtime cannot run."""
        quant = quant or {}
        if quant.get("kv_cache_quant_algo"):
            raise UserError(f"KV cache quantization ({quant['kv_cache_quant_algo']}) is not supported by the "
                            f"PyTorch runtime; convert without it")
        algo = quant.get("quant_algo")
        if not algo:
            return None
        # As TensorRT-LLM reads it: an empty or missing list means its default (lm_head excluded).
        excluded = quant.get("exclude_modules") or TRTLLM_DEFAULT_EXCLUDES
        lm_head = not any(fnmatchcase("lm_head", pattern) for pattern in excluded)
        for (precision, grouped), name in ALGOS.items():
            if name == algo:
                return cls(precision, int(quant.get("group_size") or DEFAULT_GROUP_SIZE) if grouped else None, lm_head)
        raise UserError(f"quant_algo {algo} is not supported by the PyTorch runtime; it runs "
                        f"{', '.join(ALGOS.values())} (convert_checkpoint.py --use_weight_only)")

    def tensor_suffixes(self) -> tuple[str, ...]:
        """The scale tensors stored beside each quantized ``weight``."""
        return (PER_CHANNEL_SCALE,) if self.group_size is None else (GROUP_SCALE, GROUP_ZERO)


def check_spec(spec: QuantSpec, layout: Layout) -> None:
    """Raise :class:`UserError` unless every quantized linear's input width (per tensor rank)
    splits into whole groups, and int4 rows into whole bytes. Pure arithmetic."""
    tp = layout.tp_size
    attention = layout.num_heads * layout.head_size
    # (what, whole input width, input columns per tensor rank) of the quantized linears:
    # qkv/fc/gate read the hidden size whole; dense and proj are split on their input.
    inputs = (("hidden size", layout.hidden_size, layout.hidden_size),
              ("attention width", attention, attention // tp),
              ("intermediate size", layout.intermediate_size, layout.intermediate_size // tp))
    g = spec.group_size
    if g is not None:
        if g < 2 or g % 2:
            raise UserError(f"--group_size must be an even number of at least 2, got {g}")
        for what, width, per_rank in inputs:
            if width % g:
                raise UserError(f"--group_size {g} does not divide the model's {what} {width}; "
                                f"choose a group size that divides it (e.g. 32 or 64)")
            if per_rank % g:
                raise UserError(f"--tp_size {tp} cuts the {spec.precision} groups: each rank holds {per_rank} columns of the "
                                f"{what} {width}, not a multiple of --group_size {g}; choose a smaller group size "
                                f"or tp_size")
    elif spec.precision == "int4":
        for what, width, per_rank in inputs:
            if per_rank % 2:
                raise UserError(f"int4 packs two columns per byte, but the {what} per rank ({per_rank}) is odd")
