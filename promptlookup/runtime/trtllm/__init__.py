"""The TensorRT-LLM backend: a thin adapter over TensorRT-LLM's public Python API.

Version-aware: :func:`.releases.installed_release` reads ``tensorrt_llm.__version__`` once and
:data:`.releases.CAPABILITIES` says which release range has each feature used here (the
engine workflow before 1.3, the PyTorch LLM API, ``SADecodingConfig`` and
``draft_len_schedule`` from 1.3, ``UserProvidedDecodingConfig`` from 1.0, ...); anything the
installed release lacks is a one-line :class:`UserError`. Classes injected without a
release (tests) are taken as :data:`TARGET_VERSION` (1.0).

One module per job:

- :mod:`.env`: can TensorRT-LLM run here (:func:`trtllm_unavailable_reason`).
- :mod:`.releases`: the installed release and the capability table.
- :mod:`.config`: the runner's view of an engine directory (read by
  :func:`promptlookup.engine.trtllm_config.read_trtllm_engine_config`).
- :mod:`.v1`: **V1** (:class:`TrtllmRunner`), ``ModelRunnerCpp`` in orchestrator mode with
  external drafts; implements :class:`promptlookup.runtime.base.Runner`.
- :mod:`.llmapi_checks`: the model directory check and :func:`check_llmapi_draft`.
- :mod:`.spec_plan`: which speculative config runs a draft setting, or the refusal.
- :mod:`.user_drafter`: this project's drafters as a TensorRT-LLM ``Drafter``.
- :mod:`.v2`: **V2** (:class:`TrtllmLookupGenerator`), the LLM API, drafting inside TensorRT-LLM.

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
from .releases import CAPABILITIES, Release, installed_release
from .spec_plan import SpecPlan, plan_speculation
from .v1 import TrtllmRunner
from .v2 import TrtllmLookupGenerator

__all__ = [
    "CAPABILITIES",
    "Release",
    "SpecPlan",
    "TARGET_VERSION",
    "TrtllmEngineConfig",
    "TrtllmLookupGenerator",
    "TrtllmRunner",
    "check_llmapi_draft",
    "installed_release",
    "plan_speculation",
    "trtllm_unavailable_reason",
]
