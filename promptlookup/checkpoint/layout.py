"""TensorRT-LLM's Llama checkpoint layout: tensor names, geometry and the parallel mapping.

Pure Python (no torch), so command-line validation is instant. The tensor operations that
split and merge weights live in :mod:`promptlookup.checkpoint.sharding`; this module says
WHAT goes WHERE:

* ``rank = pp_rank * tp_size + tp_rank``; ``world_size = tp_size * pp_size`` (TensorRT-LLM's
  ``Mapping``).
* Pipeline stage ``p`` holds a contiguous run of decoder layers, split like
  ``torch.tensor_split(range(num_layers), pp_size)`` (``Mapping.pp_layers``): the first
  ``num_layers % pp_size`` stages get one extra layer. Inside a rank file, layers use
  LOCAL indices starting at 0.
* Column-parallel weights (``attention.qkv``, ``mlp.fc``, ``mlp.gate``, ``lm_head``) are
  split on dim 0 (output features), row-parallel ones (``attention.dense``, ``mlp.proj``)
  on dim 1 (input features); norms are replicated.
* ``attention.qkv`` on tensor rank ``r`` is ``[q_r; k_r; v_r]`` (rows). When
  ``num_key_value_heads < tp_size`` each K/V head is repeated
  ``tp_size // num_key_value_heads`` times first, so every rank owns exactly one K/V head
  (rank ``r`` holds head ``r // repeats``).
* ``transformer.vocab_embedding.weight`` is stored whole (unpadded, not split) on every
  tensor rank of the first stage; ``transformer.ln_f.weight`` and ``lm_head.weight`` live
  on the last stage, ``lm_head`` padded with zero rows to a multiple of ``tp_size`` and
  split on dim 0. ``lm_head.weight`` is written even when the embeddings are tied.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping as MappingT

from ..errors import UserError

EMBEDDING = "transformer.vocab_embedding.weight"
FINAL_NORM = "transformer.ln_f.weight"
LM_HEAD = "lm_head.weight"

# TensorRT-LLM per-layer names (under ``transformer.layers.{local_index}.``).
QKV = "attention.qkv.weight"
DENSE = "attention.dense.weight"
FC = "mlp.fc.weight"  # Hugging Face gate_proj (the SiLU-activated branch)
GATE = "mlp.gate.weight"  # Hugging Face up_proj (the multiplicative branch)
PROJ = "mlp.proj.weight"  # Hugging Face down_proj
INPUT_NORM = "input_layernorm.weight"
POST_NORM = "post_layernorm.weight"

# Hugging Face per-layer names (under ``model.layers.{index}.``).
HF_Q, HF_K, HF_V = "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"
HF_O = "self_attn.o_proj.weight"
HF_GATE, HF_UP, HF_DOWN = "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"
HF_INPUT_NORM, HF_POST_NORM = "input_layernorm.weight", "post_attention_layernorm.weight"
HF_EMBEDDING, HF_FINAL_NORM, HF_LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"

# Weights other than q/k/v and how they are sharded: TRT suffix -> (HF suffix, split dim;
# 0 = column parallel, 1 = row parallel, None = replicated).
SIMPLE_LAYER_WEIGHTS: dict[str, tuple[str, int | None]] = {
    DENSE: (HF_O, 1),
    FC: (HF_GATE, 0),
    GATE: (HF_UP, 0),
    PROJ: (HF_DOWN, 1),
    INPUT_NORM: (HF_INPUT_NORM, None),
    POST_NORM: (HF_POST_NORM, None),
}
LAYER_WEIGHTS: tuple[str, ...] = (QKV, *SIMPLE_LAYER_WEIGHTS)
HF_LAYER_WEIGHTS: tuple[str, ...] = (HF_Q, HF_K, HF_V, *(hf for hf, _ in SIMPLE_LAYER_WEIGHTS.values()))


def layer_name(local_index: int, suffix: str) -> str:
    """The TensorRT-LLM name of a per-layer tensor in a rank file."""
    return f"transformer.layers.{local_index}.{suffix}"


def hf_layer_name(index: int, suffix: str) -> str:
    """The Hugging Face name of a per-layer tensor."""
    return f"model.layers.{index}.{suffix}"


def rank_file(rank: int) -> str:
    return f"rank{rank}.safetensors"


@dataclass(frozen=True)
class Layout:
    """Model geometry plus the parallel mapping: everything sharding depends on."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tp_size: int = 1
    pp_size: int = 1

    @classmethod
    def from_config(cls, cfg: MappingT) -> "Layout":
        """Build from a TensorRT-LLM checkpoint config dict (validated)."""
        mapping = cfg.get("mapping") or {}
        layout = cls(
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            num_kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            head_size=int(cfg.get("head_size") or cfg["hidden_size"] // cfg["num_attention_heads"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            tp_size=int(mapping.get("tp_size", 1)),
            pp_size=int(mapping.get("pp_size", 1)),
        )
        layout.validate()
        return layout

    @classmethod
    def from_hf_config(cls, raw: MappingT[str, Any], tp_size: int = 1, pp_size: int = 1) -> "Layout":
        """Build from a Hugging Face Llama ``config.json`` dict (validated)."""
        missing = [k for k in ("num_hidden_layers", "num_attention_heads", "hidden_size",
                               "intermediate_size", "vocab_size") if not isinstance(raw.get(k), int)]
        if missing:
            raise UserError(f"config.json lacks integer {', '.join(missing)}; it is not a complete Llama config")
        heads = raw["num_attention_heads"]
        layout = cls(
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_size=raw.get("head_dim") or raw["hidden_size"] // max(heads, 1),
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            tp_size=tp_size,
            pp_size=pp_size,
        )
        layout.validate()
        return layout

    # --- the parallel mapping -------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        return pp_rank * self.tp_size + tp_rank

    def coords(self, rank: int) -> tuple[int, int]:
        """``(tp_rank, pp_rank)`` of a global rank."""
        return rank % self.tp_size, rank // self.tp_size

    def pp_layers(self, pp_rank: int) -> range:
        """Global indices of the layers held by pipeline stage ``pp_rank``."""
        base, extra = divmod(self.num_layers, self.pp_size)
        start = pp_rank * base + min(pp_rank, extra)
        return range(start, start + base + (1 if pp_rank < extra else 0))

    def is_first_stage(self, pp_rank: int) -> bool:
        return pp_rank == 0

    def is_last_stage(self, pp_rank: int) -> bool:
        return pp_rank == self.pp_size - 1

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.tp_size) * self.tp_size

    @property
    def kv_repeats(self) -> int:
        """How many tensor ranks share (a copy of) each K/V head; 1 without duplication."""
        return max(1, self.tp_size // self.num_kv_heads)

    def validate(self) -> None:
        """Raise :class:`UserError` unless this geometry can be sharded this way."""
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_size", "hidden_size",
                     "intermediate_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise UserError(f"invalid model config: {name} = {getattr(self, name)} must be positive")
        if self.tp_size < 1 or self.pp_size < 1:
            raise UserError(f"tp_size and pp_size must be at least 1, got tp_size={self.tp_size}, pp_size={self.pp_size}")
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"invalid model config: {self.num_heads} attention heads are not a multiple "
                            f"of {self.num_kv_heads} key/value heads")
        if self.num_heads % self.tp_size:
            raise UserError(f"tp_size {self.tp_size} does not divide the model's {self.num_heads} attention heads; "
                            f"choose a tp_size that divides {self.num_heads}")
        if self.num_kv_heads % self.tp_size and self.tp_size % self.num_kv_heads:
            raise UserError(f"tp_size {self.tp_size} and the model's {self.num_kv_heads} key/value heads must divide "
                            f"one another; choose another tp_size")
        if self.intermediate_size % self.tp_size:
            raise UserError(f"tp_size {self.tp_size} does not divide the MLP intermediate size {self.intermediate_size}")
        if self.pp_size > self.num_layers:
            raise UserError(f"pp_size {self.pp_size} is larger than the model's {self.num_layers} layers")


def expected_shapes(layout: Layout, tp_rank: int, pp_rank: int) -> dict[str, tuple[int, ...]]:
    """Every tensor name in one rank file with its shape (for validation and tests)."""
    tp = layout.tp_size
    kv_rows = max(1, layout.num_kv_heads // tp) * layout.head_size
    q_rows = layout.num_heads // tp * layout.head_size
    h, i = layout.hidden_size, layout.intermediate_size
    per_layer = {
        QKV: (q_rows + 2 * kv_rows, h),
        DENSE: (h, q_rows),
        FC: (i // tp, h),
        GATE: (i // tp, h),
        PROJ: (h, i // tp),
        INPUT_NORM: (h,),
        POST_NORM: (h,),
    }
    shapes = {layer_name(local, suffix): shape
              for local in range(len(layout.pp_layers(pp_rank)))
              for suffix, shape in per_layer.items()}
    if layout.is_first_stage(pp_rank):
        shapes[EMBEDDING] = (layout.vocab_size, h)
    if layout.is_last_stage(pp_rank):
        shapes[FINAL_NORM] = (h,)
        shapes[LM_HEAD] = (layout.padded_vocab_size // tp, h)
    return shapes
