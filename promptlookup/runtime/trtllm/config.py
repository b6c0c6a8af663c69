"""The TensorRT-LLM runner's view of an engine directory (the layout trtllm-build writes);
:func:`promptlookup.engine.trtllm_config.read_trtllm_engine_config` reads it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import EngineLimits

_DRAFT_TOKENS_EXTERNAL = 2  # SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL (an IntFlag, 1 << 1)


@dataclass(frozen=True)
class TrtllmEngineConfig:
    """What the runner needs from a TensorRT-LLM engine's ``config.json``."""

    directory: Path
    limits: EngineLimits
    tp_size: int
    pp_size: int
    speculative_decoding_mode: Any  # int (IntFlag value) or str, None when absent
    use_paged_context_fmha: bool | None  # None when the plugin config does not say

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def is_draft_tokens_external(mode: Any) -> bool:
    """Whether a ``build_config.speculative_decoding_mode`` value (IntFlag int or name) is draft_tokens_external."""
    if isinstance(mode, bool):
        return False
    if isinstance(mode, int):
        return bool(mode & _DRAFT_TOKENS_EXTERNAL)
    return "draft_tokens_external" in str(mode).lower()


__all__ = ["TrtllmEngineConfig", "is_draft_tokens_external"]
