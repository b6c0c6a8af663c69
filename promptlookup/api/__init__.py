"""The LLM API (TensorRT-LLM's names): :class:`LLM`, :class:`SamplingParams`,
:class:`NGramDecodingConfig`, :class:`LookaheadDecodingConfig`, :class:`KvCacheConfig`,
the runtime's :class:`RuntimeConfig`, and the MLX-style :class:`PromptLookupDecoder`."""
from .configs import KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, RuntimeConfig, SamplingParams
from .llm import LLM, CompletionOutput, Logprob, RequestOutput

__all__ = ["LLM", "SamplingParams", "NGramDecodingConfig", "LookaheadDecodingConfig", "KvCacheConfig",
           "RuntimeConfig", "RequestOutput", "CompletionOutput", "Logprob", "PromptLookupDecoder"]


def __getattr__(name: str):
    if name == "PromptLookupDecoder":
        from .mlx_decoder import PromptLookupDecoder

        return PromptLookupDecoder
    raise AttributeError(name)
