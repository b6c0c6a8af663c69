"""Runners for built engines: PyTorch (paged KV cache with reuse) or TensorRT-LLM.

Loading an engine directory into a runner is the engine layer's job
(:func:`promptlookup.engine.load.load_runner`): this package never imports ``engine``.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError, one_line
from .base import EngineLimits, GenerationOutput, Runner, SamplingConfig

__all__ = ["load_tokenizer", "Runner", "SamplingConfig", "EngineLimits", "GenerationOutput"]


def load_tokenizer(path: str | os.PathLike[str]):
    """The tokenizer saved in a checkpoint or engine directory (or any HF tokenizer dir)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.is_dir():
        raise UserError(f"tokenizer directory {p} does not exist; pass --tokenizer_dir")
    try:
        return AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a tokenizer from {p} ({one_line(exc)}); pass --tokenizer_dir") from None
