"""What the LLM API's NGram decoding accepts: checks run before any TensorRT-LLM object is made."""
from __future__ import annotations

import json
from pathlib import Path

from ...drafting.base import DraftConfig
from ...errors import UserError


def check_llmapi_draft(draft: DraftConfig) -> None:
    """Raise :class:`UserError` unless ``draft`` maps onto ``NGramDecodingConfig``."""
    if draft.mode != "pool":
        raise UserError(
            f"draft mode {draft.mode!r} is implemented by the PyTorch backend only; TensorRT-LLM's "
            "NGramDecodingConfig supports the pool mode only (use --backend torch)"
        )
    extras = [
        name
        for name, on in (
            ("adaptive drafting", draft.adaptive),
            ("a static n-gram cache", draft.static_cache is not None),
            ("a dynamic n-gram cache", draft.dynamic_cache is not None),
        )
        if on
    ]
    if extras:
        raise UserError(
            f"{' and '.join(extras)} is implemented by the PyTorch backend only; "
            "TensorRT-LLM's NGramDecodingConfig has no such option (use --backend torch)"
        )
    if draft.prompt_lookup_num_tokens < 1 or draft.max_matching_ngram_size < 1:
        raise UserError(
            "NGramDecodingConfig needs prompt_lookup_num_tokens >= 1 and max_matching_ngram_size >= 1, "
            f"got {draft.prompt_lookup_num_tokens} and {draft.max_matching_ngram_size}"
        )


def check_hf_model_dir(model: str) -> None:
    """The LLM API's PyTorch backend loads a Hugging Face checkpoint, not an engine."""
    path = Path(model)
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        return  # let TensorRT-LLM resolve it (it also accepts hub names it can reach)
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and ("build_config" in data or "pretrained_config" in data):
        raise UserError(
            f"{model} is a TensorRT-LLM engine or checkpoint; V2 on TensorRT-LLM runs NGram decoding "
            "on its PyTorch backend, which loads a Hugging Face checkpoint directory (use --workflow v1 "
            "for engines)"
        )


__all__ = ["check_hf_model_dir", "check_llmapi_draft"]
