"""The systems compared by ``summarize.py`` and how each one is opened for a run.

A :class:`ContenderSpec` names one system: our engine or Hugging Face (``family``), plain
decoding (``draft`` None) or prompt lookup (``draft`` set). A backend turns a spec into a
batch function for :func:`promptlookup.evaluation.harness.run_batches`.

Fairness: with KV-cache block reuse on, a runner keeps the prompts' KV blocks after a run,
so a second contender on the same runner would skip prefill work the first one paid for.
:class:`EngineBackend` therefore gives every contender a freshly loaded runner unless
block reuse is off. The HF model holds no state across ``generate`` calls and is shared.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Iterator

from ..decoding.lookahead import LookaheadConfig
from ..defaults import (DEFAULT_COMPILE_MODE, DEFAULT_CPU_WEIGHT_COPIES, DEFAULT_DRAFT_LENGTH_POLICY,
                        DEFAULT_KV_CACHE_DTYPE, DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE, DEFAULT_WORKFLOW)
from ..drafting.base import DraftConfig
from ..runtime.base import SamplingConfig
from .harness import BatchFn, Generated, ProgressHook
from .hf_baseline import count_forward_calls, hf_generate, load_hf_model

ENGINE = "engine"
HF = "hf"


@dataclass(frozen=True)
class ContenderSpec:
    """One system under test. ``draft`` None means plain (non-speculative) decoding."""

    name: str
    family: str  # ENGINE or HF
    draft: DraftConfig | None = None
    workflow: str = DEFAULT_WORKFLOW  # our engine's prompt-lookup loop (ignored by HF and plain runs)
    lookahead: LookaheadConfig | None = None  # our engine's Lookahead decoding (with ``draft``: combined)

    @property
    def speculative(self) -> bool:
        return self.draft is not None or self.lookahead is not None


def draft_label(draft: DraftConfig) -> str:
    """Short human label of a draft configuration, e.g. ``pool k=10 n=2 adaptive``."""
    parts = [draft.mode, f"k={draft.prompt_lookup_num_tokens}"]
    if draft.mode == "pool":
        parts.append(f"n={draft.max_matching_ngram_size}")
    if draft.adaptive:
        parts.append("adaptive")
    if draft.max_candidates > 1:
        parts.append(f"G={draft.max_candidates}")
    return " ".join(parts)


def lookahead_label(config: LookaheadConfig, workflow: str) -> str:
    """E.g. ``lookahead v2 [4,3,4]`` (as ``lookup v2 pool ...``)."""
    return "lookahead {} [{},{},{}]".format(workflow, *config.triple)


@dataclass(frozen=True)
class DecodeSettings:
    """What every contender generates with."""

    max_new_tokens: int
    end_id: int
    pad_id: int
    sampling: SamplingConfig = SamplingConfig()
    draft_length_policy: str = DEFAULT_DRAFT_LENGTH_POLICY  # see promptlookup.decoding.draft_policy


def _release() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


class EngineBackend:
    """Opens our engine (on the backend it was built for) for each engine contender."""

    def __init__(self, engine_dir: str, settings: DecodeSettings, *, kv_cache_enable_block_reuse: bool = DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE,
                 device_ids: list[int] | None = None, max_tokens_in_paged_kv_cache: int | None = None,
                 kv_cache_free_gpu_memory_fraction: float | None = None, kv_cache_dtype: str = DEFAULT_KV_CACHE_DTYPE,
                 enable_chunked_context: bool = False,
                 tokenizer: Any = None, device: str | None = None, cuda_graph_mode: bool | None = None,
                 backend: str = "auto", cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES,
                 compile_mode: str = DEFAULT_COMPILE_MODE) -> None:
        self.engine_dir = engine_dir
        self.compile_mode = compile_mode
        self.cpu_weight_copies = cpu_weight_copies
        self.backend = backend
        self.device = device
        self.cuda_graph_mode = cuda_graph_mode
        self.tokenizer = tokenizer  # persisted n-gram caches check it against the files
        self.max_tokens_in_paged_kv_cache = max_tokens_in_paged_kv_cache
        self.kv_cache_free_gpu_memory_fraction = kv_cache_free_gpu_memory_fraction
        self.kv_cache_dtype = kv_cache_dtype
        self.enable_chunked_context = enable_chunked_context
        self.settings = settings
        self.kv_cache_enable_block_reuse = kv_cache_enable_block_reuse
        self.device_ids = device_ids
        self._idle_runner: Any = None  # loaded but not yet used by any contender

    def _load(self) -> Any:
        from ..engine.load import load_runner

        from ..runtime.options import KvCacheConfig, RuntimeConfig

        runtime = RuntimeConfig(device=self.device, cuda_graph_mode=self.cuda_graph_mode,
                                compile_mode=self.compile_mode, cpu_weight_copies=self.cpu_weight_copies)
        kv_cache = KvCacheConfig(self.kv_cache_enable_block_reuse, self.max_tokens_in_paged_kv_cache,
                                 dtype=self.kv_cache_dtype)
        return load_runner(self.engine_dir, runtime, kv_cache, device_ids=self.device_ids, backend=self.backend,
                           kv_cache_free_gpu_memory_fraction=self.kv_cache_free_gpu_memory_fraction,
                           enable_chunked_context=self.enable_chunked_context)

    @contextlib.contextmanager
    def open(self, spec: ContenderSpec) -> Iterator[BatchFn]:
        from ..decoding import generate

        runner = self._idle_runner if self._idle_runner is not None else self._load()
        self._idle_runner = None
        s = self.settings

        def run(prompts: list[list[int]], hook: ProgressHook) -> list[Generated]:
            # One drafter per batch, as TensorRT-LLM makes one pool per generate call; made
            # here only when a persisted cache needs the tokenizer, else generate makes it.
            drafter = None
            if spec.draft is not None and (spec.draft.static_cache or spec.draft.dynamic_cache):
                from ..drafting import make_drafter

                drafter = make_drafter(spec.draft, self.tokenizer, workflow=spec.workflow, end_id=s.end_id)
            results = generate(runner, prompts, max_new_tokens=s.max_new_tokens, end_id=s.end_id, sampling=s.sampling,
                               draft=spec.draft, workflow=spec.workflow, drafter=drafter,
                               draft_length_policy=s.draft_length_policy, lookahead=spec.lookahead,
                               on_step=lambda event: hook(len(event.tokens)))
            return [Generated(list(r.output_ids), r.steps, r.drafted, r.accepted) for r in results]

        try:
            yield run
        finally:
            if not self.kv_cache_enable_block_reuse:
                self._idle_runner = runner  # no cached prompt state: safe to share
            del runner
            _release()

    def close(self) -> None:
        self._idle_runner = None
        _release()


class HFBackend:
    """Opens the Hugging Face baseline model (loaded once, shared by the HF contenders)."""

    def __init__(self, model_dir: str, settings: DecodeSettings, *, data_type: str = "auto",
                 device: str | None = None) -> None:
        self.model_dir = model_dir
        self.settings = settings
        self.data_type = data_type
        self.device = device
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = load_hf_model(self.model_dir, data_type=self.data_type, device=self.device)
        return self._model

    @contextlib.contextmanager
    def open(self, spec: ContenderSpec) -> Iterator[BatchFn]:
        model, s, draft = self.model, self.settings, spec.draft

        def run(prompts: list[list[int]], hook: ProgressHook) -> list[Generated]:
            outputs: list[Generated] = []
            with count_forward_calls(model) as counter:
                seen = 0

                def on_output(_: int, ids: list[int]) -> None:
                    nonlocal seen
                    steps, seen = counter.calls - seen, counter.calls
                    hook(len(ids))
                    # HF does not expose draft counts; every step yields one token of the
                    # target's own, so the rest were accepted drafts.
                    accepted = max(0, len(ids) - steps) if draft else 0
                    outputs.append(Generated(ids, steps, None if draft else 0, accepted))

                hf_generate(model, prompts, max_new_tokens=s.max_new_tokens, end_id=s.end_id, pad_id=s.pad_id,
                            sampling=s.sampling, on_output=on_output,
                            prompt_lookup_num_tokens=draft.prompt_lookup_num_tokens if draft else None,
                            max_matching_ngram_size=draft.max_matching_ngram_size if draft else None)
            return outputs

        yield run

    def close(self) -> None:
        self._model = None
        _release()
