"""``build.sh``: build an engine from a converted checkpoint (trtllm-build's flags)."""
from __future__ import annotations

import time
from pathlib import Path

from ..checkpoint.config import quant_spec_of, read_checkpoint_config
from ..defaults import COMPILE_MODES, DEFAULT_COMPILE_MODE
from ..engine.build import (BACKENDS, GEMM_PLUGINS, SPECULATIVE_MODES, build_config, build_torch_engine,
                            check_build_flags, resolve_backend)
from ..engine.config import ENGINE_KIND
from ..errors import UserError
from ..fsutil import check_output_dir
from .args import ArgumentParser, add_num_threads_argument


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="build.sh", description="Build an engine from a TensorRT-LLM checkpoint.")
    p.add_argument("--checkpoint_dir", required=True, help="output of convert_checkpoint.py")
    p.add_argument("--output_dir", default="engine_outputs",
                   help="engine folder; an existing one is replaced only if build.sh wrote it (or it is empty)")
    p.add_argument("--max_batch_size", type=int, default=8, help="most sequences decoded together")
    p.add_argument("--max_input_len", type=int, default=1024, help="longest prompt in tokens")
    p.add_argument("--max_seq_len", type=int, default=None,
                   help="longest prompt + output; default: max_input_len + 1024, within the model's limit")
    p.add_argument("--max_draft_len", type=int, default=0,
                   help="most draft tokens verified per step (>= prompt_lookup_num_tokens at run time); needs "
                        "--speculative_decoding_mode, and that mode needs it (default: 0, an engine without drafts)")
    p.add_argument("--speculative_decoding_mode", choices=list(SPECULATIVE_MODES), default=None,
                   help="draft_tokens_external: verify drafts made outside the engine (prompt lookup); "
                        "lookahead_decoding: Lookahead (run.py --lookahead_config); PyTorch engines serve both, "
                        "sized by --max_draft_len, which either mode requires (trtllm-build would build it with "
                        "max_draft_len 0, verifying no draft; build.sh refuses that)")
    p.add_argument("--use_paged_context_fmha", choices=["enable", "disable"], default="enable",
                   help="paged context attention, needed for KV block reuse (disable: the engine runs without block "
                        "reuse)")
    p.add_argument("--gemm_plugin", choices=GEMM_PLUGINS, default="auto",
                   help="trtllm-build's GEMM plugin dtype; a PyTorch engine takes auto, disable or the checkpoint's "
                        "dtype (its products run in that dtype)")
    p.add_argument("--tokens_per_block", type=int, default=32, help="KV cache block size in tokens (a power of two)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="trtllm: the real trtllm-build; torch: a PyTorch engine; auto: trtllm where it can run")
    p.add_argument("--step_costs", choices=["measure", "none"], default=None,
                   help="PyTorch engines: measure the relative cost of each step size now, on --device, and store "
                        "it for run.py's cost-aware draft policy (none: run.py verifies full drafts); default: measure "
                        "for a PyTorch engine (a TensorRT-LLM engine stores none, and refuses measure)")
    p.add_argument("--torch_compile", choices=COMPILE_MODES, default=DEFAULT_COMPILE_MODE,
                   help="PyTorch engines: inductor compiles every decoding step shape now, on --device, and stores "
                        "torch.compile's caches in the engine, so that run.py --torch_compile inductor loads them "
                        "instead of compiling (off: nothing is compiled at build)")
    p.add_argument("--device", default=None,
                   help="PyTorch engines: where to measure step costs and compile (auto: the GPU when one is visible, "
                        "else the CPU; default: auto); refused when nothing is measured or compiled")
    add_num_threads_argument(p)  # step costs are measured with run.py's default thread count; refused when nothing
    # is measured or compiled
    return p


def parse_args(argv: list[str] | None):
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    compile_ahead = args.torch_compile != DEFAULT_COMPILE_MODE
    # Checks that need neither the checkpoint nor torch come first (importing torch takes seconds).
    check_build_flags(max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                      max_seq_len=args.max_seq_len, max_draft_len=args.max_draft_len,
                      speculative_decoding_mode=args.speculative_decoding_mode, tokens_per_block=args.tokens_per_block)
    if args.num_threads is not None:
        from ..threads import resolve_num_threads

        resolve_num_threads(args.num_threads)
    if args.step_costs == "none" and not compile_ahead:
        _refuse_unread(args, "--step_costs none with --torch_compile off does neither", "pass --step_costs measure")
    if compile_ahead and args.backend == "trtllm":
        raise UserError(f"--torch_compile {args.torch_compile} applies to PyTorch engines; drop it for --backend trtllm")
    backend = resolve_backend(args.backend)
    if compile_ahead and backend == "trtllm":
        raise UserError(f"--torch_compile {args.torch_compile} applies to PyTorch engines, and --backend auto chose "
                        "TensorRT-LLM here; pass --backend torch, or drop --torch_compile")
    if backend == "trtllm" and args.backend == "trtllm":
        if args.step_costs == "measure":
            raise UserError("--step_costs measure applies to PyTorch engines; drop it for --backend trtllm")
        _refuse_unread(args, "--backend trtllm builds a TensorRT-LLM engine", None)
    elif backend == "trtllm":
        if args.step_costs == "measure":
            raise UserError("--step_costs measure applies to PyTorch engines, and --backend auto chose TensorRT-LLM "
                            "here; pass --backend torch, or drop --step_costs")
        _refuse_unread(args, "--backend auto chose TensorRT-LLM here", "pass --backend torch")
    if backend == "trtllm" and args.max_draft_len < 1:  # trtllm-build runs after the checkpoint is read
        raise UserError("a TensorRT-LLM engine is built with --speculative_decoding_mode draft_tokens_external, "
                        "which needs --max_draft_len of at least 1; pass e.g. --max_draft_len 10")
    step_costs = args.step_costs or "measure"
    compile_device = None
    if compile_ahead:
        from ..engine.compile_cache import check_can_compile

        compile_device = check_can_compile(args.device or "auto")  # before anything is loaded
    ckpt = Path(args.checkpoint_dir)
    check_output_dir(args.output_dir, ENGINE_KIND, inputs=[("--checkpoint_dir", ckpt)])
    pretrained = read_checkpoint_config(ckpt)
    quant = quant_spec_of(pretrained)
    if quant is not None:
        if backend == "trtllm":
            raise UserError(f"{ckpt} is a {quant.quant_algo} checkpoint in this project's int8/int4 layout "
                            "(docs/checkpoint.md), which trtllm-build cannot read; pass --backend torch, or convert "
                            "with TensorRT-LLM's own convert_checkpoint.py")
        if compile_ahead:
            raise UserError(f"--torch_compile {args.torch_compile} cannot trace the int8/int4 products of a "
                            f"{quant.quant_algo} checkpoint; drop --torch_compile")
    dtype = str(pretrained.get("dtype", "float32"))
    if backend != "trtllm" and args.gemm_plugin not in ("auto", "disable", dtype):
        raise UserError(f"--gemm_plugin {args.gemm_plugin}: a PyTorch engine computes its products in the "
                        f"checkpoint's {dtype}; pass auto (or {dtype}), or build with --backend trtllm")
    max_pos = int(pretrained.get("max_position_embeddings", 2048))
    max_seq_len = args.max_seq_len
    if max_seq_len is None:  # the default: room for 1024 output tokens, within the model's limit
        if args.max_input_len >= max_pos:
            raise UserError(f"--max_input_len {args.max_input_len} leaves no room for output: the model's "
                            f"max_position_embeddings is {max_pos}, which caps --max_seq_len (default: "
                            f"max_input_len + 1024); pass --max_input_len below {max_pos}")
        max_seq_len = min(args.max_input_len + 1024, max_pos)
    build = build_config(
        max_batch_size=args.max_batch_size,
        max_input_len=args.max_input_len,
        max_seq_len=max_seq_len,
        max_draft_len=args.max_draft_len,
        speculative_decoding_mode=args.speculative_decoding_mode,
        use_paged_context_fmha=args.use_paged_context_fmha == "enable",
        gemm_plugin=args.gemm_plugin,
        tokens_per_block=args.tokens_per_block,
        max_position_embeddings=max_pos,
    )
    step_costs_device = None
    if backend == "torch" and (step_costs == "measure" or compile_ahead):
        from ..threads import configure_threads

        configure_threads(args.num_threads)  # the compiled CPU kernels are specialised on it too (set once the
        # input is checked: importing torch takes seconds, a bad flag none)
        if step_costs == "measure":
            from ..runtime.device import resolve_device

            step_costs_device = resolve_device(args.device)  # a missing device is refused before the weights load
    start = time.perf_counter()
    if backend == "trtllm":
        from ..engine.trtllm_build import run_trtllm_build

        run_trtllm_build(
            ckpt,
            Path(args.output_dir),
            max_batch_size=args.max_batch_size,
            max_input_len=args.max_input_len,
            max_seq_len=max_seq_len,
            max_draft_len=args.max_draft_len,
            gemm_plugin=args.gemm_plugin,
            use_paged_context_fmha=args.use_paged_context_fmha == "enable",
            speculative_decoding_mode=args.speculative_decoding_mode or "draft_tokens_external",
            # trtllm-build's default is 32 too; another value is passed on rather than dropped
            extra=() if args.tokens_per_block == 32 else ("--tokens_per_block", str(args.tokens_per_block)),
        )
    else:
        build_torch_engine(ckpt, args.output_dir, build,
                           step_costs_device=step_costs_device,
                           compile_device=compile_device)
    print(
        f"built a {backend} engine in {args.output_dir} ({time.perf_counter() - start:.1f} s): "
        f"max_batch_size={args.max_batch_size} max_input_len={args.max_input_len} "
        f"max_seq_len={max_seq_len} max_draft_len={args.max_draft_len}"
        + (f" weights {quant.quant_algo} ({quant.precision})" if quant is not None else "")
        + (_compiled_summary(args.output_dir) if compile_ahead else "")
    )
    return 0


def _refuse_unread(args, why: str, alternative: str | None) -> None:
    """Refuse --device and --num_threads, given where nothing reads them (both are read only
    to measure step costs and to compile, on a PyTorch engine)."""
    for flag, value in (("--device", args.device), ("--num_threads", args.num_threads)):
        if value is not None:
            fix = f"drop {flag}" + (f", or {alternative}" if alternative else "")
            raise UserError(f"{flag} {value} is read only to measure step costs or compile a PyTorch engine, and "
                            f"{why}; {fix}")


def _compiled_summary(engine_dir: str) -> str:
    """``; compiled N step buckets on <device> in S s`` from the engine's config.json."""
    from ..engine.config import read_engine_config

    parts = [f"; compiled {len(e['buckets'])} step buckets on {device} in {e['compile_s']:.1f} s"
             for device, e in (read_engine_config(engine_dir).compiled or {}).items()]
    return "".join(parts)
