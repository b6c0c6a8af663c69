"""TensorRT-LLM's call signatures, as the fakes in :mod:`fakes` must accept them.

The parameter names and defaults below are transcribed from TensorRT-LLM's sources around
the **1.0** release that ``docs/trtllm.md`` targets (NVIDIA/TensorRT-LLM on GitHub):

- ``ModelRunnerCpp.from_dir`` and ``.generate``: ``tensorrt_llm/runtime/model_runner_cpp.py``
  at commit 03832911f05dbe10232949eb3c56aac45578e30a. ``generate`` takes ``**kwargs``;
  the names it reads from them are the sampling names it forwards to the executor's
  ``SamplingConfig`` and ``draft_tokens_list``, ``draft_logits_list``, ``skip_cross_attn_blocks``.
- ``SamplingParams``: ``tensorrt_llm/sampling_params.py`` at commit
  000a01de66f0eab4ab05640711f0253f50f5209c (``__version__ = "1.0.0rc4"``), a keyword-only dataclass.
- ``LLM.__init__`` and ``LLM.generate_async``: ``tensorrt_llm/llmapi/llm.py`` at commit
  00966934ce32e0603a33f8c922525cf3678afab4. ``LLM`` passes ``**kwargs`` to its ``LlmArgs``
  (a pydantic model with ``extra="forbid"``); the names accepted here are ``BaseLlmArgs``'s
  fields plus the PyTorch backend's ``disable_overlap_scheduler``.
- ``NGramDecodingConfig`` and ``KvCacheConfig``: ``tensorrt_llm/llmapi/llm_args.py``
  (pydantic models with ``extra="forbid"``; in 1.0 ``NGramDecodingConfig`` takes
  ``max_draft_len`` from ``DecodingBaseConfig``, where the 0.1x releases had
  ``prompt_lookup_num_tokens``).

:func:`check_call` binds a call against the recorded signature, so a misspelt keyword in
the adapter (or in a test) raises ``TypeError`` as the real class would. Where
``tensorrt_llm`` is importable, it also binds against the installed class's own signature
(:func:`inspect.signature`), so the fakes cannot drift from the real API there.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Callable


# --------------------------------------------------------------------------- recorded signatures


def _from_dir(
    engine_dir, *, lora_dir=None, rank=0, max_batch_size=None, max_input_len=None, max_output_len=None,
    max_beam_width=None, max_attention_window_size=None, sink_token_length=None,
    kv_cache_free_gpu_memory_fraction=None, cross_kv_cache_fraction=None, medusa_choices=None,
    eagle_choices=None, eagle_posterior_threshold=None, eagle_use_dynamic_tree=False,
    eagle_dynamic_tree_max_top_k=None, lookahead_config=None, debug_mode=False, lora_ckpt_source="hf",
    use_gpu_direct_storage=False, gpu_weights_percent=1, max_tokens_in_paged_kv_cache=None,
    kv_cache_enable_block_reuse=False, enable_chunked_context=False, is_enc_dec=False, multi_block_mode=True,
    enable_context_fmha_fp32_acc=None, cuda_graph_mode=None, logits_processor_map=None, device_ids=None,
    is_orchestrator_mode=False, use_runtime_defaults=True, gather_generation_logits=False,
    use_variable_beam_width_search=False, mm_embedding_offloading=False,
): ...


def _generate(
    batch_input_ids, *, position_ids=None, encoder_input_ids=None, encoder_input_features=None,
    encoder_output_lengths=None, cross_attention_masks=None, mrope_params=None, sampling_config=None,
    lora_uids=None, lookahead_config=None, streaming=False, stopping_criteria=None,
    logits_processor_names=None, max_new_tokens=1, end_id=None, pad_id=None, bad_words_list=None,
    stop_words_list=None, return_dict=False, output_sequence_lengths=False, output_generation_logits=False,
    output_log_probs=False, output_cum_log_probs=False, prompt_table=None, prompt_tasks=None,
    input_token_extra_ids=None, return_all_generated_tokens=False, language_adapter_uids=None,
    mm_embedding_offloading=False, **kwargs,
): ...


_GENERATE_KWARGS = frozenset({
    # forwarded to the executor's SamplingConfig (num_beams -> beam_width, random_seed -> seed)
    "num_beams", "top_k", "top_p", "top_p_min", "top_p_reset_ids", "top_p_decay", "temperature", "min_tokens",
    "beam_search_diversity_rate", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "length_penalty", "early_stopping", "no_repeat_ngram_size", "random_seed", "num_return_sequences",
    "min_p", "beam_width_array",
    # read directly from kwargs
    "draft_tokens_list", "draft_logits_list", "skip_cross_attn_blocks",
})


def _sampling_params(
    *, end_id=None, pad_id=None, max_tokens=32, bad=None, bad_token_ids=None, stop=None, stop_token_ids=None,
    include_stop_str_in_output=False, embedding_bias=None, logits_processor=None,
    apply_batched_logits_processor=False, n=1, best_of=None, use_beam_search=False, top_k=None, top_p=None,
    top_p_min=None, top_p_reset_ids=None, top_p_decay=None, seed=None, temperature=None, min_tokens=None,
    beam_search_diversity_rate=None, repetition_penalty=None, presence_penalty=None, frequency_penalty=None,
    length_penalty=None, early_stopping=None, no_repeat_ngram_size=None, min_p=None, beam_width_array=None,
    logprobs=None, prompt_logprobs=None, return_context_logits=False, return_generation_logits=False,
    exclude_input_from_output=True, return_encoder_output=False, return_perf_metrics=False,
    additional_model_outputs=None, lookahead_config=None, guided_decoding=None, ignore_eos=False,
    detokenize=True, add_special_tokens=True, truncate_prompt_tokens=None, skip_special_tokens=True,
    spaces_between_special_tokens=True,
): ...


def _llm(
    model, tokenizer=None, tokenizer_mode="auto", skip_tokenizer_init=False, trust_remote_code=False,
    tensor_parallel_size=1, dtype="auto", revision=None, tokenizer_revision=None, **kwargs,
): ...


_LLM_KWARGS = frozenset({
    "pipeline_parallel_size", "context_parallel_size", "gpus_per_node", "moe_cluster_parallel_size",
    "moe_tensor_parallel_size", "moe_expert_parallel_size", "enable_attention_dp", "cp_config", "load_format",
    "enable_lora", "lora_config", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
    "batched_logits_processor", "iter_stats_max_iterations", "request_stats_max_iterations",
    "peft_cache_config", "scheduler_config", "cache_transceiver_config", "speculative_config",
    "max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens",
    "gather_generation_logits", "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser",
    "decoding_config", "backend", "return_perf_metrics",
    "disable_overlap_scheduler",  # TorchLlmArgs (the PyTorch backend, which NGram decoding runs on)
})


def _generate_async(
    inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None, streaming=False,
    queries=None, kv_cache_retention_config=None, disaggregated_params=None, _postproc_params=None,
): ...


def _ngram_decoding_config(
    *, max_draft_len=None, max_total_draft_tokens=None, speculative_model_dir=None, max_concurrency=None,
    load_format=None, max_matching_ngram_size=2, is_keep_all=True, is_use_oldest=True, is_public_pool=True,
): ...


def _lookahead_decoding_config(
    *, max_draft_len=None, max_total_draft_tokens=None, speculative_model_dir=None, max_concurrency=None,
    load_format=None, max_window_size=4, max_ngram_size=3, max_verification_set_size=4,
): ...


def _kv_cache_config(
    *, enable_block_reuse=True, max_tokens=None, max_attention_window=None, sink_token_length=None,
    free_gpu_memory_fraction=0.9, host_cache_size=None, onboard_blocks=True, cross_kv_cache_fraction=None,
    secondary_offload_min_priority=None, event_buffer_max_size=0, enable_partial_reuse=True,
    copy_on_partial_reuse=True, use_uvm=False, dtype="auto",
): ...


# --------------------------------------------------------------------------- binding


@dataclass(frozen=True)
class Api:
    """One TensorRT-LLM callable: its recorded signature and where the real one lives."""

    name: str  # for messages, e.g. "ModelRunnerCpp.generate"
    recorded: Callable[..., Any]
    real_module: str
    real_attr: str  # "Class" or "Class.method"
    var_kwargs: frozenset[str] = frozenset()  # names the callable's **kwargs accepts


MODEL_RUNNER_FROM_DIR = Api("ModelRunnerCpp.from_dir", _from_dir, "tensorrt_llm.runtime", "ModelRunnerCpp.from_dir")
MODEL_RUNNER_GENERATE = Api(
    "ModelRunnerCpp.generate", _generate, "tensorrt_llm.runtime", "ModelRunnerCpp.generate", _GENERATE_KWARGS
)
SAMPLING_PARAMS = Api("SamplingParams", _sampling_params, "tensorrt_llm", "SamplingParams")
LLM_INIT = Api("LLM", _llm, "tensorrt_llm", "LLM", _LLM_KWARGS)
LLM_GENERATE_ASYNC = Api("LLM.generate_async", _generate_async, "tensorrt_llm", "LLM.generate_async")
NGRAM_DECODING_CONFIG = Api("NGramDecodingConfig", _ngram_decoding_config, "tensorrt_llm.llmapi", "NGramDecodingConfig")
LOOKAHEAD_DECODING_CONFIG = Api("LookaheadDecodingConfig", _lookahead_decoding_config, "tensorrt_llm.llmapi",
                                "LookaheadDecodingConfig")
KV_CACHE_CONFIG = Api("KvCacheConfig", _kv_cache_config, "tensorrt_llm.llmapi", "KvCacheConfig")


def _bind(signature: inspect.Signature, var_kwargs: frozenset[str], what: str, args: tuple, kwargs: dict) -> None:
    params = signature.parameters
    takes_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra = sorted(k for k in kwargs if k not in params or params[k].kind is inspect.Parameter.VAR_KEYWORD)
    if takes_var_kwargs:
        unknown = [k for k in extra if k not in var_kwargs]
        if unknown:
            raise TypeError(f"{what}() got unexpected keyword argument(s) {unknown}")
        kwargs = {k: v for k, v in kwargs.items() if k not in extra}
    try:
        signature.bind(*args, **kwargs)  # unknown names, missing or surplus arguments
    except TypeError as exc:
        raise TypeError(f"{what}(): {exc}") from None


@functools.lru_cache(maxsize=None)
def real_signature(api: Api) -> inspect.Signature | None:
    """The installed TensorRT-LLM's signature for ``api``, or None where it is not importable."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        obj: Any = importlib.import_module(api.real_module)
        for part in api.real_attr.split("."):
            obj = getattr(obj, part)
        signature = inspect.signature(obj)
    except Exception:  # a broken install: nothing to compare against
        return None
    params = list(signature.parameters.values())
    if params and params[0].name == "self":  # a method looked up on its class
        signature = signature.replace(parameters=params[1:])
    return signature


def check_call(api: Api, *args: Any, **kwargs: Any) -> None:
    """Raise ``TypeError`` unless TensorRT-LLM's ``api`` accepts this call.

    Checked against the recorded signature always, and against the installed one where
    ``tensorrt_llm`` is importable.
    """
    _bind(inspect.signature(api.recorded), api.var_kwargs, api.name, args, kwargs)
    real = real_signature(api)
    if real is not None:
        _bind(real, api.var_kwargs, f"{api.name} (installed TensorRT-LLM)", args, kwargs)
