"""promptlookup: convert Llama checkpoints, build engines, and run them with prompt-lookup
(n-gram) speculative decoding on a PyTorch or TensorRT-LLM backend.

Layout (one concept per sub-package):

- ``checkpoint``: Hugging Face / GGUF checkpoints <-> the TensorRT-LLM checkpoint format.
- ``drafting``: n-gram drafters (TensorRT-LLM pool, longest match, persisted caches).
- ``engine``: building an engine directory (PyTorch engine or real ``trtllm-build``).
- ``runtime``: runners that verify drafts (paged KV block cache with reuse, sampling).
- ``decoding``: the prompt-lookup loops, V1 (orchestrator) and V2 (single call).
- ``evaluation``: the summarization benchmark behind ``summarize.py``.
- ``cli``: argument parsing and the logic behind the top-level scripts.
"""

__version__ = "0.1.0"

_API = ("LLM", "SamplingParams", "NGramDecodingConfig", "LookaheadDecodingConfig", "KvCacheConfig",
        "PromptLookupDecoder")


def __getattr__(name: str):
    """``promptlookup.LLM`` and friends, imported on first use (the package itself stays light)."""
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
