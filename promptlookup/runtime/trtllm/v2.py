"""V2: the LLM API, with TensorRT-LLM drafting (NGram, SA), this project's drafter inside
TensorRT-LLM (``UserProvidedDecodingConfig``), or Lookahead on the TensorRT-engine ``LLM``.

The PyTorch backend (and the TensorRT-engine ``LLM``, which builds its own engine) load a
Hugging Face checkpoint directory, not this project's engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..results import SequenceResult, StepCallback, StepEvent
from ...drafting.base import DraftConfig
from ...errors import UserError
from ..base import SamplingConfig
from .env import TARGET_VERSION, lazy, require_trtllm
from .llmapi_checks import check_hf_model_dir
from .releases import Release, installed_release
from .spec_plan import LOOKAHEAD, NGRAM, USER_PROVIDED, SpecPlan, plan_speculation
from .user_drafter import make_user_drafter


class TrtllmLookupGenerator:
    """V2: one ``LLM.generate_async`` per prompt, TensorRT-LLM drafting or verifying inside.

    The speculative config comes from :func:`~.spec_plan.plan_speculation` for the installed
    release (``release``): TensorRT-LLM's ``NGramDecodingConfig(max_draft_len=k,
    max_matching_ngram_size=n, is_keep_all, is_use_oldest, is_public_pool)``,
    ``SADecodingConfig`` for the longest match, ``UserProvidedDecodingConfig`` with this
    project's drafter (:mod:`.user_drafter`) for every other drafting setting, or
    ``LookaheadDecodingConfig`` on the TensorRT-engine ``LLM``. The PyTorch ``LLM`` gets
    ``disable_overlap_scheduler=True`` with NGram and user-provided drafting (both read the
    previous step's tokens). ``KvCacheConfig(enable_block_reuse=True, max_tokens,
    free_gpu_memory_fraction)`` and ``enable_chunked_prefill`` carry the KV-cache flags.
    The ``LLM`` is built lazily and rebuilt only when a different config arrives.

    What the LLM API reports, and so what :class:`SequenceResult` holds:

    - ``output_ids``: the generated ids. When TensorRT-LLM stops on ``end_id``
      (``finish_reason == "stop"``) but leaves it out of the ids, it is appended, so that
      ``output_ids`` ends with ``end_id`` exactly as on the PyTorch backend.
    - ``steps``, ``accepted``, ``draft_flags``: from the streamed chunks. Each streamed
      response is one iteration; its ``n`` new tokens are ``n - 1`` accepted draft tokens and
      one of the target's own. A chunk cut short by ``max_tokens`` is counted the same way.
    - ``drafted``: ``request_perf_metrics.speculative_decoding.total_draft_tokens``
      (requested with ``return_perf_metrics=True``). Draft counts are not in the token
      stream, so when the metric is missing or zero ``drafted`` falls back to ``accepted``
      (a lower bound; the acceptance rate then reads 1.0 and is not meaningful).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        kv_cache_free_gpu_memory_fraction: float | None = None,
        max_tokens_in_paged_kv_cache: int | None = None,
        enable_chunked_context: bool = False,
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        release: Release | None = None,
        llm_cls: Any = None,
        engine_llm_cls: Any = None,
        ngram_config_cls: Any = None,
        kv_cache_config_cls: Any = None,
        lookahead_config_cls: Any = None,
        sampling_params_cls: Any = None,
        config_classes: dict[str, Any] | None = None,
        drafter_base_cls: Any = None,
    ) -> None:
        if llm_cls is None:
            require_trtllm()
            release = release or installed_release()
        self.release = release or Release(TARGET_VERSION)
        self._llm_cls = llm_cls
        self._engine_llm_cls = engine_llm_cls
        self._classes = dict(config_classes or {})
        for name, cls in ((NGRAM, ngram_config_cls), (LOOKAHEAD, lookahead_config_cls),
                          ("KvCacheConfig", kv_cache_config_cls)):
            if cls is not None:
                self._classes[name] = cls
        self._sp_cls = sampling_params_cls
        self._drafter_base_cls = drafter_base_cls
        self.model = str(model)
        check_hf_model_dir(self.model)
        if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
            raise UserError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        if kv_cache_free_gpu_memory_fraction is not None and not 0.0 < kv_cache_free_gpu_memory_fraction <= 1.0:
            raise UserError(f"kv_cache_free_gpu_memory_fraction must be in (0, 1], got {kv_cache_free_gpu_memory_fraction}")
        if max_tokens_in_paged_kv_cache is not None and max_tokens_in_paged_kv_cache < 1:
            raise UserError(f"--max_tokens_in_paged_kv_cache must be at least 1, got {max_tokens_in_paged_kv_cache}")
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self.kv_cache_free_gpu_memory_fraction = kv_cache_free_gpu_memory_fraction
        self.max_tokens_in_paged_kv_cache = max_tokens_in_paged_kv_cache
        self.enable_chunked_context = enable_chunked_context
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._llm_draft: tuple[Any, Any] | None = None
        self.plan: SpecPlan | None = None
        self.user_drafter: Any = None  # the Drafter given to UserProvidedDecodingConfig, if any
        self._own_drafter: Any = None  # this project's drafter, when made here (saved on close)

    # -- LLM lifecycle ---------------------------------------------------------------

    def _cls(self, name: str) -> Any:
        """The config class ``name``: injected, or ``tensorrt_llm.llmapi.<name>``."""
        return self._classes.get(name) or lazy("tensorrt_llm.llmapi", name)

    def _llm_class(self, which: str) -> Any:
        if which == "engine":
            return self._engine_llm_cls or lazy("tensorrt_llm._tensorrt_engine", "LLM")
        return self._llm_cls or lazy("tensorrt_llm", "LLM")

    def _spec_config(self, plan: SpecPlan, draft: DraftConfig | None, drafter: Any) -> Any:
        if plan.config_class != USER_PROVIDED:
            return self._cls(plan.config_class)(**plan.kwargs)
        assert draft is not None
        if drafter is None:
            from ...drafting import make_drafter

            drafter = self._own_drafter = make_drafter(draft, workflow="v2")
        self.user_drafter = make_user_drafter(
            drafter, max_draft_len=draft.prompt_lookup_num_tokens,
            max_concurrency=plan.kwargs.get("max_concurrency"),
            draft_len_schedule=plan.kwargs.get("draft_len_schedule"), base_cls=self._drafter_base_cls)
        return self._cls(USER_PROVIDED)(drafter=self.user_drafter, **plan.kwargs)

    def _llm_for(self, draft: DraftConfig | None, lookahead: Any = None, drafter: Any = None) -> Any:
        """The LLM for ``draft`` (prompt lookup) or ``lookahead`` (a
        :class:`~promptlookup.decoding.lookahead.LookaheadConfig`); see :func:`plan_speculation`.
        ``drafter``: this project's drafter to run inside TensorRT-LLM when the plan needs one
        (default: made here from ``draft``; persisted caches need the caller's, which knows the
        tokenizer)."""
        key = (draft, lookahead)
        if self._llm is not None and self._llm_draft == key:
            return self._llm
        plan = plan_speculation(draft, lookahead, self.release)
        self.close()
        spec = self._spec_config(plan, draft, drafter)
        kv_kwargs: dict[str, Any] = dict(enable_block_reuse=True)
        if self.kv_cache_free_gpu_memory_fraction is not None:
            kv_kwargs["free_gpu_memory_fraction"] = self.kv_cache_free_gpu_memory_fraction
        if self.max_tokens_in_paged_kv_cache is not None:
            kv_kwargs["max_tokens"] = self.max_tokens_in_paged_kv_cache
        kwargs: dict[str, Any] = dict(
            model=self.model,
            speculative_config=spec,
            kv_cache_config=self._cls("KvCacheConfig")(**kv_kwargs),
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
        )
        if plan.llm == "pytorch" and plan.config_class in (NGRAM, USER_PROVIDED):
            kwargs["disable_overlap_scheduler"] = True  # these drafters read the previous step's tokens
        if self.enable_chunked_context:
            kwargs["enable_chunked_prefill"] = True
        if self.max_batch_size is not None:
            kwargs["max_batch_size"] = self.max_batch_size
        if self.max_seq_len is not None:
            kwargs["max_seq_len"] = self.max_seq_len
        kwargs.update(self.llm_kwargs)
        self._llm = self._llm_class(plan.llm)(**kwargs)
        self._llm_draft = key
        self.plan = plan
        return self._llm

    def close(self) -> None:
        """Shut the current ``LLM`` down (its executor holds GPUs and worker processes); finish
        the user-provided drafter's requests and save its dynamic cache if it was made here."""
        llm, self._llm, self._llm_draft = self._llm, None, None
        if llm is not None and hasattr(llm, "shutdown"):
            llm.shutdown()
        if self.user_drafter is not None:
            self.user_drafter.drafting.finish_all()
            self.user_drafter = None
        own, self._own_drafter = self._own_drafter, None
        if own is not None:
            own.save()

    def __enter__(self) -> "TrtllmLookupGenerator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation ------------------------------------------------------------------

    def _sampling_params(self, max_new_tokens: int, end_id: int, sampling: SamplingConfig) -> Any:
        kwargs: dict[str, Any] = dict(
            max_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=end_id,
            detokenize=False,  # the CLI decodes; skip the LLM API's detokenizer
            return_perf_metrics=True,
        )
        if sampling.greedy:
            kwargs["top_k"] = 1
        else:
            kwargs["temperature"] = sampling.temperature
            kwargs["top_k"] = sampling.top_k or None
            kwargs["top_p"] = sampling.top_p if sampling.top_p < 1.0 else None
            kwargs["seed"] = sampling.random_seed
        return (self._sp_cls or lazy("tensorrt_llm", "SamplingParams"))(**kwargs)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft: DraftConfig | None,
        sampling: SamplingConfig = SamplingConfig(),
        on_step: StepCallback | None = None,
        lookahead: Any = None,
        drafter: Any = None,
    ) -> list[SequenceResult]:
        """Generate for every prompt; all requests are in flight together (``drafter``: see
        :meth:`_llm_for`).

        Results are read one request after another (the others keep running meanwhile), so
        ``on_step`` sees every event of sequence 0, then of sequence 1, and so on.
        """
        if max_new_tokens < 1:
            raise UserError(f"max_output_len must be at least 1, got {max_new_tokens}")
        llm = self._llm_for(draft, lookahead, drafter)
        params = self._sampling_params(max_new_tokens, end_id, sampling)
        pending = [
            llm.generate_async([int(t) for t in p], sampling_params=params, streaming=True) for p in prompts
        ]
        return [self._collect(i, req, end_id, max_new_tokens, on_step) for i, req in enumerate(pending)]

    @staticmethod
    def _collect(
        index: int, request: Any, end_id: int, max_new_tokens: int, on_step: StepCallback | None
    ) -> SequenceResult:
        result = SequenceResult()
        seen = 0
        output = None
        for response in request:
            output = response.outputs[0]
            chunk = [int(t) for t in output.token_ids[seen:]]
            seen = len(output.token_ids)
            if not chunk:
                continue
            event = StepEvent(index, chunk, len(chunk) - 1)  # drafted: the backend's total, below
            result.add(event)
            if on_step is not None:
                on_step(event)
        if output is None:
            raise RuntimeError(f"TensorRT-LLM returned no response for request {index}")
        stopped = getattr(output, "finish_reason", None) == "stop"
        if stopped and (not result.output_ids or result.output_ids[-1] != end_id):
            if len(result.output_ids) < max_new_tokens:
                result.output_ids.append(end_id)
                result.draft_flags.append(False)
        result.finished = bool(result.output_ids) and result.output_ids[-1] == end_id
        reported = _reported_drafted(output)
        result.drafted = max(reported, result.accepted)
        return result


def _reported_drafted(output: Any) -> int:
    metrics = getattr(output, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    value = getattr(spec, "total_draft_tokens", 0) if spec is not None else 0
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


__all__ = ["TrtllmLookupGenerator"]
