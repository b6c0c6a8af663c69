"""Argument parsing shared by every entry point, with TensorRT-LLM's flag names."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def parse_prompt_lookup_config(text: str) -> tuple[int, int, list[int]]:
    """Parse TensorRT-LLM's ``--prompt_lookup_config "[k, n, [device ids]]"`` safely.

    ``k`` is prompt_lookup_num_tokens (>= 1), ``n`` max_matching_ngram_size (>= 1), the
    device list names the GPUs of the target engine (non-negative, no repeats).
    """
    import ast

    hint = 'expected "[k, n, [devices]]", e.g. "[10,2,[0]]"'
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UserError(f"--prompt_lookup_config {text!r} is malformed; {hint}") from None
    if not (isinstance(value, (list, tuple)) and len(value) == 3):
        raise UserError(f"--prompt_lookup_config {text!r} must have 3 items; {hint}")
    k, n, devices = value
    for name, v in (("k (prompt_lookup_num_tokens)", k), ("n (max_matching_ngram_size)", n)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"--prompt_lookup_config: {name} must be an integer >= 1, got {v!r}; {hint}")
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


def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags shared by run.py and summarize.py (TensorRT-LLM's names where they exist)."""
    from ..drafting.base import DRAFT_MODES

    g = parser.add_argument_group("engine")
    g.add_argument("--engine_dir", default="engine_outputs")
    g.add_argument("--tokenizer_dir", default=None, help="default: the engine directory")
    g.add_argument("--max_tokens_in_paged_kv_cache", type=int, default=None)
    g.add_argument("--kv_cache_enable_block_reuse", action="store_true", help="reuse cached KV blocks across calls")
    g.add_argument("--device", default="auto",
                   help="PyTorch engines: auto (default: the GPU when one is visible, else the CPU), cpu, cuda or cuda:N")
    g.add_argument("--cuda_graph_mode", action=argparse.BooleanOptionalAction, default=None,
                   help="PyTorch engines on a GPU: replay captured CUDA graphs for decoding steps "
                        "(default: on when the engine runs on a GPU)")
    g = parser.add_argument_group("generation")
    g.add_argument("--end_id", type=int, default=None, help="default: the tokenizer's end-of-sequence id")
    g.add_argument("--use_chat_template", action="store_true", help="wrap text prompts as a chat request")
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy decoding")
    g.add_argument("--top_k", type=int, default=0)
    g.add_argument("--top_p", type=float, default=1.0)
    g.add_argument("--random_seed", type=int, default=0)
    g = parser.add_argument_group("prompt lookup")
    g.add_argument("--prompt_lookup_config", default=None, help='"[k, n, [devices]]", e.g. "[10,2,[0]]"')
    g.add_argument("--workflow", choices=["v1", "v2"], default="v1", help="v1: orchestrator loop; v2: single call")
    g.add_argument("--drafter_mode", choices=list(DRAFT_MODES), default="pool")
    g.add_argument(
        "--draft_length_policy",
        choices=["cost", "full"],
        default="cost",
        help="cost: verify the part of each draft expected to pay off on this machine (PyTorch backend); "
        "full: always the whole draft, as TensorRT-LLM",
    )
    g.add_argument("--adaptive_draft", action="store_true", help="size drafts from match length and acceptance")
    g.add_argument("--is_keep_all", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--is_use_oldest", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--is_public_pool", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--prompt_lookup_min_ngram", type=int, default=1,
                   help="draft only from matches of at least this many tokens (MLX's ngram_min; default 1: any)")
    g.add_argument("--ngram_static_cache", default=None, help="persisted n-gram cache built offline (read only)")
    g.add_argument("--ngram_dynamic_cache", default=None, help="persisted n-gram cache that learns from outputs")
    parser.add_argument("--output_json", default=None, help="write results and statistics as JSON")
    return parser


def sampling_from_args(args: argparse.Namespace):
    from ..runtime.base import SamplingConfig

    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_k < 0:
        raise UserError(f"--top_k must be >= 0, got {args.top_k}")
    if not 0.0 < args.top_p <= 1.0:
        raise UserError(f"--top_p must be in (0, 1], got {args.top_p}")
    return SamplingConfig(args.temperature, args.top_k, args.top_p, args.random_seed)


def draft_from_args(args: argparse.Namespace):
    """The DraftConfig the flags ask for, or None without --prompt_lookup_config."""
    from ..drafting.base import DraftConfig

    if args.prompt_lookup_config is None:
        return None
    k, n, _devices = parse_prompt_lookup_config(args.prompt_lookup_config)
    return DraftConfig(
        prompt_lookup_num_tokens=k,
        max_matching_ngram_size=n,
        mode=args.drafter_mode,
        is_keep_all=args.is_keep_all,
        is_use_oldest=args.is_use_oldest,
        is_public_pool=args.is_public_pool,
        adaptive=args.adaptive_draft,
        static_cache=args.ngram_static_cache,
        dynamic_cache=args.ngram_dynamic_cache,
        min_matching_ngram_size=args.prompt_lookup_min_ngram,
    )


def device_ids_from_args(args: argparse.Namespace) -> list[int] | None:
    if args.prompt_lookup_config is None:
        return None
    return parse_prompt_lookup_config(args.prompt_lookup_config)[2]
