"""``LLM(..., backend="trtllm")``: this project's LLM API over TensorRT-LLM's own LLM API.

The model is a Hugging Face checkpoint directory; generation goes through
:class:`~promptlookup.runtime.trtllm.TrtllmLookupGenerator`, so the speculative config is
mapped exactly as on the command line (TensorRT-LLM's NGram or SA drafter, this project's
drafter inside TensorRT-LLM via ``UserProvidedDecodingConfig``, or Lookahead on the
TensorRT-engine LLM, whichever the installed release has; see docs/trtllm.md).

Only :meth:`TrtllmGeneration.generate` is offered: streaming and the asynchronous calls are
TensorRT-LLM's own (use its ``LLM.generate_async``). Everything else the PyTorch path takes
that has no TensorRT-LLM equivalent here is refused in one line, never ignored: stop
strings and stop token ids, block reuse off, the cost-aware draft length, a draft token budget, ``device``,
``cache_dir``/``build``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import UserError
from .configs import KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, SamplingParams


@dataclass
class TrtllmRequestOutput:
    """A finished request (same fields as :class:`~.llm.RequestOutput` once finished)."""

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[Any] = field(default_factory=list)
    finished: bool = True

    def result(self) -> "TrtllmRequestOutput":
        return self


def refuse_unmapped(*, draft_length_policy: str, draft_token_budget: int | None, device: str | None,
                    cache_dir: Any, build: Any, kv: KvCacheConfig, runtime_config: Any = None) -> None:
    """One-line refusals for ``LLM`` arguments that TensorRT-LLM's path would not honour."""
    for name, given in (("draft_token_budget", draft_token_budget is not None), ("device", device is not None),
                        ("runtime_config", runtime_config is not None),
                        ("cache_dir", cache_dir is not None), ("build", build is not None)):
        if given:
            raise UserError(f"LLM(backend='trtllm') takes no {name} (TensorRT-LLM places, builds and budgets "
                            f"itself); drop it or use backend='torch'")
    if draft_length_policy != "full":
        raise UserError(f"draft_length_policy {draft_length_policy!r}: TensorRT-LLM verifies every draft in full; "
                        "pass 'full' or use backend='torch'")
    if kv.dtype != "auto":
        raise UserError(f"KvCacheConfig(dtype={kv.dtype!r}): the TensorRT-LLM path keeps its engine's KV cache type "
                        "here; drop it or use backend='torch'")
    if not kv.enable_block_reuse:
        raise UserError("KvCacheConfig(enable_block_reuse=False): the TensorRT-LLM path always reuses KV blocks "
                        "(prompt lookup needs it); drop it or use backend='torch'")


class TrtllmGeneration:
    """The TensorRT-LLM side of :class:`~.llm.LLM`: tokenizer + generator, generate only."""

    def __init__(self, model: str | os.PathLike[str], tokenizer: Any,
                 speculative_config: NGramDecodingConfig | LookaheadDecodingConfig | None, kv: KvCacheConfig,
                 generator_kwargs: dict[str, Any] | None = None) -> None:
        from ..runtime.trtllm import TrtllmLookupGenerator

        if speculative_config is None:
            raise UserError("LLM(backend='trtllm') needs a speculative_config (NGramDecodingConfig or "
                            "LookaheadDecodingConfig); for plain decoding use TensorRT-LLM's LLM directly")
        self.tokenizer = tokenizer
        self.draft = speculative_config.draft_config() if isinstance(speculative_config, NGramDecodingConfig) else None
        self.lookahead = (speculative_config.lookahead_config()
                          if isinstance(speculative_config, LookaheadDecodingConfig) else None)
        self.generator = TrtllmLookupGenerator(model, max_tokens_in_paged_kv_cache=kv.max_tokens,
                                               kv_cache_free_gpu_memory_fraction=kv.free_gpu_memory_fraction,
                                               **(generator_kwargs or {}))

    def generate(self, prompts: Sequence[tuple[str | None, list[int]]], params: Sequence[SamplingParams],
                 default_end_id: int, decode: Any) -> list[TrtllmRequestOutput]:
        """Every prompt with its ``SamplingParams``; prompts with equal settings share one call."""
        from .llm import CompletionOutput

        if any(p.stop for p in params):
            raise UserError("stop strings are not passed to TensorRT-LLM by this path; drop SamplingParams.stop "
                            "or use backend='torch'")
        if any(p.logprobs is not None for p in params):
            raise UserError("logprobs are not passed to TensorRT-LLM by this path; drop SamplingParams.logprobs or "
                            "use backend='torch'")
        if any(p.stop_token_ids for p in params):
            raise UserError("stop_token_ids are not passed to TensorRT-LLM by this path; drop them or use "
                            "backend='torch'")
        if any(p.ignore_eos for p in params):
            raise UserError("ignore_eos is not passed to TensorRT-LLM by this path; drop it or use backend='torch'")
        if any(p.sampling_config().has_logits_processors for p in params):
            raise UserError("penalties, logit_bias and min_tokens are not passed to TensorRT-LLM by this path; "
                            "drop them or use backend='torch'")
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            end_id = p.end_id if p.end_id is not None else default_end_id
            groups.setdefault((p.max_tokens, end_id, p.sampling_config()), []).append(i)
        outputs: list[Any] = [None] * len(prompts)
        for (max_tokens, end_id, sampling), members in groups.items():
            results = self.generator.generate([prompts[i][1] for i in members], max_new_tokens=max_tokens,
                                              end_id=end_id, draft=self.draft, sampling=sampling,
                                              lookahead=self.lookahead)
            for i, r in zip(members, results):
                out = CompletionOutput(text=decode(r.output_ids), output_ids=list(r.output_ids),
                                       finish_reason="stop" if r.finished else "length", steps=r.steps,
                                       drafted=r.drafted, accepted=r.accepted, draft_flags=list(r.draft_flags))
                outputs[i] = TrtllmRequestOutput(i, prompts[i][0], prompts[i][1], [out])
        return outputs

    def shutdown(self) -> None:
        self.generator.close()


__all__ = ["TrtllmGeneration", "TrtllmRequestOutput", "refuse_unmapped"]
