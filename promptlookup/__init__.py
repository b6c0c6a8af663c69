"""promptlookup: convert Llama checkpoints, build engines, and run them with prompt-lookup
(n-gram) speculative decoding on a PyTorch or TensorRT-LLM backend.

Layout (one concept per sub-package), top to bottom; imports run downwards only
(``tests/test_layering.py``):

- ``cli``: argument parsing and the logic behind the top-level scripts.
- ``serving``: the OpenAI-compatible HTTP app, a client of the LLM API.
- ``api``: the LLM API (``LLM``, configs) and the MLX-style decoder; ``evaluation``: the
  summarization benchmark behind ``summarize.py``; ``hf``: Hugging Face's ``generate``.
- ``decoding``: the prompt-lookup loops, V1 (orchestrator) and V2 (one step shared by
  ``generate``, the API and the server's scheduler), Lookahead, the draft budget.
- ``engine``: building an engine directory (PyTorch engine or real ``trtllm-build``).
- ``runtime``: runners that verify drafts (paged KV block cache with reuse, sampling).
- ``drafting``: n-gram drafters (one class per mode) and the draft tree; ``checkpoint``:
  Hugging Face / GGUF checkpoints <-> the TensorRT-LLM checkpoint format.
- base modules: ``text`` (tokenizing, chat template, incremental detokenizer, stop
  strings), ``stream_output``, ``defaults``, ``threads``, ``fsutil``, ``literals``, ``errors``.
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
