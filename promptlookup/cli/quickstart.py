"""``quickstart_advanced.py``: TensorRT-LLM's PyTorch quickstart, on the LLM API.

    python quickstart_advanced.py --max_matching_ngram_size=2 --spec_decode_nextn=4

``--model_dir`` takes an engine directory, a Hugging Face Llama directory or a GGUF file
(converted and built once into the cache); without it, the bundled SmolLM2.
"""
from __future__ import annotations

import argparse

from ..errors import UserError
from .args import ArgumentParser, add_block_reuse_argument, add_pool_options

DEFAULT_PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
]
ALGORITHMS = ("NGRAM", "LOOKAHEAD", "NONE")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="quickstart_advanced.py", description="Generate with the promptlookup LLM API.")
    p.add_argument("--model_dir", default=None,
                   help="engine directory, Hugging Face Llama directory or GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--cache_dir", default=None, help="where converted models are built (default: ~/.cache/promptlookup)")
    p.add_argument("--prompt", action="append", default=None, help="a prompt; repeat for several")
    p.add_argument("--max_tokens", type=int, default=64, help="new tokens per prompt at most")
    p.add_argument("--spec_decode_algo", type=str.upper, choices=ALGORITHMS, default="NGRAM",
                   help="NGRAM: prompt lookup; LOOKAHEAD: Lookahead decoding; NONE: plain decoding")
    p.add_argument("--spec_decode_max_draft_len", type=int, default=None, help="draft length (default: --spec_decode_nextn)")
    p.add_argument("--spec_decode_nextn", type=int, default=4, help="draft length when --spec_decode_max_draft_len is not given")
    p.add_argument("--max_matching_ngram_size", type=int, default=2, help="NGRAM: longest n-gram matched")
    p.add_argument("--min_matching_ngram_size", type=int, default=1, help="NGRAM: shortest match that may draft")
    add_pool_options(p)
    p.add_argument("--max_window_size", type=int, default=4, help="LOOKAHEAD: window size W")
    p.add_argument("--max_ngram_size", type=int, default=3, help="LOOKAHEAD: n-gram size N")
    p.add_argument("--max_verification_set_size", type=int, default=4, help="LOOKAHEAD: verification set size G")
    add_block_reuse_argument(p, "requests")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top_k", type=int, default=0, help="0: no top-k filter")
    p.add_argument("--top_p", type=float, default=1.0, help="1.0: no nucleus filter")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ..api import LLM, KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed)
    spec = None
    if args.spec_decode_algo == "NGRAM":
        k = args.spec_decode_max_draft_len if args.spec_decode_max_draft_len is not None else args.spec_decode_nextn
        spec = NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=args.max_matching_ngram_size,
                                   min_matching_ngram_size=args.min_matching_ngram_size,
                                   is_keep_all=args.is_keep_all, is_use_oldest=args.is_use_oldest,
                                   is_public_pool=args.is_public_pool)
    elif args.spec_decode_algo == "LOOKAHEAD":
        spec = LookaheadDecodingConfig(args.max_window_size, args.max_ngram_size, args.max_verification_set_size)
    model = args.model_dir
    if model is None:
        from ..checkpoint.bundled import smollm2_gguf_path

        model = str(smollm2_gguf_path())
    prompts = args.prompt or DEFAULT_PROMPTS
    if any(not p for p in prompts):
        raise UserError("--prompt must not be empty")
    with LLM(model, speculative_config=spec, cache_dir=args.cache_dir, device=args.device,
             kv_cache_config=KvCacheConfig(enable_block_reuse=args.kv_cache_enable_block_reuse)) as llm:
        outputs = llm.generate(prompts, params)
        for i, out in enumerate(outputs):
            c = out.outputs[0]
            print(f"[{i}] Prompt: {out.prompt!r}, Generated text: {c.text!r}")
            print(f"    {len(c.token_ids)} tokens in {c.steps} steps ({c.tokens_per_step:.2f} tokens/step); "
                  f"drafted {c.drafted}, accepted {c.accepted} ({100 * c.acceptance_rate:.1f}%)")
    return 0
