"""The TensorRT-LLM backend: a thin adapter over TensorRT-LLM's public Python API.

Targets **TensorRT-LLM 1.0** (the first release that has both paths below; in 0.1x
releases the V1 example was ``examples/prompt_lookup/run_dtm_pld.py`` with
``--prompt_lookup_config``, in 1.0 it is ``examples/ngram/run_dtm_ngram.py`` with
``--ngram_config``; the runtime calls used here are the same in both).

One module per job:

- :mod:`.env`: can TensorRT-LLM run here (:func:`trtllm_unavailable_reason`).
- :mod:`.config`: the runner's view of an engine directory (read by
  :func:`promptlookup.engine.trtllm_config.read_trtllm_engine_config`).
- :mod:`.v1`: **V1** (:class:`TrtllmRunner`), ``ModelRunnerCpp`` in orchestrator mode with
  external drafts; implements :class:`promptlookup.runtime.base.Runner`.
- :mod:`.llmapi_checks`: what the LLM API's NGram decoding accepts (:func:`check_llmapi_draft`).
- :mod:`.v2`: **V2** (:class:`TrtllmLookupGenerator`), the LLM API with
  ``NGramDecodingConfig``, drafting inside TensorRT-LLM.

Nothing here imports ``tensorrt_llm`` at module import time; every entry point first checks
:func:`trtllm_unavailable_reason` and raises a one-line :class:`UserError` when TensorRT-LLM
or a suitable GPU is missing. All TensorRT-LLM classes are injectable, which is how the
tests exercise the argument and output mapping without a GPU. This package is **not run
against a real GPU in CI**.
"""
from __future__ import annotations

from .config import TrtllmEngineConfig
from .env import TARGET_VERSION, trtllm_unavailable_reason
from .llmapi_checks import check_llmapi_draft
from .v1 import TrtllmRunner
from .v2 import TrtllmLookupGenerator

__all__ = [
    "TARGET_VERSION",
    "TrtllmEngineConfig",
    "TrtllmLookupGenerator",
    "TrtllmRunner",
    "check_llmapi_draft",
    "trtllm_unavailable_reason",
]
