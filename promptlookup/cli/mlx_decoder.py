"""``python -m promptlookup.cli.mlx_decoder`` (``pld-mlx-decoder``): MLX's prompt-lookup example as a
command, with its hyphenated flags; errors name the flags, one line, exit 2."""
from __future__ import annotations

import argparse
import sys

from ..api.mlx_decoder import PromptLookupDecoder, check_arguments
from ..checkpoint.bundled import smollm2_gguf_path
from ..errors import run_cli
from .args import ArgumentParser


def flag_name(name: str) -> str:
    """The command-line flag of an MLX parameter: ``n_draft`` -> ``--n-draft``."""
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The script's flags: MLX's prompt-lookup example's names (hyphenated), plus --num-threads."""
    p = ArgumentParser(prog="python -m promptlookup.cli.mlx_decoder",
                       description="Prompt lookup decoding, MLX's example interface.")
    p.add_argument("--model-name", dest="model_name", default=None,
                   help="engine directory, Hugging Face Llama directory or GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=100, help="new tokens at most")
    p.add_argument("--n-draft", dest="n_draft", type=int, default=10, help="tokens drafted per match")
    p.add_argument("--ngram-max", dest="ngram_max", type=int, default=3, help="longest n-gram matched")
    p.add_argument("--ngram-min", dest="ngram_min", type=int, default=1, help="shortest n-gram matched")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature; 0: greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--color", action="store_true", help="highlight accepted draft tokens")
    p.add_argument("--num-threads", dest="num_threads", type=int, default=None,
                   help="PyTorch CPU threads (default: as run.py's --num_threads)")
    p.add_argument("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse, check every value (before loading the model, then against it), print the prompt,
    then generate."""
    from ..threads import configure_threads

    args = build_parser().parse_args(argv)
    configure_threads(args.num_threads, "--num-threads")
    check_arguments(args.prompt, max_tokens=args.max_tokens, n_draft=args.n_draft, ngram_max=args.ngram_max,
                    ngram_min=args.ngram_min, temp=args.temp, seed=args.seed, max_draft_len=sys.maxsize, name=flag_name)
    model = args.model_name
    if model is None:
        model = str(smollm2_gguf_path())
    decoder = PromptLookupDecoder(model, device=args.device)
    options = dict(max_tokens=args.max_tokens, n_draft=args.n_draft, ngram_max=args.ngram_max,
                   ngram_min=args.ngram_min, temp=args.temp, seed=args.seed, _name=flag_name)
    decoder.check(args.prompt, **options)  # nothing is printed before a refusal
    print(args.prompt, flush=True)
    decoder.prompt_lookup(args.prompt, color=args.color, **options)
    return 0


if __name__ == "__main__":
    run_cli(main)
