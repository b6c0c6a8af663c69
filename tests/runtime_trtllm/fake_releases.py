"""Fake ``tensorrt_llm`` packages for two releases: the 1.0 era and current main.

The speculative and KV-cache config classes are pydantic models with ``extra="forbid"`` (as
upstream's ``StrictBaseModel``), so a renamed or unknown keyword fails here as it would
there. Field names, defaults and the checks that matter to the adapter are transcribed from
NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``:

- **1.0 era**: the ``DecodingBaseConfig`` fields recorded in :mod:`.signatures` (1.0.0rc4 era,
  commits named there): ``max_draft_len``, ``max_total_draft_tokens``, ``speculative_model_dir``,
  ``max_concurrency``, ``load_format``; ``NGramDecodingConfig`` (``max_matching_ngram_size=2``,
  ``is_keep_all``, ``is_use_oldest``, ``is_public_pool``; ``supports_backend``: PyTorch only);
  ``LookaheadDecodingConfig`` (``supports_backend``: ``backend not in ("pytorch",
  "_autodeploy")``); ``UserProvidedDecodingConfig(drafter, resource_manager)``;
  ``AutoDecodingConfig``. No ``SADecodingConfig``, no ``draft_len_schedule``. The engine
  workflow is there: ``tensorrt_llm.runtime.ModelRunnerCpp`` and the TensorRT-engine
  ``tensorrt_llm._tensorrt_engine.LLM``. ``Drafter.__init__(max_concurrency=None)``
  (``tensorrt_llm/_torch/speculative/drafter.py`` at 1ff19bbc84ada7b622731385652b5d9ce82c21c5).
- **main**: ``llm_args.py`` at 0004396720054fd8e205cbf616f21f0b57c6b412: ``DecodingBaseConfig``
  gains ``draft_len_schedule`` (mutually exclusive with ``max_concurrency``; the smallest key
  must map to ``max_draft_len``), ``acceptance_rate_window_size``,
  ``acceptance_rate_threshold``, ``use_rejection_sampling``, ``allow_advanced_sampling``,
  ``advanced_sampling_mode``, ``enable_penalty``; ``speculative_model`` replaces
  ``speculative_model_dir``; every config has a ``decoding_type`` literal; ``SADecodingConfig``
  (``max_matching_ngram_size=-1``, ``enable_global_pool``, ``global_pool_size``);
  ``LookaheadDecodingConfig`` is gone from ``SpeculativeConfig``, and so are
  ``ModelRunnerCpp`` and ``tensorrt_llm._tensorrt_engine``. ``Drafter.__init__(max_draft_len,
  max_total_draft_tokens, max_concurrency=None, draft_len_schedule=None)`` and
  ``update_max_total_draft_tokens`` (``_torch/speculative/ngram.py`` at
  0249976575050d2c624a5f285683c66de311a3b7 calls it so). ``KvCacheConfig`` keeps the 1.0
  fields the adapter uses (not re-read at main).

The fake ``LLM`` rejects a speculative config whose ``supports_backend`` refuses its backend
("pytorch" for ``tensorrt_llm.LLM``, "tensorrt" for the TensorRT-engine one), as upstream's
argument validation does. With ``UserProvidedDecodingConfig`` it drives the drafter the way
the PyTorch executor does: ``prepare_draft_tokens(scheduled_requests, resource_manager)`` on
requests shaped like ``LlmRequest`` (``request_id``, ``get_tokens(beam)``,
``py_draft_tokens``, ``py_orig_prompt_len``, ``py_max_new_tokens``, ``state``).
"""
from __future__ import annotations

import enum
import importlib.machinery
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from .fakes import (
    FakeCompletion,
    FakeLLM,
    FakeModelRunnerCpp,
    FakePerfMetrics,
    FakeResponse,
    FakeSamplingParams,
    FakeSpecMetrics,
)
from .signatures import _LLM_KWARGS

RELEASES = {"1.0": "1.0.0rc4", "main": "1.3.0rc0"}


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


# --------------------------------------------------------------------------- 1.0 era


class DecodingBaseConfig10(StrictBaseModel):
    max_draft_len: Optional[int] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model_dir: Optional[str] = None
    max_concurrency: Optional[int] = None
    load_format: Optional[str] = None

    def supports_backend(self, backend: str) -> bool:
        return True


class NGramDecodingConfig10(DecodingBaseConfig10):
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class LookaheadDecodingConfig10(DecodingBaseConfig10):
    max_window_size: int = 4
    max_ngram_size: int = 3
    max_verification_set_size: int = 4

    def supports_backend(self, backend: str) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class UserProvidedDecodingConfig10(DecodingBaseConfig10):
    drafter: object
    resource_manager: object = None


class AutoDecodingConfig10(DecodingBaseConfig10):
    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class KvCacheConfig10(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[list[int]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = 0.9
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    dtype: str = "auto"


class Drafter10:
    def __init__(self, max_concurrency: Optional[int] = None) -> None:
        self.max_concurrency = max_concurrency

    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        raise NotImplementedError

    def should_use_spec_decode(self, requests: list) -> bool:
        return self.max_concurrency is None or len(requests) <= self.max_concurrency


# --------------------------------------------------------------------------- main


class DecodingBaseConfigMain(StrictBaseModel):
    max_draft_len: Optional[int] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model: Optional[str] = None
    max_concurrency: Optional[PositiveInt] = None
    draft_len_schedule: Optional[dict[int, int]] = None
    load_format: Optional[str] = None
    acceptance_rate_window_size: Optional[int] = None
    acceptance_rate_threshold: Optional[float] = None
    use_rejection_sampling: bool = False
    allow_advanced_sampling: bool = False
    advanced_sampling_mode: str = "full"
    enable_penalty: bool = False

    @model_validator(mode="after")
    def _schedule(self):
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
        if self.draft_len_schedule:
            smallest = min(self.draft_len_schedule)
            if self.max_draft_len is not None and self.draft_len_schedule[smallest] != self.max_draft_len:
                raise ValueError("draft_len_schedule's smallest key must map to max_draft_len")
        return self

    def supports_backend(self, backend: str) -> bool:
        return True


class NGramDecodingConfigMain(DecodingBaseConfigMain):
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def _k(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        return self

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class SADecodingConfigMain(DecodingBaseConfigMain):
    decoding_type: Literal["SA"] = "SA"
    max_matching_ngram_size: int = -1
    enable_global_pool: bool = False
    global_pool_size: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _sa(self):
        if self.max_matching_ngram_size == 0:
            raise ValueError("max_matching_ngram_size must be > 0 (fixed ngram) or -1 (longest match)")
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for SA")
        return self

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class UserProvidedDecodingConfigMain(DecodingBaseConfigMain):
    decoding_type: Literal["User_Provided"] = "User_Provided"
    drafter: object
    resource_manager: object = None


class AutoDecodingConfigMain(DecodingBaseConfigMain):
    decoding_type: Literal["AUTO"] = "AUTO"

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"


class DrafterMain:
    def __init__(self, max_draft_len: int, max_total_draft_tokens: int, max_concurrency: Optional[int] = None,
                 draft_len_schedule: Optional[dict[int, int]] = None) -> None:
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_total_draft_tokens
        self.max_concurrency = max_concurrency
        self.draft_len_schedule = draft_len_schedule

    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        raise NotImplementedError

    def update_max_total_draft_tokens(self, new_max_total_draft_tokens: int) -> None:
        self.max_total_draft_tokens = new_max_total_draft_tokens


# --------------------------------------------------------------------------- executor stand-ins


class LlmRequestState(enum.Enum):
    GENERATION_IN_PROGRESS = 2
    GENERATION_COMPLETE = 3


@dataclass
class FakeLlmRequest:
    """Shaped like upstream's ``LlmRequest`` where a ``Drafter`` reads it."""

    request_id: int
    tokens: list[int]
    py_orig_prompt_len: int
    py_max_new_tokens: int
    state: LlmRequestState = LlmRequestState.GENERATION_IN_PROGRESS
    py_draft_tokens: list[int] = field(default_factory=list)
    py_batch_idx: Optional[int] = None

    def get_tokens(self, beam: int) -> list[int]:
        assert beam == 0
        return list(self.tokens)


@dataclass
class FakeScheduledRequests:
    context_requests: list = field(default_factory=list)
    generation_requests: list = field(default_factory=list)


def _release_llm(backend: str, allowed: frozenset[str]):
    class ReleaseLLM(FakeLLM):
        """Upstream ``LLM`` stand-in: keyword names checked against the release, the speculative
        config's ``supports_backend`` enforced, user-provided drafters driven per step."""

        def __init__(self, model: str, **kwargs: Any) -> None:
            unknown = sorted(set(kwargs) - allowed)
            if unknown:
                raise TypeError(f"LLM({backend}) got unexpected keyword argument(s) {unknown}")
            spec = kwargs.get("speculative_config")
            if spec is not None and not spec.supports_backend(backend):
                raise ValueError(f"Speculation type {type(spec).__name__} does not support backend {backend}")
            super().__init__(model, **kwargs)
            self.next_id = 0

        def generate_async(self, inputs, sampling_params=None, streaming=False, **kwargs):
            spec = self.kwargs.get("speculative_config")
            if spec is None or not hasattr(spec, "drafter"):
                return super().generate_async(inputs, sampling_params=sampling_params, streaming=streaming, **kwargs)
            self.requests.append((inputs, sampling_params, streaming))
            return iter(self._drive(list(inputs), sampling_params.kwargs, spec.drafter))

        def _drive(self, prompt: list[int], p: dict, drafter: Any) -> list:
            """The executor's loop for one request: the context step, then one
            ``prepare_draft_tokens`` and one verification per generation step."""
            end_id, budget = p["end_id"], p["max_tokens"]
            request = FakeLlmRequest(self.next_id, list(prompt), len(prompt), budget)
            self.next_id += 1
            first = self.target(request.tokens)
            request.tokens.append(first)
            responses, drafted = [self._response(request, prompt, None, 0)], 0
            while len(request.tokens) - len(prompt) < budget and request.tokens[-1] != end_id:
                drafter.prepare_draft_tokens(FakeScheduledRequests(generation_requests=[request]), None)
                draft = list(request.py_draft_tokens)
                drafted += len(draft)
                new: list[int] = []
                for d in draft:
                    if self.target(request.tokens + new) != d or len(request.tokens) - len(prompt) + len(new) >= budget:
                        break
                    new.append(d)
                    if d == end_id:
                        break
                if len(request.tokens) - len(prompt) + len(new) < budget and (not new or new[-1] != end_id):
                    new.append(self.target(request.tokens + new))
                request.tokens += new
                responses.append(self._response(request, prompt, None, drafted))
            request.state = LlmRequestState.GENERATION_COMPLETE
            drafter.prepare_draft_tokens(FakeScheduledRequests(context_requests=[request]), None)
            out = request.tokens[len(prompt):]
            last = responses[-1].outputs[0]
            last.finish_reason = "stop" if out and out[-1] == end_id else "length"
            return responses

        @staticmethod
        def _response(request: FakeLlmRequest, prompt: list[int], finish: Any, drafted: int) -> FakeResponse:
            return FakeResponse([FakeCompletion(token_ids=request.tokens[len(prompt):], finish_reason=finish,
                                                request_perf_metrics=FakePerfMetrics(FakeSpecMetrics(drafted)))])

    ReleaseLLM.instances = FakeLLM.instances
    return ReleaseLLM


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for k, v in attrs.items():
        setattr(module, k, v)
    return module


def build_release(which: str) -> dict[str, types.ModuleType]:
    """The fake module tree of release ``which`` ("1.0" or "main"), by module name."""
    pytorch_kwargs = frozenset(_LLM_KWARGS) | {"tokenizer", "tensor_parallel_size", "dtype"}
    if which == "1.0":
        configs = dict(NGramDecodingConfig=NGramDecodingConfig10, LookaheadDecodingConfig=LookaheadDecodingConfig10,
                       UserProvidedDecodingConfig=UserProvidedDecodingConfig10, AutoDecodingConfig=AutoDecodingConfig10,
                       KvCacheConfig=KvCacheConfig10)
        drafter_base = Drafter10
    else:
        configs = dict(NGramDecodingConfig=NGramDecodingConfigMain, SADecodingConfig=SADecodingConfigMain,
                       UserProvidedDecodingConfig=UserProvidedDecodingConfigMain,
                       AutoDecodingConfig=AutoDecodingConfigMain, KvCacheConfig=KvCacheConfig10)
        drafter_base = DrafterMain
    llm = _release_llm("pytorch", pytorch_kwargs)
    modules = {
        "tensorrt_llm": _module("tensorrt_llm", __version__=RELEASES[which], LLM=llm, SamplingParams=FakeSamplingParams),
        "tensorrt_llm.llmapi": _module("tensorrt_llm.llmapi", **configs),
        "tensorrt_llm._torch": _module("tensorrt_llm._torch"),
        "tensorrt_llm._torch.speculative": _module("tensorrt_llm._torch.speculative"),
        "tensorrt_llm._torch.speculative.drafter": _module("tensorrt_llm._torch.speculative.drafter",
                                                           Drafter=drafter_base),
    }
    if which == "1.0":
        engine_kwargs = frozenset(pytorch_kwargs - {"disable_overlap_scheduler"}) | {"build_config"}
        modules["tensorrt_llm.runtime"] = _module("tensorrt_llm.runtime", ModelRunnerCpp=FakeModelRunnerCpp)
        modules["tensorrt_llm._tensorrt_engine"] = _module("tensorrt_llm._tensorrt_engine",
                                                           LLM=_release_llm("tensorrt", engine_kwargs))
    else:
        modules["tensorrt_llm.runtime"] = _module("tensorrt_llm.runtime")
    return modules


def install_release(monkeypatch: pytest.MonkeyPatch, which: str) -> dict[str, types.ModuleType]:
    """Make ``import tensorrt_llm`` give release ``which`` and a GPU visible (sm_80)."""
    from promptlookup.runtime.trtllm.releases import installed_release

    from . import signatures
    from .conftest import _forget_tensorrt_llm, simulate_gpus

    _forget_tensorrt_llm(monkeypatch)
    signatures.real_signature.cache_clear()
    # the recorded 1.0 signatures still bind every call; the fake package's own classes are
    # the pydantic models above, so binding against them too would add nothing
    monkeypatch.setattr(signatures, "real_signature", lambda api: None)
    modules = build_release(which)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    simulate_gpus(monkeypatch, [(8, 0)])
    installed_release.cache_clear()
    FakeLLM.instances.clear()
    return modules
