"""V2: the LLM API with ``speculative_config=NGramDecodingConfig(...)``.

NGram drafting runs inside TensorRT-LLM's PyTorch backend, so ``model`` is a Hugging Face
checkpoint directory, not an engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..results import SequenceResult, StepCallback, StepEvent
from ...drafting.base import DraftConfig
from ...errors import UserError
from ..base import SamplingConfig
from .env import lazy, require_trtllm
from .llmapi_checks import check_hf_model_dir, check_llmapi_draft


class TrtllmLookupGenerator:
    """V2: one ``LLM.generate_async`` per prompt with NGram speculative decoding.

    The ``LLM`` is built lazily from the first :class:`DraftConfig` seen
    (``NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=n, is_keep_all,
    is_use_oldest, is_public_pool)``, ``KvCacheConfig(enable_block_reuse=True)``,
    ``disable_overlap_scheduler=True`` which NGram requires) and rebuilt only when a
    different one arrives.

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
        max_batch_size: int | None = None,
        max_seq_len: int | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        llm_cls: Any = None,
        ngram_config_cls: Any = None,
        kv_cache_config_cls: Any = None,
        lookahead_config_cls: Any = None,
        sampling_params_cls: Any = None,
    ) -> None:
        if llm_cls is None:
            require_trtllm()
            llm_cls = lazy("tensorrt_llm", "LLM")
        self._llm_cls = llm_cls
        self._ngram_cls = ngram_config_cls or (lambda **kw: lazy("tensorrt_llm.llmapi", "NGramDecodingConfig")(**kw))
        self._la_cls = lookahead_config_cls or (
            lambda **kw: lazy("tensorrt_llm.llmapi", "LookaheadDecodingConfig")(**kw))
        self._kv_cls = kv_cache_config_cls or (lambda **kw: lazy("tensorrt_llm.llmapi", "KvCacheConfig")(**kw))
        self._sp_cls = sampling_params_cls or (lambda **kw: lazy("tensorrt_llm", "SamplingParams")(**kw))
        self.model = str(model)
        check_hf_model_dir(self.model)
        if tensor_parallel_size < 1 or pipeline_parallel_size < 1:
            raise UserError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
        self.kv_cache_free_gpu_memory_fraction = kv_cache_free_gpu_memory_fraction
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.llm_kwargs = dict(llm_kwargs or {})
        self._llm: Any = None
        self._llm_draft: tuple[Any, Any] | None = None

    # -- LLM lifecycle ---------------------------------------------------------------

    def _llm_for(self, draft: DraftConfig | None, lookahead: Any = None) -> Any:
        """The LLM for NGram drafting (``draft``) or Lookahead (``lookahead``: a
        :class:`~promptlookup.decoding.lookahead.LookaheadConfig`, mapped onto TensorRT-LLM's
        ``LookaheadDecodingConfig(max_window_size=W, max_ngram_size=N,
        max_verification_set_size=G)``). TensorRT-LLM takes one speculative config, so both
        together are refused."""
        if lookahead is not None and draft is not None:
            raise UserError("TensorRT-LLM takes one speculative_config: Lookahead or NGram, not both; "
                            "drop --prompt_lookup_config or --lookahead_config (or use --backend torch)")
        if lookahead is None and draft is None:
            raise UserError("V2 on TensorRT-LLM needs --prompt_lookup_config or --lookahead_config")
        key = (draft, lookahead)
        if self._llm is not None and self._llm_draft == key:
            return self._llm
        self.close()
        if lookahead is not None:
            w, n, g = lookahead.triple
            if g < 1:
                raise UserError("TensorRT-LLM's LookaheadDecodingConfig needs max_verification_set_size >= 1; "
                                "pass G >= 1 in --lookahead_config (or use --backend torch)")
            spec = self._la_cls(max_window_size=w, max_ngram_size=n, max_verification_set_size=g)
        else:
            check_llmapi_draft(draft)
            spec = self._ngram_cls(
                max_draft_len=draft.prompt_lookup_num_tokens,
                max_matching_ngram_size=draft.max_matching_ngram_size,
                is_keep_all=draft.is_keep_all,
                is_use_oldest=draft.is_use_oldest,
                is_public_pool=draft.is_public_pool,
            )
        kv_kwargs: dict[str, Any] = dict(enable_block_reuse=True)
        if self.kv_cache_free_gpu_memory_fraction is not None:
            kv_kwargs["free_gpu_memory_fraction"] = self.kv_cache_free_gpu_memory_fraction
        kwargs: dict[str, Any] = dict(
            model=self.model,
            speculative_config=spec,
            kv_cache_config=self._kv_cls(**kv_kwargs),
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            disable_overlap_scheduler=True,
        )
        if self.max_batch_size is not None:
            kwargs["max_batch_size"] = self.max_batch_size
        if self.max_seq_len is not None:
            kwargs["max_seq_len"] = self.max_seq_len
        kwargs.update(self.llm_kwargs)
        self._llm = self._llm_cls(**kwargs)
        self._llm_draft = key
        return self._llm

    def close(self) -> None:
        """Shut the current ``LLM`` down (its executor holds GPUs and worker processes)."""
        llm, self._llm, self._llm_draft = self._llm, None, None
        if llm is not None and hasattr(llm, "shutdown"):
            llm.shutdown()

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
        return self._sp_cls(**kwargs)

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
    ) -> list[SequenceResult]:
        """Generate for every prompt; all requests are in flight together.

        Results are read one request after another (the others keep running meanwhile), so
        ``on_step`` sees every event of sequence 0, then of sequence 1, and so on.
        """
        if max_new_tokens < 1:
            raise UserError(f"max_output_len must be at least 1, got {max_new_tokens}")
        llm = self._llm_for(draft, lookahead)
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
            accepted = len(chunk) - 1
            result.steps += 1
            result.accepted += accepted
            result.output_ids.extend(chunk)
            result.draft_flags.extend([True] * accepted + [False])
            if on_step is not None:
                on_step(StepEvent(index, chunk, accepted))
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
