"""The checkpoint ``config.json``: Hugging Face ``LlamaConfig`` <-> TensorRT-LLM dict.

:func:`checkpoint_config` writes the keys TensorRT-LLM's ``LLaMAConfig.to_dict`` produces
for a plain (unquantized) Llama, so ``trtllm-build --checkpoint_dir`` accepts the result;
:func:`llama_config_from_checkpoint` is its inverse for the PyTorch runtime. The round trip
``llama_config_from_checkpoint(checkpoint_config(c, ...))`` preserves every field that
affects the forward pass (sizes, head layout, norm epsilon, RoPE base and scaling, tied
embeddings) and the special token ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import UserError, one_line
from .layout import Layout
from .quant_spec import QuantSpec, check_spec

if TYPE_CHECKING:  # torch and transformers are imported lazily: the CLI validates without them
    import torch
    from transformers import LlamaConfig, PretrainedConfig


def read_json_object(path: Path) -> dict:
    """``path`` parsed as a JSON object; unreadable or non-object content is a UserError."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} is not a JSON object")
    return raw


ARCHITECTURE = "LlamaForCausalLM"
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_CHOICES = ("auto", *DTYPES)
CHECKPOINT_KIND = "checkpoint"  # the kind in a converted checkpoint's output manifest (promptlookup.fsutil)

_REQUIRED_KEYS = ("architecture", "dtype", "vocab_size", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads")


def torch_dtype(name: str) -> torch.dtype:
    """``"float16"`` -> ``torch.float16`` for the supported names."""
    import torch

    if name not in DTYPES:
        raise UserError(f"unsupported dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return getattr(torch, name)


def resolve_dtype(requested: str, source: torch.dtype | str | None) -> str:
    """TensorRT-LLM's ``auto``: keep the source dtype, but store float32 sources as float16."""
    if requested not in DTYPE_CHOICES:
        raise UserError(f"unsupported dtype {requested!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    if requested != "auto":
        return requested
    name = str(source).removeprefix("torch.") if source is not None else "float32"
    return "float16" if name not in ("float16", "bfloat16") else name


def rope_of(model_config: PretrainedConfig) -> tuple[float, dict[str, Any] | None]:
    """``(rotary_base, rotary_scaling)`` from a HF config (transformers 5 or older)."""
    params = dict(getattr(model_config, "rope_parameters", None) or {})
    legacy = getattr(model_config, "rope_scaling", None)
    if not params and isinstance(legacy, dict):
        params = dict(legacy)
    base = float(params.pop("rope_theta", getattr(model_config, "rope_theta", 10000.0) or 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default") or not params:
        return base, None
    params.setdefault("rope_type", kind)
    return base, params


def checkpoint_config(model_config: PretrainedConfig, dtype: str, tp_size: int = 1, pp_size: int = 1,
                      quant: QuantSpec | None = None) -> dict:
    """The TensorRT-LLM checkpoint config for a HF Llama config (validated).

    ``dtype`` is the storage dtype of the rank files (``auto`` resolves against the config's
    own dtype). ``quant``: weight-only quantization of the projections (written as
    TensorRT-LLM's ``quantization`` entry). Raises :class:`UserError` for non-Llama configs,
    for ``tp_size`` / ``pp_size`` values the model cannot be split by, and for a group size
    the model's widths (per rank) do not divide.
    """
    model_type = getattr(model_config, "model_type", None)
    if model_type != "llama":
        raise UserError(f"model_type {model_type!r} is not supported; only Llama (model_type 'llama') "
                        f"checkpoints can be converted")
    if getattr(model_config, "attention_bias", False) or getattr(model_config, "mlp_bias", False):
        raise UserError("Llama variants with attention or MLP biases are not supported")
    dtype = resolve_dtype(dtype, getattr(model_config, "dtype", None))
    heads = model_config.num_attention_heads
    head_size = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    rotary_base, rotary_scaling = rope_of(model_config)
    cfg: dict[str, Any] = {
        "architecture": ARCHITECTURE,
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": model_config.vocab_size,
        "hidden_size": model_config.hidden_size,
        "intermediate_size": model_config.intermediate_size,
        "num_hidden_layers": model_config.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(model_config, "num_key_value_heads", None) or heads,
        "head_size": head_size,
        "hidden_act": getattr(model_config, "hidden_act", "silu"),
        "norm_epsilon": model_config.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": rotary_base,
        "rotary_scaling": rotary_scaling,
        "max_position_embeddings": model_config.max_position_embeddings,
        "tie_word_embeddings": bool(getattr(model_config, "tie_word_embeddings", False)),
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "mlp_bias": False,
        "attn_bias": False,
        "mapping": {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size},
        "quantization": quant.config() if quant is not None else {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(model_config, key, None)
        if value is not None:
            cfg[key] = value
    layout = Layout.from_config(cfg)  # raises UserError for impossible tp/pp splits
    if quant is not None:
        check_spec(quant, layout)
    return cfg


def unwrap_config(cfg: Mapping[str, Any]) -> dict:
    """The checkpoint config inside an engine config (``pretrained_config``), or ``cfg``."""
    inner = cfg.get("pretrained_config")
    return dict(inner if isinstance(inner, Mapping) else cfg)


def read_checkpoint_config(directory: str | Path) -> dict:
    """The checkpoint config of a checkpoint or engine directory (``pretrained_config`` unwrapped)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint directory {directory} does not exist; create it with convert_checkpoint.py")
    path = directory / "config.json"
    if not path.is_file():
        raise UserError(f"{directory} is not a TensorRT-LLM checkpoint (no config.json); "
                        f"create one with convert_checkpoint.py")
    return unwrap_config(read_json_object(path))


def quant_spec_of(cfg: Mapping[str, Any]) -> QuantSpec | None:
    """The weight-only quantization of a checkpoint or engine config (``None``: unquantized)."""
    return QuantSpec.from_config(unwrap_config(cfg).get("quantization"))


def validate_checkpoint_config(cfg: Mapping[str, Any]) -> Layout:
    """Check a checkpoint config can be loaded by the PyTorch runtime; return its layout."""
    missing = [k for k in _REQUIRED_KEYS if k not in cfg]
    if missing:
        raise UserError(f"checkpoint config.json lacks {', '.join(missing)}; it was not written by convert_checkpoint.py")
    if cfg["architecture"] != ARCHITECTURE:
        raise UserError(f"checkpoint architecture {cfg['architecture']!r} is not supported; only {ARCHITECTURE} is")
    QuantSpec.from_config(cfg.get("quantization"))  # raises for what the runtime cannot run
    if cfg.get("use_parallel_embedding"):
        raise UserError("checkpoints with use_parallel_embedding are not supported; convert with convert_checkpoint.py")
    try:
        return Layout.from_config(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"checkpoint config.json is malformed ({exc!r})") from None


def llama_config_from_checkpoint(cfg: Mapping[str, Any]) -> LlamaConfig:
    """The HF ``LlamaConfig`` describing the same model as a checkpoint config."""
    from transformers import LlamaConfig

    cfg = unwrap_config(cfg)
    layout = validate_checkpoint_config(cfg)
    rope: dict[str, Any] = dict(cfg.get("rotary_scaling") or {})
    if rope:
        rope["rope_type"] = rope.pop("type", None) or rope.get("rope_type", "default")
    else:
        rope = {"rope_type": "default"}
    rope["rope_theta"] = float(cfg.get("rotary_base", 10000.0))
    extra = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    return LlamaConfig(
        vocab_size=layout.vocab_size,
        hidden_size=layout.hidden_size,
        intermediate_size=layout.intermediate_size,
        num_hidden_layers=layout.num_layers,
        num_attention_heads=layout.num_heads,
        num_key_value_heads=layout.num_kv_heads,
        head_dim=layout.head_size,
        hidden_act=cfg.get("hidden_act", "silu"),
        rms_norm_eps=float(cfg.get("norm_epsilon", 1e-5)),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
        rope_parameters=rope,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=False,
        mlp_bias=False,
        architectures=[ARCHITECTURE],
        **extra,
    )
