"""``convert_checkpoint.py``: HF Llama directory or GGUF file -> TensorRT-LLM checkpoint.

Flags follow TensorRT-LLM's ``examples/llama/convert_checkpoint.py``. Cheap checks (flags,
output location, the model directory's config and the tp/pp split, the GGUF magic) run
before torch is even imported, so most mistakes fail in well under a second.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ..checkpoint.config import DTYPE_CHOICES
from ..errors import UserError
from .args import ArgumentParser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert a Hugging Face Llama directory or a GGUF file to a TensorRT-LLM checkpoint "
                    "(config.json + rank{N}.safetensors + tokenizer).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model_dir", help="Hugging Face Llama directory (config.json + safetensors/.bin weights)")
    source.add_argument("--gguf_file", help="GGUF file of a Llama model (dequantized on load)")
    parser.add_argument("--output_dir", default="tllm_checkpoint", help="where to write the checkpoint (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="storage dtype; auto keeps the source dtype but stores float32 as float16 (default: %(default)s)")
    parser.add_argument("--tp_size", type=_positive_int, default=1, help="tensor parallel size (default: %(default)s)")
    parser.add_argument("--pp_size", type=_positive_int, default=1, help="pipeline parallel size (default: %(default)s)")
    return parser


def _check_output_location(output_dir: str) -> None:
    """Fail early (creating nothing) if ``output_dir`` cannot be written."""
    target = Path(output_dir)
    if target.exists() and not target.is_dir():
        raise UserError(f"output path {target} exists and is not a directory; remove it or choose another path")
    ancestor = target.resolve().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"cannot create output directory {target}: {ancestor} is not a directory; choose a writable path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"output location {ancestor} is not writable; choose a writable path")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_output_location(args.output_dir)

    from ..checkpoint.layout import Layout
    from ..checkpoint.source import check_gguf_file, check_model_dir, load_source_model

    if args.model_dir is not None:  # validate the split before spending time on the weights
        Layout.from_hf_config(check_model_dir(args.model_dir), args.tp_size, args.pp_size)
    else:
        check_gguf_file(Path(args.gguf_file))
    from ..checkpoint.convert import convert_model

    source = args.model_dir or args.gguf_file
    print(f"loading {source} ...", flush=True)
    start = time.perf_counter()
    model, tokenizer = load_source_model(model_dir=args.model_dir, gguf_file=args.gguf_file)
    out = convert_model(model, tokenizer, args.output_dir, dtype=args.dtype,
                        tp_size=args.tp_size, pp_size=args.pp_size, progress=True)

    cfg = json.loads((out / "config.json").read_text())
    params = sum(p.numel() for p in model.parameters())
    print(f"converted {source}: Llama, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, vocab {cfg['vocab_size']}, "
          f"{params / 1e6:.1f}M parameters")
    print(f"wrote config.json and {cfg['mapping']['world_size']} rank file(s) (tp_size={args.tp_size}, "
          f"pp_size={args.pp_size}, dtype {cfg['dtype']}) in {time.perf_counter() - start:.1f}s")
    if tokenizer is None:
        print("note: no tokenizer found in the model directory; later stages need --tokenizer_dir")
    else:
        print("saved the tokenizer (and chat template) alongside the weights")
    print(f"checkpoint: {out.resolve()}")
    return 0
