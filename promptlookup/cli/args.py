"""Argument parsing shared by every entry point, with TensorRT-LLM's flag names."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Collection, NoReturn, Sequence

from ..defaults import (
    BACKENDS,
    COMPILE_MODES,
    CPU_WEIGHT_COPIES,
    DEFAULT_COMPILE_MODE,
    DEFAULT_BACKEND,
    DEFAULT_CPU_WEIGHT_COPIES,
    DEFAULT_DRAFT_LENGTH_POLICY,
    DEFAULT_DRAFTER_MODE,
    DEFAULT_IS_KEEP_ALL,
    DEFAULT_IS_PUBLIC_POOL,
    DEFAULT_IS_USE_OLDEST,
    DEFAULT_KV_CACHE_DTYPE,
    DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE,
    DEFAULT_MIN_MATCHING_NGRAM_SIZE,
    DEFAULT_WORKFLOW,
    DRAFT_LENGTH_POLICIES,
    KV_CACHE_DTYPES,
    WORKFLOWS,
)
from ..errors import UserError
from ..fsutil import ensure_writable
from ..literals import parse_list_literal


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` lists every option's default after its one-line description.

    Help that already states its default (it mentions "default") is left as written;
    switches read "(default: on/off)", options without a value "(default: none)".
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        if action.nargs == 0 and isinstance(action.default, bool):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default is None:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """The parser of every script: one-line errors with exit code 2, no prefix matching
    (``--max_tokens`` is refused, not read as ``--max_tokens_in_paged_kv_cache``) and
    defaults shown in ``--help``.

    After parsing, :attr:`given` holds the ``dest`` of every option the command line named
    (for checks such as :func:`require_lookup_config` that depend on what the user typed).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.given: frozenset[str] = frozenset()

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None):  # type: ignore[override]
        argv = sys.argv[1:] if args is None else [str(a) for a in args]
        result = super().parse_known_args(argv, namespace)
        given = set()
        for token in argv:
            if token == "--":
                break
            action = self._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("-") else None
            if action is not None:
                given.add(action.dest)
        self.given = frozenset(given)
        return result

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def finite_float(text: str) -> float:
    """An argparse ``type``: a finite float (``nan`` and ``inf`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def parse_prompt_lookup_config(text: str) -> tuple[int, int, list[int] | None]:
    """Parse TensorRT-LLM's ``--prompt_lookup_config "[k, n, [device ids]]"`` or its V2 form
    ``"[k, n]"`` (TensorRT-LLM's prompt-lookup README) safely.

    ``k`` is prompt_lookup_num_tokens (>= 1), ``n`` max_matching_ngram_size (>= 1), the
    device list names the GPUs of the target engine (non-negative, no repeats); without it
    the device list is None (the engine's own ranks).
    """
    hint = 'expected "[k, n]" or "[k, n, [devices]]", e.g. "[10,2]" or "[10,2,[0]]"'
    value = parse_list_literal(text, "--prompt_lookup_config", hint)
    if len(value) not in (2, 3):
        raise UserError(f"--prompt_lookup_config {text!r} must have 2 or 3 items; {hint}")
    k, n = value[0], value[1]
    for name, v in (("k (prompt_lookup_num_tokens)", k), ("n (max_matching_ngram_size)", n)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"--prompt_lookup_config: {name} must be an integer >= 1, got {v!r}; {hint}")
    if len(value) == 2:
        return k, n, None
    devices = value[2]
    if (
        not isinstance(devices, (list, tuple))
        or not devices
        or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices)
        or len(set(devices)) != len(devices)
    ):
        raise UserError(
            f"--prompt_lookup_config: the device list must be distinct non-negative integers, got {devices!r}; {hint}"
        )
    return k, n, list(devices)


def parse_draft_len_schedule(text: str | None, max_draft_len: int):
    """``--draft_len_schedule "{4:4, 8:2, 32:1}"`` (TensorRT-LLM's dict) as sorted pairs, or None."""
    if text is None:
        return None
    import ast

    from ..drafting.concurrency import normalize_schedule

    hint = 'expected "{batch_size: draft_len, ...}", e.g. "{4:4,8:2,32:1}"'
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise UserError(f"--draft_len_schedule {text!r} is malformed; {hint}") from None
    if not isinstance(value, dict):
        raise UserError(f"--draft_len_schedule {text!r} is not a dict; {hint}")
    return normalize_schedule(value, max_draft_len)


def add_pool_options(group: Any) -> None:
    """TensorRT-LLM's three n-gram pool switches (``--is_keep_all``, ``--is_use_oldest``,
    ``--is_public_pool`` and their ``--no-`` forms), on by default as there."""
    group.add_argument("--is_keep_all", action=argparse.BooleanOptionalAction, default=DEFAULT_IS_KEEP_ALL,
                       help="pool: keep every candidate continuation of a pattern, not only the latest")
    group.add_argument("--is_use_oldest", action=argparse.BooleanOptionalAction, default=DEFAULT_IS_USE_OLDEST,
                       help="pool: draft the oldest candidate of a pattern rather than the newest")
    group.add_argument("--is_public_pool", action=argparse.BooleanOptionalAction, default=DEFAULT_IS_PUBLIC_POOL,
                       help="pool: one pool shared by all requests rather than one per request; longest mode: "
                            "also match the text of finished requests")


def add_pool_limit_options(group: Any) -> None:
    """``--ngram_pool_max_patterns`` (pool mode) and ``--public_text_max_tokens`` (longest
    mode): the bounds on the drafter's process-wide state, least recently used evicted first
    (DraftConfig's fields of the same names; defaults in :mod:`promptlookup.defaults`)."""
    from ..defaults import DEFAULT_NGRAM_POOL_MAX_PATTERNS, DEFAULT_PUBLIC_TEXT_MAX_TOKENS

    group.add_argument("--ngram_pool_max_patterns", type=int, default=None, metavar="N",
                       help=f"pool mode: patterns an n-gram pool keeps, the least recently used evicted first "
                            f"(default {DEFAULT_NGRAM_POOL_MAX_PATTERNS:,}; about n patterns per token of text)")
    group.add_argument("--public_text_max_tokens", type=int, default=None, metavar="T",
                       help=f"longest mode: tokens of finished requests' text kept for the public match, the oldest "
                            f"texts dropped first (default {DEFAULT_PUBLIC_TEXT_MAX_TOKENS:,})")


def add_block_reuse_argument(group: Any, across: str) -> None:
    """``--kv_cache_enable_block_reuse`` (TensorRT-LLM's flag) and ``--no-kv_cache_enable_block_reuse``;
    on by default (:mod:`promptlookup.defaults`), unlike TensorRT-LLM's run.py."""
    group.add_argument("--kv_cache_enable_block_reuse", action=argparse.BooleanOptionalAction,
                       default=DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE,
                       help=f"reuse cached KV blocks across {across}")


def add_kv_fraction_argument(group: Any) -> None:
    """``--kv_cache_free_gpu_memory_fraction`` (TensorRT-LLM's flag and meaning), with its
    default and why that differs from TensorRT-LLM's."""
    group.add_argument("--kv_cache_free_gpu_memory_fraction", type=finite_float, default=None,
                       help="fraction in (0, 1] of the device memory free once the weights are loaded (GPU: "
                            "cudaMemGetInfo; CPU: MemAvailable) that the KV cache takes; with "
                            "--max_tokens_in_paged_kv_cache the smaller wins. Default: none, not TensorRT-LLM's 0.9: "
                            "on a CPU that would commit most of the RAM; PyTorch engines then hold 2 x "
                            "max_batch_size x max_seq_len tokens (TensorRT-LLM engines: TensorRT-LLM's own sizing)")


def add_kv_dtype_argument(group: Any) -> None:
    """``--kv_cache_dtype`` (quickstart_advanced.py's flag, TensorRT-LLM's KvCacheConfig.dtype):
    the KV cache's element type (:data:`promptlookup.defaults.KV_CACHE_DTYPES`)."""
    group.add_argument("--kv_cache_dtype", choices=KV_CACHE_DTYPES, default=DEFAULT_KV_CACHE_DTYPE,
                       help="PyTorch engines: the KV cache's element type. auto (default): the engine's dtype; float16 "
                            "halves a float32 engine's cache and the bytes each step's attention reads (K/V rounded "
                            "to float16 as written; greedy speculative output still equals plain output on it)")


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags shared by run.py and summarize.py (TensorRT-LLM's names where they exist)."""
    from ..drafting.base import DRAFT_MODES, POOL_RULES

    g = parser.add_argument_group("engine")
    g.add_argument("--engine_dir", default="engine_outputs", help="engine folder written by build.sh")
    g.add_argument("--tokenizer_dir", default=None, help="tokenizer folder; default: the engine directory")
    g.add_argument("--max_tokens_in_paged_kv_cache", type=int, default=None,
                   help="KV cache capacity in tokens; default: twice max_batch_size full sequences (PyTorch engines), "
                        "TensorRT-LLM's own sizing (TensorRT-LLM)")
    add_kv_fraction_argument(g)
    add_kv_dtype_argument(g)
    g.add_argument("--enable_chunked_context", action="store_true",
                   help="TensorRT-LLM: process long prompts in chunks (V1: ModelRunnerCpp's enable_chunked_context; "
                        "V2: the LLM API's enable_chunked_prefill)")
    add_block_reuse_argument(g, "calls")
    g.add_argument("--device", default="auto",
                   help="PyTorch engines: auto (default: the GPU when one is visible, else the CPU), cpu, cuda or cuda:N")
    g.add_argument("--cpu_weight_copies", type=int, choices=CPU_WEIGHT_COPIES, default=DEFAULT_CPU_WEIGHT_COPIES,
                   help="PyTorch engines on a CPU: 1 holds the weights once; 2 also keeps a second copy (with "
                        "the C kernels oneDNN's, for prefill; without them row-major, for plain steps), ~1.7x the memory")
    g.add_argument("--torch_compile", choices=COMPILE_MODES, default=DEFAULT_COMPILE_MODE,
                   help="PyTorch engines: inductor compiles each decoding step shape with torch.compile (seconds to "
                        "minutes per shape on a CPU); off (default) runs eagerly, which measured faster on a CPU")
    g.add_argument("--cuda_graph_mode", action=argparse.BooleanOptionalAction, default=None,
                   help="PyTorch engines on a GPU: replay captured CUDA graphs for decoding steps "
                        "(default: on when the engine runs on a GPU)")
    g.add_argument("--backend", choices=list(BACKENDS), default=DEFAULT_BACKEND,
                   help="auto: the backend the engine was built for; torch/trtllm: insist on that one")
    g = parser.add_argument_group("generation")
    g.add_argument("--end_id", type=int, default=None, help="token id that ends a sequence; default: the tokenizer's end-of-sequence id")
    g.add_argument("--use_chat_template", action="store_true", help="wrap text prompts as a chat request")
    g.add_argument("--temperature", type=finite_float, default=0.0, help="sampling temperature; 0 (default) is greedy decoding")
    g.add_argument("--top_k", type=int, default=0, help="sample from the k most likely tokens; 0: no limit")
    g.add_argument("--top_p", type=finite_float, default=1.0, help="sample from the smallest set with this probability")
    g.add_argument("--random_seed", type=int, default=0, help="seed of the sampler")
    g = parser.add_argument_group("prompt lookup")
    g.add_argument("--prompt_lookup_config", default=None,
                   help='turn prompt lookup on: "[k, n, [devices]]", e.g. "[10,2,[0]]", or "[k, n]" (TensorRT-LLM\'s V2 '
                        'form, e.g. "[10,2]": the engine\'s own devices); default: off (plain decoding)')
    g.add_argument("--ngram_config", default=None,
                   help="TensorRT-LLM 1.0's name for --prompt_lookup_config (same format)")
    g.add_argument("--workflow", choices=list(WORKFLOWS), default=DEFAULT_WORKFLOW,
                   help="v2: single call, the batch stays live inside the engine; v1: orchestrator loop, one engine "
                        "call per step (TensorRT-LLM's run.py)")
    g.add_argument("--drafter_mode", choices=list(DRAFT_MODES), default=DEFAULT_DRAFTER_MODE,
                   help="pool: TensorRT-LLM's n-gram pool; longest: the longest earlier match of the text's end")
    g.add_argument("--pool_rules", choices=list(POOL_RULES), default="auto",
                   help="pool mode: TensorRT-LLM V1's PLDPool (v1) or V2's NGramPoolManager (v2) rules; "
                        "auto: those of --workflow")
    g.add_argument(
        "--draft_length_policy",
        choices=list(DRAFT_LENGTH_POLICIES),
        default=DEFAULT_DRAFT_LENGTH_POLICY,
        help="cost: verify the part of each draft expected to pay off on this machine (PyTorch backend); "
        "full: always the whole draft, as TensorRT-LLM",
    )
    g.add_argument("--adaptive_draft", action="store_true", help="size drafts from match length and acceptance")
    add_pool_options(g)
    add_pool_limit_options(g)
    g.add_argument("--prompt_lookup_min_ngram", type=int, default=DEFAULT_MIN_MATCHING_NGRAM_SIZE,
                   help="draft only from matches of at least this many tokens (MLX's ngram_min; default 1: any)")
    g.add_argument("--prompt_lookup_candidates", type=int, default=1, metavar="G",
                   help="candidate continuations verified per step as one token tree (TensorRT-LLM's Lookahead "
                        "calls this the verification set size G); 1: one chain draft")
    g.add_argument("--max_concurrency", type=int, default=None,
                   help="speculation off while more than this many requests are live (TensorRT-LLM's "
                        "DecodingBaseConfig.max_concurrency; --backend trtllm)")
    g.add_argument("--draft_len_schedule", default=None,
                   help='draft length by live batch size, "{4:4,8:2,32:1}": sizes 1-4 draft 4, 5-8 draft 2, 9-32 draft '
                        "1, above: off (TensorRT-LLM's DecodingBaseConfig.draft_len_schedule; --backend trtllm)")
    g.add_argument("--lookahead_config", default=None,
                   help='Lookahead decoding "[W,N,G]": window size, n-gram size, verification set size, '
                        'e.g. "[4,3,4]"; with --prompt_lookup_config too, both work together')
    g.add_argument("--ngram_static_cache", "--lookup-cache-static", dest="ngram_static_cache", default=None,
                   help="persisted n-gram cache built offline (read only); this project's or llama.cpp's format")
    g.add_argument("--ngram_dynamic_cache", "--lookup-cache-dynamic", dest="ngram_dynamic_cache", default=None,
                   help="persisted n-gram cache that learns from outputs; this project's or llama.cpp's format")
    parser.add_argument("--output_json", default=None, help="write results and statistics as JSON")
    add_num_threads_argument(parser)
    return parser


# Flags that only shape prompt-lookup drafting: given without --prompt_lookup_config they
# would be silently ignored, so they are refused (dest -> flag).
LOOKUP_ONLY_FLAGS = {
    "workflow": "--workflow",
    "drafter_mode": "--drafter_mode",
    "draft_length_policy": "--draft_length_policy",
    "adaptive_draft": "--adaptive_draft",
    "is_keep_all": "--is_keep_all",
    "is_use_oldest": "--is_use_oldest",
    "is_public_pool": "--is_public_pool",
    "ngram_pool_max_patterns": "--ngram_pool_max_patterns",
    "public_text_max_tokens": "--public_text_max_tokens",
    "ngram_static_cache": "--ngram_static_cache",
    "ngram_dynamic_cache": "--ngram_dynamic_cache",
    "pool_rules": "--pool_rules",
    "prompt_lookup_candidates": "--prompt_lookup_candidates",
    "max_concurrency": "--max_concurrency",
    "draft_len_schedule": "--draft_len_schedule",
    "prompt_lookup_min_ngram": "--prompt_lookup_min_ngram",
}
WITH_LOOKAHEAD = ("workflow", "draft_length_policy")  # meaningful for --lookahead_config alone


def add_num_threads_argument(parser: argparse.ArgumentParser, default: int | None = None, *aliases: str) -> None:
    """``--num_threads`` (and ``aliases``); None resolves to :func:`promptlookup.threads.default_num_threads`."""
    from ..threads import MAX_DEFAULT_THREADS, default_num_threads

    described = (str(default) if default is not None else
                 f"$OMP_NUM_THREADS if set, else half the CPUs available to the process (2 of 2 or 3), at most {MAX_DEFAULT_THREADS} "
                 f"(here {default_num_threads()})")
    parser.add_argument("--num_threads", *aliases, type=int, default=default,
                        help=f"PyTorch CPU threads (keep it low on a shared machine); default: {described}")


def require_lookup_config(args: argparse.Namespace, given: Collection[str], allowed: Collection[str] = ()) -> None:
    """Refuse drafting flags (:data:`LOOKUP_ONLY_FLAGS`) named without ``--prompt_lookup_config``.

    ``given`` is :attr:`ArgumentParser.given`; ``allowed`` lists dests that are meaningful
    without it (summarize.py's sweep uses ``--workflow`` and ``--draft_length_policy``).
    """
    resolve_ngram_config(args)
    if args.prompt_lookup_config is not None:
        require_pool_mode_flags(args, given)
        return
    if getattr(args, "lookahead_config", None) is not None:
        allowed = {*allowed, *WITH_LOOKAHEAD}
    stray = [flag for dest, flag in LOOKUP_ONLY_FLAGS.items() if dest in given and dest not in allowed]
    if stray:
        verb, them = ("applies", "it") if len(stray) == 1 else ("apply", "them")
        raise UserError(f"{', '.join(stray)} {verb} only to prompt lookup, which is off; add --prompt_lookup_config "
                        f'"[k, n]" or "[k, n, [devices]]" (e.g. "[10,2,[0]]") or drop {them}')


def require_pool_mode_flags(args: argparse.Namespace, given: Collection[str]) -> None:
    """Refuse the pool's own flags (the drafter's ``POOL_ONLY_FIELDS``, flags of the same names)
    named with another ``--drafter_mode``, which would ignore them, and ``--is_public_pool``
    with the llama.cpp mode, which has no shared state of that kind. (The drafter refuses
    their non-default values too; this also catches a flag given at its default.)"""
    from ..drafting.drafter import POOL_ONLY_FIELDS

    mode = getattr(args, "drafter_mode", "pool")
    if mode == "pool":
        return
    stray = [f"--{dest}" for dest in POOL_ONLY_FIELDS if dest in given]
    if mode == "llamacpp" and "is_public_pool" in given:
        stray.append("--is_public_pool")
    if stray:
        verb = "applies" if len(stray) == 1 else "apply"
        raise UserError(f"{', '.join(stray)} {verb} to --drafter_mode pool, not {mode!r}, which would ignore "
                        f"{'it' if len(stray) == 1 else 'them'}; drop {'it' if len(stray) == 1 else 'them'}")


def runtime_from_args(args: argparse.Namespace):
    """``--device``, ``--cuda_graph_mode``, ``--torch_compile``, ``--cpu_weight_copies`` and
    ``--num_threads`` (its default resolved now) as one
    :class:`~promptlookup.runtime.options.RuntimeConfig` (passed whole to ``load_runner``)."""
    from ..runtime.options import RuntimeConfig
    from ..threads import resolve_num_threads

    return RuntimeConfig(device=args.device, cuda_graph_mode=args.cuda_graph_mode, compile_mode=args.torch_compile,
                         cpu_weight_copies=args.cpu_weight_copies, num_threads=resolve_num_threads(args.num_threads))


def check_ngram_cache_paths(args: argparse.Namespace) -> None:
    """Before anything loads: ``--ngram_static_cache`` exists, and ``--ngram_dynamic_cache`` (read
    where it exists, written at the end of the run) can be written and is not the static cache,
    so no run learns for minutes and then fails to save."""
    static, dynamic = getattr(args, "ngram_static_cache", None), getattr(args, "ngram_dynamic_cache", None)
    if static is not None and not Path(static).is_file():
        raise UserError(f"--ngram_static_cache {static} does not exist; create it with `python -m "
                        "promptlookup.cli.ngram_cache create`, or drop the flag")
    if dynamic is not None:
        ensure_writable(dynamic, "--ngram_dynamic_cache", inputs=[("--ngram_static_cache", static)])


def kv_cache_from_args(args: argparse.Namespace):
    """``--kv_cache_enable_block_reuse``, ``--max_tokens_in_paged_kv_cache``,
    ``--kv_cache_free_gpu_memory_fraction`` (refused outside (0, 1], by its flag's name) and
    ``--kv_cache_dtype`` as one :class:`~promptlookup.runtime.options.KvCacheConfig`."""
    from ..runtime.options import KvCacheConfig, require_fraction

    fraction = args.kv_cache_free_gpu_memory_fraction
    if fraction is not None:
        require_fraction("--kv_cache_free_gpu_memory_fraction", fraction)
    tokens = args.max_tokens_in_paged_kv_cache
    if tokens is not None and tokens < 1:
        raise UserError(f"--max_tokens_in_paged_kv_cache must be at least 1, got {tokens}; leave it out for the "
                        "default pool")
    return KvCacheConfig(args.kv_cache_enable_block_reuse, args.max_tokens_in_paged_kv_cache, fraction,
                         args.kv_cache_dtype)


def sampling_from_args(args: argparse.Namespace, given: Collection[str] = frozenset(), *,
                       seed: str | None = None):
    """The sampling flags as a SamplingConfig, checked by :func:`check_sampling_flags` (``seed``:
    the seed flag's dest where the command refuses it at ``--temperature 0``; summarize.py
    passes none, as it shuffles the dataset with ``--random_seed``)."""
    from ..runtime.base import SamplingConfig

    check_sampling_flags(args, given, seed=seed)
    return SamplingConfig(args.temperature, args.top_k, args.top_p, args.random_seed)


def check_sampling_flags(args: argparse.Namespace, given: Collection[str], *, seed: str | None = None) -> None:
    """``--temperature``, ``--top_k`` and ``--top_p`` in range, by their flag names; then, at
    ``--temperature 0`` (greedy decoding would ignore them), ``--top_k`` above 1, ``--top_p``
    below 1 and the seed flag (dest ``seed``, where given) refused when ``given`` (the dests the
    command line named) holds them (run.py, summarize.py, quickstart_advanced.py)."""
    for flag, value in (("--temperature", args.temperature), ("--top_p", args.top_p)):
        if not math.isfinite(value):
            raise UserError(f"{flag} must be a finite number, got {value}")
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k < 0:
        raise UserError(f"--top_k must be >= 0, got {args.top_k}")
    if not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top_p must be in (0, 1], got {args.top_p}")
    if args.temperature != 0:
        return
    unused = [f"--{dest} {getattr(args, dest)}" for dest, used in (("top_k", args.top_k > 1), ("top_p", args.top_p < 1))
              if dest in given and used]
    if unused:
        raise UserError(f"{', '.join(unused)} shape{'s' if len(unused) == 1 else ''} sampling, but --temperature is 0 "
                        "(greedy decoding, the default); add --temperature T > 0 (1.0: the model's own "
                        "distribution), or drop it")
    if seed is not None and seed in given:
        raise UserError(f"--{seed} seeds sampling, and --temperature 0 decodes greedily; drop --{seed}, or pass a "
                        "--temperature above 0")


def draft_from_args(args: argparse.Namespace):
    """The DraftConfig the flags ask for, or None without --prompt_lookup_config."""
    from ..drafting.base import DraftConfig

    resolve_ngram_config(args)
    if args.prompt_lookup_config is None:
        return None
    k, n, _devices = parse_prompt_lookup_config(args.prompt_lookup_config)
    return DraftConfig(
        prompt_lookup_num_tokens=k,
        max_matching_ngram_size=n,
        mode=args.drafter_mode,
        adaptive=args.adaptive_draft,
        dynamic_cache=args.ngram_dynamic_cache,
        **drafter_options_from_args(args),  # (its checks run before the schedule's)
        draft_len_schedule=parse_draft_len_schedule(getattr(args, "draft_len_schedule", None), k),
    )


def drafter_options_from_args(args: argparse.Namespace, *, needs_lookup_config: bool = True) -> dict[str, Any]:
    """The DraftConfig fields of the pool's and the drafter's own flags, apart from k, n, the
    mode, adaptive drafting, the dynamic cache and the schedule (what a summarize.py sweep point
    keeps from the command line; ``needs_lookup_config`` False: no --prompt_lookup_config needed)."""
    return dict(
        is_keep_all=args.is_keep_all,
        is_use_oldest=args.is_use_oldest,
        is_public_pool=args.is_public_pool,
        static_cache=args.ngram_static_cache,
        max_candidates=candidates_from_args(args, needs_lookup_config=needs_lookup_config),
        pool_rules=args.pool_rules,
        min_matching_ngram_size=args.prompt_lookup_min_ngram,
        max_concurrency=getattr(args, "max_concurrency", None),
        ngram_pool_max_patterns=getattr(args, "ngram_pool_max_patterns", None),
        public_text_max_tokens=getattr(args, "public_text_max_tokens", None),
    )


def candidates_from_args(args: argparse.Namespace, *, needs_lookup_config: bool = True) -> int:
    from ..drafting.base import MAX_CANDIDATES

    g = args.prompt_lookup_candidates
    if not 1 <= g <= MAX_CANDIDATES:
        raise UserError(f"--prompt_lookup_candidates must be in 1..{MAX_CANDIDATES}, got {g}; 1 is one chain draft")
    if g > 1 and needs_lookup_config and args.prompt_lookup_config is None:
        raise UserError("--prompt_lookup_candidates needs --prompt_lookup_config; add it (e.g. \"[10,2,[0]]\")")
    return g


def lookahead_from_args(args: argparse.Namespace):
    """The LookaheadConfig --lookahead_config asks for, or None."""
    if args.lookahead_config is None:
        return None
    from ..decoding.lookahead import parse_lookahead_config

    return parse_lookahead_config(args.lookahead_config)


def device_ids_from_args(args: argparse.Namespace) -> list[int] | None:
    resolve_ngram_config(args)
    if args.prompt_lookup_config is None:
        return None
    return parse_prompt_lookup_config(args.prompt_lookup_config)[2]


def resolve_ngram_config(args: argparse.Namespace) -> None:
    """Fold ``--ngram_config`` (TensorRT-LLM 1.0's name) into ``args.prompt_lookup_config``.

    Both may be given only with the same value (as parsed); idempotent.
    """
    alias = getattr(args, "ngram_config", None)
    if alias is None:
        return
    if args.prompt_lookup_config is not None and (
        parse_prompt_lookup_config(args.prompt_lookup_config) != parse_prompt_lookup_config(alias)
    ):
        raise UserError(f"--prompt_lookup_config {args.prompt_lookup_config!r} and --ngram_config {alias!r} differ; "
                        "give one of them")
    if args.prompt_lookup_config is None:
        args.prompt_lookup_config = alias
