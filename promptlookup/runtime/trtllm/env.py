"""Whether the TensorRT-LLM backend can run here: TensorRT-LLM importable, and a GPU good enough.

Nothing here imports ``tensorrt_llm`` at module import time. :func:`trtllm_unavailable_reason`
imports it (seconds) and asks PyTorch for the visible GPUs; every entry point of the
backend calls :func:`require_trtllm` before it touches a real TensorRT-LLM class.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from ...errors import UserError

TARGET_VERSION = "1.0"
MIN_COMPUTE_CAPABILITY = (8, 0)  # prompt lookup support matrix: Ampere or newer
_FIX = "use --backend torch, or run on a machine with TensorRT-LLM and an Ampere-or-newer GPU"


def _import_problem() -> str | None:
    """Why ``import tensorrt_llm`` does not work here, or None when it does."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return "tensorrt_llm is not installed"
    try:
        importlib.import_module("tensorrt_llm")
    except Exception as exc:  # a broken install raises all sorts of errors
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"tensorrt_llm failed to import ({type(exc).__name__}: {first})"
    return None


def _gpu_problem() -> str | None:
    """Why no CUDA GPU of compute capability >= 8.0 is usable, or None when one is."""
    try:
        import torch
    except Exception:
        return "PyTorch is not importable, so no CUDA GPU can be found"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    best = max(
        (torch.cuda.get_device_capability(i), i) for i in range(torch.cuda.device_count())
    )
    if best[0] < MIN_COMPUTE_CAPABILITY:
        major, minor = best[0]
        return (
            f"the best visible GPU ({torch.cuda.get_device_name(best[1])}) has compute capability "
            f"{major}.{minor}; TensorRT-LLM prompt lookup needs 8.0 (Ampere) or newer"
        )
    return None


def trtllm_unavailable_reason() -> str | None:
    """One line saying why the TensorRT-LLM backend cannot run here, or None when it can.

    It can run when ``import tensorrt_llm`` succeeds and a CUDA GPU of compute capability
    8.0 or newer is visible. Importing TensorRT-LLM is slow (seconds), so callers should
    ask once per process.
    """
    problem = _import_problem() or _gpu_problem()
    return None if problem is None else f"{problem}; {_FIX}"


def require_trtllm() -> None:
    """Raise the one-line :class:`UserError` of :func:`trtllm_unavailable_reason`, if any."""
    reason = trtllm_unavailable_reason()
    if reason is not None:
        raise UserError(reason)


def lazy(module: str, name: str) -> Any:
    """``module.name``, imported now (call only after :func:`require_trtllm`)."""
    return getattr(importlib.import_module(module), name)


__all__ = ["MIN_COMPUTE_CAPABILITY", "TARGET_VERSION", "lazy", "require_trtllm", "trtllm_unavailable_reason"]
