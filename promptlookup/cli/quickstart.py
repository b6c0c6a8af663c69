"""``quickstart_advanced.py``: TensorRT-LLM's PyTorch quickstart, on the LLM API.

    python quickstart_advanced.py --spec_decode_algo NGRAM --max_matching_ngram_size=2 \\
        --spec_decode_max_draft_len=4 --prompt "A" "B"

``--model_dir`` takes an engine directory, a Hugging Face Llama directory or a GGUF file
(converted and built once into the cache); without it, the bundled SmolLM2.

The flags are TensorRT-LLM's ``examples/llm-api/quickstart_advanced.py`` flags, with its
names; each is honoured or refused in one line (exit 2), never accepted and ignored.
Defaults that differ from TensorRT-LLM's say why in ``--help``. Limits (``--max_seq_len``,
``--max_batch_size``) build a model source with them, and bound an engine directory's own
limits (a value above the engine's is refused: rebuild). ``--max_batch_size`` and
``--max_num_tokens`` split the prompts into batches that fit, so at most that many
sequences, and tokens (prompt plus ``--max_tokens``), are in flight at once.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ..defaults import DEFAULT_LOOKAHEAD, DEFAULT_MAX_MATCHING_NGRAM_SIZE, DEFAULT_MIN_MATCHING_NGRAM_SIZE
from ..errors import UserError
from ..runtime.options import require_fraction
from .args import (ArgumentParser, add_block_reuse_argument, add_kv_dtype_argument, add_num_threads_argument,
                   add_pool_options, check_sampling_flags)

DEFAULT_PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
]
ALGORITHMS = ("NGRAM", "LOOKAHEAD", "NONE")
# each algorithm's own flags (dests): named with another --spec_decode_algo they are refused
ALGORITHM_FLAGS = {
    "NGRAM": ("spec_decode_max_draft_len", "max_matching_ngram_size", "min_matching_ngram_size", "is_keep_all",
              "is_use_oldest", "is_public_pool"),
    "LOOKAHEAD": ("max_window_size", "max_ngram_size", "max_verification_set_size"),
}
TRTLLM_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default, kept


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="quickstart_advanced.py", description="Generate with the promptlookup LLM API.")
    p.add_argument("--model_dir", default=None,
                   help="engine directory, Hugging Face Llama directory or GGUF file (default: the bundled SmolLM2; "
                        "TensorRT-LLM requires it)")
    p.add_argument("--cache_dir", default=None, help="where converted models are built (default: ~/.cache/promptlookup)")
    p.add_argument("--prompt", nargs="+", action="extend", default=None,
                   help="one or several prompts (--prompt A B, or --prompt repeated)")
    g = p.add_argument_group("build config")
    g.add_argument("--max_seq_len", type=int, default=None,
                   help="longest sequence (prompt + new tokens); default: the engine's (3072 for a model built here, "
                        "cut to its max_position_embeddings)")
    g.add_argument("--max_batch_size", type=int, default=None,
                   help="sequences generated at once; default: the engine's (8 for a model built here; not TensorRT-LLM's "
                        "2048: a PyTorch engine's KV cache holds 2 x max_batch_size x max_seq_len tokens up front)")
    g.add_argument("--max_num_tokens", type=int, default=TRTLLM_MAX_NUM_TOKENS,
                   help="tokens (prompt + max_tokens) of all sequences in one batch at most")
    g = p.add_argument_group("KV cache")
    g.add_argument("--disable_kv_cache_reuse", action="store_true", help="turn prefix block reuse across requests off")
    add_block_reuse_argument(g, "requests")
    g.add_argument("--kv_cache_fraction", type=float, default=None,
                   help="fraction in (0, 1] of the device memory free once the weights are loaded (GPU: "
                        "cudaMemGetInfo; CPU: MemAvailable) that the KV cache takes (default: none, not TensorRT-LLM's "
                        "0.9: on a CPU that would commit most of the RAM; the KV cache then holds 2 x max_batch_size "
                        "x max_seq_len tokens)")
    add_kv_dtype_argument(g)
    g = p.add_argument_group("sampling")
    g.add_argument("--max_tokens", type=int, default=64, help="new tokens per prompt at most")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (default: 0, greedy, as TensorRT-LLM's unset temperature)")
    g.add_argument("--top_k", type=int, default=0, help="0: no top-k filter")
    g.add_argument("--top_p", type=float, default=1.0, help="1.0: no nucleus filter")
    g.add_argument("--seed", type=int, default=0, help="sampling seed")
    g.add_argument("--n", type=int, default=1, help="sequences per prompt (above 1 where the LLM API has n)")
    g.add_argument("--max_beam_width", type=int, default=1, help="beam search is not supported: only 1 is accepted")
    g.add_argument("--logprobs", action="store_true",
                   help="print each generated token's log-probability, the raw model's, with the most likely "
                        "alternative ({token id: Logprob(logprob, rank, decoded_token)} per token, as "
                        "CompletionOutput.logprobs)")
    g.add_argument("--apply_chat_template", action="store_true",
                   help="wrap each prompt as a user message in the tokenizer's chat template")
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec_decode_algo", type=str.upper, choices=ALGORITHMS, default="NGRAM",
                   help="NGRAM: prompt lookup; LOOKAHEAD: Lookahead decoding; NONE: plain decoding (default: NGRAM, "
                        "not TensorRT-LLM's none: this quickstart demonstrates prompt lookup)")
    g.add_argument("--spec_decode_max_draft_len", "--spec_decode_nextn", dest="spec_decode_max_draft_len", type=int,
                   default=4,
                   help="NGRAM: draft length k; --spec_decode_nextn is its old name (default: 4, not TensorRT-LLM's 1: "
                        "a one-token draft saves at most one step in two, 4 was the best on the bundled model)")
    g.add_argument("--max_matching_ngram_size", type=int, default=DEFAULT_MAX_MATCHING_NGRAM_SIZE,
                   help="NGRAM: longest n-gram matched (default: 2, not TensorRT-LLM's 5: with TensorRT-LLM's pool rule "
                        "a long pattern matches rarely, and 2 accepted more tokens per step on the bundled model)")
    g.add_argument("--min_matching_ngram_size", type=int, default=DEFAULT_MIN_MATCHING_NGRAM_SIZE,
                   help="NGRAM: shortest match that may draft")
    add_pool_options(g)
    w, n, g_size = DEFAULT_LOOKAHEAD
    g.add_argument("--max_window_size", type=int, default=w, help="LOOKAHEAD: window size W")
    g.add_argument("--max_ngram_size", type=int, default=n, help="LOOKAHEAD: n-gram size N")
    g.add_argument("--max_verification_set_size", type=int, default=g_size, help="LOOKAHEAD: verification set size G")
    g = p.add_argument_group("runtime")
    add_num_threads_argument(g)
    g.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _supports(field: str) -> bool:
    """Whether the LLM API's SamplingParams has ``field`` (``n``)."""
    from ..api import SamplingParams

    return field in {f.name for f in dataclasses.fields(SamplingParams)}


def check_args(args: argparse.Namespace) -> None:
    """Refuse, in one line, what this quickstart cannot honour; before any model is loaded."""
    for flag in ("max_seq_len", "max_batch_size", "max_num_tokens", "max_tokens", "spec_decode_max_draft_len",
                 "max_matching_ngram_size", "min_matching_ngram_size", "max_window_size", "max_ngram_size",
                 "max_verification_set_size"):  # by the flag's name (the LLM API's checks name its own fields)
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"--{flag} must be at least 1, got {value}")
    if args.max_beam_width != 1:
        raise UserError(f"--max_beam_width {args.max_beam_width}: beam search is not supported (prompt lookup verifies "
                        "one sequence per request); leave it at 1")
    if args.kv_cache_fraction is not None:
        require_fraction("--kv_cache_fraction", args.kv_cache_fraction)
    if args.n < 1:
        raise UserError(f"--n must be at least 1, got {args.n}")
    if args.n > 1 and not _supports("n"):
        raise UserError(f"--n {args.n}: the promptlookup LLM API returns one sequence per prompt; leave it at 1")
    given = getattr(args, "given", ())
    if args.disable_kv_cache_reuse and "kv_cache_enable_block_reuse" in given and args.kv_cache_enable_block_reuse:
        raise UserError("--disable_kv_cache_reuse and --kv_cache_enable_block_reuse contradict each other; pass one")
    unread = [f"--{dest}" for algo, dests in ALGORITHM_FLAGS.items() if algo != args.spec_decode_algo
              for dest in dests if dest in given]
    if unread:
        raise UserError(f"{', '.join(unread)} {'applies' if len(unread) == 1 else 'apply'} to another "
                        f"--spec_decode_algo than {args.spec_decode_algo}, which would ignore "
                        f"{'it' if len(unread) == 1 else 'them'}; drop {'it' if len(unread) == 1 else 'them'}")
    check_sampling_flags(args, given, seed="seed")
    from ..api.model_cache import is_engine_dir

    if args.model_dir is not None and is_engine_dir(Path(args.model_dir)):  # its limits, from config.json alone
        from ..engine.config import read_engine_config

        limits = read_engine_config(args.model_dir).limits
        _engine_limits(limits, args)
        k = args.spec_decode_max_draft_len
        if args.spec_decode_algo == "NGRAM" and k > limits.max_draft_len:
            raise UserError(f"--spec_decode_max_draft_len {k} exceeds the engine's max_draft_len "
                            f"{limits.max_draft_len}; lower it or rebuild the engine with build.sh --max_draft_len {k}")


def batches(lengths: list[int], max_tokens: int, max_batch_size: int, max_num_tokens: int) -> list[list[int]]:
    """Indices of the prompts split, in order, into batches of at most ``max_batch_size``
    prompts whose ``prompt + max_tokens`` totals stay within ``max_num_tokens``."""
    out: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        need = n + max_tokens
        if need > max_num_tokens:
            raise UserError(f"prompt {i} needs {need} tokens ({n} + --max_tokens {max_tokens}), more than "
                            f"--max_num_tokens {max_num_tokens}; raise --max_num_tokens or lower --max_tokens")
        if out[-1] and (len(out[-1]) == max_batch_size or used + need > max_num_tokens):
            out.append([])
            used = 0
        out[-1].append(i)
        used += need
    return out


def _engine_limits(limits: Any, args: argparse.Namespace) -> tuple[int, int]:
    """(max_seq_len, max_batch_size) to apply: the flags, refused above the engine's own
    (``limits``: its :class:`~promptlookup.engine.config.EngineLimits`)."""
    seq, batch = limits.max_seq_len, limits.max_batch_size
    if args.max_seq_len is not None:
        if args.max_seq_len > seq:
            raise UserError(f"--max_seq_len {args.max_seq_len} exceeds the engine's max_seq_len {seq}; lower it or "
                            f"rebuild the engine with build.sh --max_seq_len {args.max_seq_len}")
        seq = args.max_seq_len
    if args.max_batch_size is not None:
        if args.max_batch_size > batch:
            raise UserError(f"--max_batch_size {args.max_batch_size} exceeds the engine's max_batch_size {batch}; "
                            f"lower it or rebuild the engine with build.sh --max_batch_size {args.max_batch_size}")
        batch = args.max_batch_size
    return seq, batch


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = parser.given
    check_args(args)
    if args.model_dir is not None:
        from ..api.model_cache import existing_source

        existing_source(args.model_dir)  # before torch loads (seconds)
    from ..threads import configure_threads

    configure_threads(args.num_threads)
    from ..api import LLM, KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, SamplingParams
    from ..api.model_cache import AutoBuild, is_engine_dir

    extra: dict[str, Any] = {}
    if args.n > 1:
        extra["n"] = args.n
    if args.logprobs:
        extra["logprobs"] = 1
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, **extra)
    spec = None
    if args.spec_decode_algo == "NGRAM":
        spec = NGramDecodingConfig(max_draft_len=args.spec_decode_max_draft_len,
                                   max_matching_ngram_size=args.max_matching_ngram_size,
                                   min_matching_ngram_size=args.min_matching_ngram_size,
                                   is_keep_all=args.is_keep_all, is_use_oldest=args.is_use_oldest,
                                   is_public_pool=args.is_public_pool)
    elif args.spec_decode_algo == "LOOKAHEAD":
        spec = LookaheadDecodingConfig(args.max_window_size, args.max_ngram_size, args.max_verification_set_size)
    model = args.model_dir
    if model is None:
        from ..checkpoint.bundled import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    build = None  # an engine directory is used as it is (its limits bound the ones asked for)
    if not is_engine_dir(Path(model)):  # a model source: build it with the limits asked for
        build = dataclasses.replace(AutoBuild(), **{k: v for k, v in (("max_seq_len", args.max_seq_len),
                                                                     ("max_batch_size", args.max_batch_size))
                                                    if v is not None})
    prompts = args.prompt or DEFAULT_PROMPTS
    if any(not p for p in prompts):
        raise UserError("--prompt must not be empty")
    reuse = args.kv_cache_enable_block_reuse and not args.disable_kv_cache_reuse
    with LLM(model, speculative_config=spec, cache_dir=args.cache_dir, device=args.device, build=build,
             kv_cache_config=KvCacheConfig(enable_block_reuse=reuse, free_gpu_memory_fraction=args.kv_cache_fraction,
                                           dtype=args.kv_cache_dtype)) as llm:
        if args.apply_chat_template:
            from ..text import has_chat_template

            if not has_chat_template(llm.tokenizer):
                raise UserError("--apply_chat_template: this model's tokenizer has no chat template")
            prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                         add_generation_prompt=True) for p in prompts]
        max_seq_len, max_batch_size = _engine_limits(llm.limits, args)
        lengths = [len(llm.encode(p)[1]) for p in prompts]
        for i, n in enumerate(lengths):
            if n + args.max_tokens > max_seq_len:
                raise UserError(f"prompt {i} has {n} tokens; with --max_tokens {args.max_tokens} that exceeds "
                                f"max_seq_len {max_seq_len}; lower --max_tokens or shorten the prompt")
        for batch in batches(lengths, args.max_tokens, max_batch_size, args.max_num_tokens):
            outputs = llm.generate([prompts[i] for i in batch], params)
            for i, out in zip(batch, outputs):
                several = len(out.outputs) > 1
                for j, c in enumerate(out.outputs):
                    tag = f"[{i}][{j}]" if several else f"[{i}]"
                    print(f"{tag} Prompt: {out.prompt!r}, Generated text: {c.text!r}")
                    print(f"    {len(c.token_ids)} tokens in {c.steps} steps ({c.tokens_per_step:.2f} tokens/step); "
                          f"drafted {c.drafted}, accepted {c.accepted} ({100 * c.acceptance_rate:.1f}%)")
                    if args.logprobs:
                        print(f"{tag} Logprobs: {c.logprobs}")
    return 0
