"""Former home of the TensorRT-LLM backend, kept so that existing imports keep working.

The backend now lives in :mod:`promptlookup.runtime.trtllm`, one module per job; import
from there. The engine-config reader is :func:`read_trtllm_engine_config` (it was
``read_engine_config``, a name it shared with :func:`promptlookup.engine.config.read_engine_config`).
"""
from __future__ import annotations

from .trtllm import *  # noqa: F401,F403  (the package's public names)
from .trtllm import __all__  # noqa: F401
