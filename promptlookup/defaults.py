"""The defaults shared by the library and the command line, defined once.

``decoding.generate``, the LLM API, the evaluation settings and the scripts' flags
(``run.py``, ``summarize.py``, ``serve.py``, ``quickstart_advanced.py``) all read these, so
a call without the argument and a command without the flag do the same thing.

They differ from TensorRT-LLM's ``run.py``, which orchestrates V1-style (the draft loop
outside the engine, ``run_dtm_pld``) and keeps KV block reuse off unless
``--kv_cache_enable_block_reuse`` is given. Here the single-call loop (v2) is faster, and
the orchestrator loop (v1) re-submits whole sequences, which only block reuse makes cheap;
outputs are token-identical either way. For TensorRT-LLM's behaviour pass
``--workflow v1`` (library: ``workflow="v1"``), and ``--no-kv_cache_enable_block_reuse``
(``kv_cache_enable_block_reuse=False``) for its reuse-off default.
"""
from __future__ import annotations

WORKFLOWS = ("v1", "v2")  # v1: orchestrator loop (one runner call per step); v2: single call
DEFAULT_WORKFLOW = "v2"
DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE = True  # reuse cached KV blocks of earlier prompts and calls
DRAFT_LENGTH_POLICIES = ("cost", "full")  # see promptlookup.decoding.draft_policy
# "cost" everywhere (decoding.generate, the LLM API, run.py, summarize.py, serve.py): each
# step verifies only the draft tokens expected to pay off on this device, priced by the
# step-cost table the engine stores (an engine without one, or a TensorRT-LLM engine,
# verifies every draft in full). It never changes the output tokens, only how many come
# per step; "full" is TensorRT-LLM's behaviour (every proposed token verified).
DEFAULT_DRAFT_LENGTH_POLICY = "cost"
# Prompt lookup, with TensorRT-LLM's NGramDecodingConfig names: drafts of up to k tokens
# from patterns of up to n tokens, in TensorRT-LLM's pool (its three switches on, as
# there); a shorter match than the minimum drafts nothing. Shared by the library's
# DraftConfig, the LLM API's NGramDecodingConfig and the scripts' flags (run.py's
# "[k, n]" has no default: prompt lookup is off unless it is given).
DEFAULT_MAX_DRAFT_LEN = 10  # k
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2  # n
DEFAULT_MIN_MATCHING_NGRAM_SIZE = 1  # MLX's ngram_min: 1 keeps every match
DEFAULT_DRAFTER_MODE = "pool"
DEFAULT_IS_KEEP_ALL = DEFAULT_IS_USE_OLDEST = DEFAULT_IS_PUBLIC_POOL = True
# Lookahead decoding's [W, N, G] (window size, n-gram size, verification set size).
DEFAULT_LOOKAHEAD = (4, 3, 4)
BACKENDS = ("auto", "torch", "trtllm")  # auto: the backend the engine was built for
DEFAULT_BACKEND = "auto"

# PyTorch engines on a CPU: 1 keeps each projection's weight once (row-major for the C
# kernels; oneDNN's reordered copy where they are not built); 2 also keeps a second copy
# (oneDNN's, for many-row products; without the C kernels the row-major weight, whose one-
# and two-row products run faster through MKL). See promptlookup.runtime.cpu_linear; no
# effect on a GPU.
CPU_WEIGHT_COPIES = (1, 2)
DEFAULT_CPU_WEIGHT_COPIES = 1

# PyTorch engines: "off" runs the paged forward eagerly (on a CPU through oneDNN, see
# promptlookup.runtime.cpu_linear); "inductor" runs decoding steps through torch.compile
# (promptlookup.runtime.compiled). Off by default: on the CPU the eager path measured faster
# (docs/benchmarks.md, "Compiled forward on the CPU"), and each step shape costs a compile.
COMPILE_MODES = ("off", "inductor")

# The KV cache's element type (KvCacheConfig.dtype, --kv_cache_dtype; TensorRT-LLM's names):
# "auto" stores K/V in the engine's own dtype; "float16" halves a float32 engine's cache (the
# bytes each decoding step's attention reads, and the memory a context takes), with K/V
# rounded to float16 as written (promptlookup.runtime.kv_cache). "auto" by default: the
# outputs of a float32 engine then stay those of float32 attention.
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
DEFAULT_KV_CACHE_DTYPE = "auto"
DEFAULT_COMPILE_MODE = "off"

# Drafting state that lives for the whole process is bounded, least recently used first
# (promptlookup.drafting.pool_index, .longest_mode). The pool mode's n-gram pools hold at
# most this many patterns (all sizes together; about n patterns per distinct token of text):
# the C pool holds about 130 bytes a pattern plus the tokens its matches refer to, the
# pure-Python pool about 400, so the default stays within a few hundred MB, well under the
# default KV pool (3 GB). DraftConfig.ngram_pool_max_patterns, --ngram_pool_max_patterns.
DEFAULT_NGRAM_POOL_MAX_PATTERNS = 1_000_000
# The longest mode's public text (finished requests' texts, one suffix automaton) keeps at
# most this many tokens, the most recent texts (about 100 bytes a token in C).
# DraftConfig.public_text_max_tokens, --public_text_max_tokens.
DEFAULT_PUBLIC_TEXT_MAX_TOKENS = 1_000_000
