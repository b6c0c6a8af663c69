"""Loading the model to convert: a Hugging Face Llama directory or a GGUF file.

Everything a user can get wrong is checked here and reported as a one-line
:class:`UserError` before (or instead of) a long load: a missing or empty directory, a
non-Llama ``config.json``, missing weight files, a file that is not GGUF, a truncated or
corrupt GGUF. Nothing is ever fetched from a model hub (``local_files_only``).

GGUF weights are dequantized to float32: by :func:`~.gguf_blocks.float_state_from_gguf`
(F32/F16/BF16 and the Q4_0/Q4_1/Q8_0 blocks, bitwise transformers' values, in a few seconds)
or, for a file with other formats, by transformers' GGUF loader (which parses the file once
more and maps names tensor by tensor: about 30 s for SmolLM2 here); the config and the
tokenizer always come from transformers. The returned model is a plain ``LlamaForCausalLM``
(a GGUF quantizer is detached, so ``save_pretrained`` works).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError, one_line
from .config import DTYPE_CHOICES, read_json_object, torch_dtype

if TYPE_CHECKING:  # heavy imports happen only when a model is actually loaded
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
_GGUF_MAGIC = b"GGUF"


def check_model_dir(model_dir: str | Path) -> dict[str, Any]:
    """Validate a HF Llama directory without loading anything heavy; return its raw config.

    Checks: it exists, is a directory, has a JSON ``config.json`` with ``model_type``
    ``llama``, no biases and no ``quantization_config``, and at least one weight file.
    O(config size), no torch import.
    """
    path = Path(model_dir)
    if not path.exists():
        raise UserError(f"model directory {path} does not exist; pass a Hugging Face Llama directory to --model_dir")
    if not path.is_dir():
        raise UserError(f"--model_dir {path} is not a directory (for a GGUF file use --gguf_file)")
    config_file = path / "config.json"
    if not config_file.is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if ggufs:
            raise UserError(f"model directory {path} has no config.json but holds a GGUF file; convert it with "
                            f"--gguf_file {ggufs[0]} instead of --model_dir")
        what = "is empty" if not any(path.iterdir()) else "has no config.json"
        raise UserError(f"model directory {path} {what}; expected a Hugging Face Llama checkpoint "
                        f"(config.json plus *.safetensors or *.bin weights)")
    raw = read_json_object(config_file)
    model_type = raw.get("model_type")
    if model_type is None and "mapping" in raw and "architecture" in raw:
        raise UserError(f"{path} is already a converted TensorRT-LLM checkpoint, not a Hugging Face model; "
                        f"build an engine from it with build.sh --checkpoint_dir {path}")
    if model_type is None and "build_config" in raw and "pretrained_config" in raw:
        raise UserError(f"{path} is a built engine, not a Hugging Face model; pass it to run.py --engine_dir")
    if model_type != "llama":
        raise UserError(f"{config_file} has model_type {model_type!r}; only Llama (model_type 'llama') "
                        f"checkpoints can be converted")
    biases = [key for key in ("attention_bias", "mlp_bias") if raw.get(key)]
    if biases:
        raise UserError(f"{config_file} sets {' and '.join(biases)}; Llama variants with attention or MLP biases "
                        f"are not supported (the checkpoint layout has no bias tensors)")
    quantized = raw.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method", "unknown") if isinstance(quantized, dict) else "unknown"
        raise UserError(f"{config_file} describes a pre-quantized model (quantization_config, quant_method "
                        f"{method!r}), which cannot be converted; convert the float model, with --use_weight_only "
                        f"for int8/int4 weights")
    if not any(f for pattern in _WEIGHT_PATTERNS for f in path.glob(pattern)):
        raise UserError(f"model directory {path} has no weights (*.safetensors or *.bin)")
    return raw


def inspect_model_dir(model_dir: str | Path) -> LlamaConfig:
    """:func:`check_model_dir`, then parse the config with transformers."""
    from transformers import LlamaConfig

    check_model_dir(model_dir)
    path = Path(model_dir)
    config_file = path / "config.json"
    try:
        return LlamaConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises several types for a bad config
        raise UserError(f"cannot parse {config_file}: {one_line(exc)}") from None


def _load_dtype(dtype: str) -> torch.dtype | str:
    if dtype not in DTYPE_CHOICES:
        raise UserError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return "auto" if dtype == "auto" else torch_dtype(dtype)


def _check_loading_info(model_dir: Path, config: LlamaConfig, info: dict[str, Any]) -> None:
    """The weights are exactly the Llama of ``config``: none missing (a tied LM head aside),
    none of another shape, none left over (transformers would silently drop them)."""
    missing = [k for k in info.get("missing_keys", ()) if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing:
        raise UserError(f"the weights in {model_dir} are incomplete: missing {len(missing)} tensors "
                        f"(e.g. {sorted(missing)[0]})")
    mismatched = sorted(info.get("mismatched_keys", ()))
    if mismatched:
        name, stored, expected = mismatched[0]
        raise UserError(f"the weights in {model_dir} do not match its config.json: {len(mismatched)} tensors have "
                        f"another shape (e.g. {name}: {tuple(stored)} stored, {tuple(expected)} expected)")
    unexpected = sorted(info.get("unexpected_keys", ()))
    if unexpected:
        raise UserError(f"the weights in {model_dir} hold {len(unexpected)} tensors a Llama of its config.json does "
                        f"not have (e.g. {unexpected[0]}), which the conversion would drop; it is not a plain Llama")


def _load_hf_dir(model_dir: Path, dtype: str) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase | None]:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    config = inspect_model_dir(model_dir)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its multi-line load report; _check_loading_info says it in one line
    try:
        model, info = LlamaForCausalLM.from_pretrained(
            model_dir, config=config, dtype=_load_dtype(dtype), local_files_only=True, output_loading_info=True,
            ignore_mismatched_sizes=True)
    except Exception as exc:  # corrupt weight files
        raise UserError(f"cannot load the weights in {model_dir}: {one_line(exc)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _check_loading_info(model_dir, config, info)
    tokenizer = None
    if any((model_dir / name).is_file() for name in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except Exception as exc:
            raise UserError(f"cannot load the tokenizer in {model_dir}: {one_line(exc)}") from None
    return model.eval(), tokenizer


def check_gguf_file(gguf_file: Path) -> None:
    """The file exists and starts with the GGUF magic (O(1), no torch import)."""
    if not gguf_file.exists():
        raise UserError(f"GGUF file {gguf_file} does not exist")
    if not gguf_file.is_file():
        raise UserError(f"--gguf_file {gguf_file} is not a file (for a Hugging Face directory use --model_dir)")
    try:
        with gguf_file.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise UserError(f"cannot read GGUF file {gguf_file}: {exc.strerror}") from None
    if magic != _GGUF_MAGIC:
        raise UserError(f"{gguf_file} is not a GGUF file (it does not start with the GGUF magic bytes)")


def _load_gguf(gguf_file: Path, dtype: str) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    check_gguf_file(gguf_file)
    load_dtype = _load_dtype(dtype)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    from .gguf_blocks import float_state_from_gguf

    folder, name = str(gguf_file.resolve().parent), gguf_file.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as exc:  # gguf raises ValueError/struct/numpy errors for damaged files
        raise UserError(f"cannot read GGUF file {gguf_file}; it is corrupt, truncated or unsupported "
                        f"({one_line(exc)})") from None
    if config.model_type != "llama":
        raise UserError(f"GGUF file {gguf_file} holds a {config.model_type!r} model; only Llama models "
                        f"can be converted")
    state = float_state_from_gguf(gguf_file, config)
    if state is not None:
        model = _llama_from_state(config, state, gguf_file)
    else:  # a format gguf_blocks does not read: transformers dequantizes
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                         local_files_only=True)
        except Exception as exc:
            raise UserError(f"cannot read GGUF file {gguf_file}; it is corrupt, truncated or unsupported "
                            f"({one_line(exc)})") from None
        assert isinstance(model, LlamaForCausalLM)
    # No GGUF quantizer: the weights are already dequantized, and save_pretrained (and
    # anything else that inspects the config) must see a plain Llama.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    if load_dtype != "auto" and load_dtype != torch.float32:
        model = model.to(load_dtype)
        model.config.dtype = load_dtype
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as exc:
        raise UserError(f"cannot read the tokenizer from GGUF file {gguf_file}: {one_line(exc)}") from None
    return model.eval(), tokenizer


def _llama_from_state(config: LlamaConfig, state: dict[str, torch.Tensor], gguf_file: Path) -> LlamaForCausalLM:
    """A float32 Llama of ``config`` holding ``state`` (its LM head tied to the embedding
    where the config says so and the file has none)."""
    import torch

    from .load import empty_llama

    config.dtype = torch.float32
    model = empty_llama(config)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)  # no second copy
    except RuntimeError as exc:  # a tensor of another shape than the metadata gives
        raise UserError(f"GGUF file {gguf_file} does not match its own metadata: {one_line(exc)}") from None
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise UserError(f"GGUF file {gguf_file} does not hold a complete Llama of its metadata's shape "
                        f"(missing {sorted(missing)[:1]}, unexpected {sorted(unexpected)[:1]})")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def load_source_model(
    model_dir: str | None = None, gguf_file: str | None = None, dtype: str = "auto"
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase | None]:
    """Load a Llama from exactly one of ``model_dir`` / ``gguf_file`` on CPU, in eval mode.

    ``dtype``: ``auto`` keeps the stored dtype (float32 for GGUF, which is dequantized),
    otherwise the weights are cast. The tokenizer is ``None`` only for a model directory
    that contains no tokenizer files.
    """
    if (model_dir is None) == (gguf_file is None):
        raise UserError("give exactly one of --model_dir (a Hugging Face Llama directory) or --gguf_file")
    if model_dir is not None:
        return _load_hf_dir(Path(model_dir), dtype)
    return _load_gguf(Path(gguf_file), dtype)
