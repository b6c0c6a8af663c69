"""Read a TensorRT-LLM engine directory into the runner's :class:`TrtllmEngineConfig`."""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..runtime.trtllm.config import TrtllmEngineConfig
from .config import read_engine_config


def read_trtllm_engine_config(engine_dir: str | Path) -> TrtllmEngineConfig:
    """The runner's view of a TensorRT-LLM engine directory (the layout trtllm-build writes).

    Parsing and the completeness check (one ``rank{r}.engine`` per rank) are
    :func:`promptlookup.engine.config.read_engine_config`'s, shared with the PyTorch engine.
    """
    config = read_engine_config(engine_dir)
    if config.backend != "trtllm":
        raise UserError(
            f"{engine_dir} is a {config.backend} engine, not a TensorRT-LLM engine; "
            "build one with trtllm-build (build.sh --backend trtllm) or run it with the PyTorch backend"
        )
    mapping = config.pretrained.get("mapping") or {}
    fmha = (config.build.get("plugin_config") or {}).get("use_paged_context_fmha")
    return TrtllmEngineConfig(
        directory=Path(engine_dir),
        limits=config.limits,
        tp_size=int(mapping.get("tp_size", 1)),
        pp_size=int(mapping.get("pp_size", 1)),
        speculative_decoding_mode=config.build.get("speculative_decoding_mode"),
        use_paged_context_fmha=None if fmha is None else bool(fmha),
    )
