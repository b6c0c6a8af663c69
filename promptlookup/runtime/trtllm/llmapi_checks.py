"""Checks run before any TensorRT-LLM LLM-API object is made: the draft settings and the model directory."""
from __future__ import annotations

from typing import TYPE_CHECKING

import json
from pathlib import Path

from ...drafting.base import DraftConfig
from ...errors import UserError

if TYPE_CHECKING:
    from .releases import Release
    from .spec_plan import SpecPlan


def check_llmapi_draft(draft: DraftConfig, release: "Release | None" = None) -> "SpecPlan":
    """The speculative config ``draft`` runs as on ``release`` (default: the targeted 1.0), or
    a one-line :class:`UserError` when no route keeps every setting (:func:`.spec_plan.plan_speculation`)."""
    from .env import TARGET_VERSION
    from .releases import Release
    from .spec_plan import plan_speculation

    return plan_speculation(draft, None, release or Release(TARGET_VERSION))


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
