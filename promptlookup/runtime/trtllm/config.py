"""The TensorRT-LLM runner's view of an engine directory (the layout trtllm-build writes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import UserError
from ..base import EngineLimits

_DRAFT_TOKENS_EXTERNAL = 2  # SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL (an IntFlag, 1 << 1)


@dataclass(frozen=True)
class TrtllmEngineConfig:
    """What the runner needs from a TensorRT-LLM engine's ``config.json``."""

    limits: EngineLimits
    tp_size: int
    pp_size: int
    speculative_decoding_mode: Any  # int (IntFlag value) or str, None when absent
    use_paged_context_fmha: bool | None  # None when the plugin config does not say

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def read_trtllm_engine_config(engine_dir: str | Path) -> TrtllmEngineConfig:
    """The runner's view of a TensorRT-LLM engine directory (the layout trtllm-build writes).

    Parsing and the completeness check (one ``rank{r}.engine`` per rank) are
    :func:`promptlookup.engine.config.read_engine_config`'s, shared with the PyTorch engine.
    """
    from ...engine.config import read_engine_config

    config = read_engine_config(engine_dir)
    if config.backend != "trtllm":
        raise UserError(
            f"{engine_dir} is a {config.backend} engine, not a TensorRT-LLM engine; "
            "build one with trtllm-build (build.sh --backend trtllm) or run it with the PyTorch backend"
        )
    mapping = config.pretrained.get("mapping") or {}
    fmha = (config.build.get("plugin_config") or {}).get("use_paged_context_fmha")
    return TrtllmEngineConfig(
        limits=config.limits,
        tp_size=int(mapping.get("tp_size", 1)),
        pp_size=int(mapping.get("pp_size", 1)),
        speculative_decoding_mode=config.build.get("speculative_decoding_mode"),
        use_paged_context_fmha=None if fmha is None else bool(fmha),
    )


def is_draft_tokens_external(mode: Any) -> bool:
    """Whether a ``build_config.speculative_decoding_mode`` value (IntFlag int or name) is draft_tokens_external."""
    if isinstance(mode, bool):
        return False
    if isinstance(mode, int):
        return bool(mode & _DRAFT_TOKENS_EXTERNAL)
    return "draft_tokens_external" in str(mode).lower()


__all__ = ["TrtllmEngineConfig", "is_draft_tokens_external", "read_trtllm_engine_config"]
