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
from ..checkpoint.quant_spec import DEFAULT_GROUP_SIZE, WEIGHT_ONLY_PRECISIONS, QuantSpec, check_spec
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


def _path(text: str) -> str:
    """A path argument; an empty one (as from an unset shell variable) would mean the working
    directory, so it is refused."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string (an unset shell variable?)")
    return text


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert a Hugging Face Llama directory or a GGUF file to a TensorRT-LLM checkpoint "
                    "(config.json + rank{N}.safetensors + tokenizer).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model_dir", type=_path,
                        help="Hugging Face Llama directory (config.json + safetensors/.bin weights)")
    source.add_argument("--gguf_file", type=_path, help="GGUF file of a Llama model (dequantized on load)")
    parser.add_argument("--output_dir", type=_path, default="tllm_checkpoint",
                        help="where to write the checkpoint (default: %(default)s)")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="storage dtype; auto keeps the source dtype but stores float32 as float16 (default: %(default)s)")
    parser.add_argument("--tp_size", type=_positive_int, default=1, help="tensor parallel size (default: %(default)s)")
    parser.add_argument("--pp_size", type=_positive_int, default=1, help="pipeline parallel size (default: %(default)s)")
    quant = parser.add_argument_group("weight-only quantization (TensorRT-LLM's flags)")
    quant.add_argument("--use_weight_only", action="store_true",
                       help="quantize the decoder's projections to int8/int4 (the embedding, LM head and norms stay "
                            "in --dtype)")
    quant.add_argument("--weight_only_precision", choices=WEIGHT_ONLY_PRECISIONS, default=None,
                       help="int8 (W8A16 per channel; W8A16_GPTQ with --per_group) or int4 (W4A16_GPTQ, needs "
                            "--per_group: per-channel int4 is refused as too inaccurate); default int8")
    quant.add_argument("--per_group", action="store_true",
                       help="one scale and zero per group of --group_size input columns (int8: W8A16_GPTQ, the "
                            "more accurate int8; int4: W4A16_GPTQ, required there)")
    quant.add_argument("--group_size", type=_positive_int, default=None,
                       help=f"columns per group with --per_group (default: {DEFAULT_GROUP_SIZE}; 32 takes a GGUF's "
                            f"Q4_0/Q4_1 blocks over exactly, and into int8 its Q8_0 blocks too)")
    quant.add_argument("--quantize_lm_head", action="store_true",
                       help="with --use_weight_only: quantize the LM head and the embedding table too, per vocabulary "
                            "row with the projections' precision and groups (one table when tied; TensorRT-LLM's "
                            "quantize.py flag; default: both stay in --dtype)")
    return parser


def quant_spec_from_args(args: argparse.Namespace) -> "QuantSpec | None":
    """The quantization the flags ask for (``None``: none); contradictory flags are a UserError.
    TensorRT-LLM ignores the precision flags without ``--use_weight_only``; here that is refused,
    since the checkpoint would silently stay unquantized."""
    from ..errors import UserError

    given = [flag for flag, value in (("--weight_only_precision", args.weight_only_precision),
                                      ("--per_group", args.per_group or None),
                                      ("--group_size", args.group_size),
                                      ("--quantize_lm_head", args.quantize_lm_head or None)) if value is not None]
    if not args.use_weight_only:
        if given:
            raise UserError(f"{given[0]} needs --use_weight_only (without it the checkpoint is not quantized)")
        return None
    precision = args.weight_only_precision or "int8"
    if args.group_size is not None and not args.per_group:
        raise UserError("--group_size applies with --per_group (W8A16_GPTQ/W4A16_GPTQ); add --per_group or drop it")
    if precision == "int4" and not args.per_group:
        raise UserError(f"--weight_only_precision int4 needs --per_group (per-channel int4 is too inaccurate: SmolLM2's "
                        f"ROUGE-1 falls from 16.2 to 4.7); add --per_group [--group_size N], default "
                        f"{DEFAULT_GROUP_SIZE} (32 takes a GGUF's Q4_0/Q4_1 blocks over exactly)")
    return QuantSpec(precision, (args.group_size or DEFAULT_GROUP_SIZE) if args.per_group else None,
                     lm_head=args.quantize_lm_head)


def _check_gguf_split(path: Path, tp_size: int, pp_size: int) -> "Layout | None":
    """The GGUF model is a Llama that ``tp_size``/``pp_size`` can split (metadata only, no
    weights); its layout, or ``None`` when the metadata lacks sizes (the full load checks)."""
    from ..checkpoint.gguf_header import read_gguf_geometry
    from ..checkpoint.layout import Layout
    from ..errors import UserError

    arch, geometry = read_gguf_geometry(path)
    if arch != "llama":
        raise UserError(f"GGUF file {path} holds a {arch!r} model; only Llama models can be converted")
    required = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
    if all(k in geometry for k in required):  # otherwise the full load reports what is missing
        return Layout.from_hf_config(geometry, tp_size, pp_size)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quant = quant_spec_from_args(args)
    source_flag = ("--model_dir", args.model_dir) if args.model_dir is not None else ("--gguf_file", args.gguf_file)
    check_output_dir(args.output_dir, CHECKPOINT_KIND, inputs=[source_flag])

    from ..checkpoint.layout import Layout
    from ..checkpoint.source import check_gguf_file, check_model_dir, load_source_model

    if args.model_dir is not None:  # validate the split before spending time on the weights
        layout = Layout.from_hf_config(check_model_dir(args.model_dir), args.tp_size, args.pp_size)
    else:
        check_gguf_file(Path(args.gguf_file))
        layout = _check_gguf_split(Path(args.gguf_file), args.tp_size, args.pp_size)
    if quant is not None and layout is not None:
        check_spec(quant, layout)
    from ..checkpoint.convert import convert_model

    source = args.model_dir or args.gguf_file
    print(f"loading {source} ...", flush=True)
    start = time.perf_counter()
    model, tokenizer = load_source_model(model_dir=args.model_dir, gguf_file=args.gguf_file)
    prequantized = None
    if quant is not None and args.gguf_file is not None:
        from ..checkpoint.gguf_blocks import prequantized_from_gguf

        prequantized, notes = prequantized_from_gguf(Path(args.gguf_file), quant, model.config)
        for note in notes:
            print(f"note: {note}")
    out = convert_model(model, tokenizer, args.output_dir, dtype=args.dtype,
                        tp_size=args.tp_size, pp_size=args.pp_size, progress=True,
                        quant=quant, prequantized=prequantized)

    cfg = json.loads((out / "config.json").read_text())
    params = sum(p.numel() for p in model.parameters())
    print(f"converted {source}: Llama, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"{cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads, vocab {cfg['vocab_size']}, "
          f"{params / 1e6:.1f}M parameters")
    print(f"wrote config.json and {cfg['mapping']['world_size']} rank file(s) (tp_size={args.tp_size}, "
          f"pp_size={args.pp_size}, dtype {cfg['dtype']}) in {time.perf_counter() - start:.1f}s")
    if quant is not None:
        grouping = f"groups of {quant.group_size}" if quant.group_size else "one scale per output channel"
        rest = ("embedding table and LM head too (--quantize_lm_head)" if quant.lm_head
                else f"embedding and LM head kept in {cfg['dtype']}")
        print(f"quantized the decoder's projections: {quant.quant_algo} ({quant.precision}, {grouping}); {rest}")
    if tokenizer is None:
        print("note: no tokenizer found in the model directory; later stages need --tokenizer_dir")
    else:
        print("saved the tokenizer (and chat template) alongside the weights")
    print(f"checkpoint: {out.resolve()}")
    return 0


if __name__ == "__main__":  # python -m promptlookup.cli.convert = python convert_checkpoint.py
    from ..errors import run_cli

    run_cli(main)
