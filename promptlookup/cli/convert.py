"""``convert_checkpoint.py``: HF Llama directory or GGUF file -> TensorRT-LLM checkpoint.

Flags follow TensorRT-LLM's ``examples/llama/convert_checkpoint.py``. Cheap checks (flags,
output location, the model directory's config and the tp/pp split, the GGUF magic) run
before torch is even imported, so most mistakes fail in well under a second.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..checkpoint.config import CHECKPOINT_KIND, DTYPE_CHOICES
from ..fsutil import check_output_dir
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


def _check_gguf_split(path: Path, tp_size: int, pp_size: int) -> None:
    """The GGUF model is a Llama that ``tp_size``/``pp_size`` can split (metadata only, no weights)."""
    from ..checkpoint.gguf_header import read_gguf_geometry
    from ..checkpoint.layout import Layout
    from ..errors import UserError

    arch, geometry = read_gguf_geometry(path)
    if arch != "llama":
        raise UserError(f"GGUF file {path} holds a {arch!r} model; only Llama models can be converted")
    required = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
    if all(k in geometry for k in required):  # otherwise the full load reports what is missing
        Layout.from_hf_config(geometry, tp_size, pp_size)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    source_flag = ("--model_dir", args.model_dir) if args.model_dir is not None else ("--gguf_file", args.gguf_file)
    check_output_dir(args.output_dir, CHECKPOINT_KIND, inputs=[source_flag])

    from ..checkpoint.layout import Layout
    from ..checkpoint.source import check_gguf_file, check_model_dir, load_source_model

    if args.model_dir is not None:  # validate the split before spending time on the weights
        Layout.from_hf_config(check_model_dir(args.model_dir), args.tp_size, args.pp_size)
    else:
        check_gguf_file(Path(args.gguf_file))
        _check_gguf_split(Path(args.gguf_file), args.tp_size, args.pp_size)
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
