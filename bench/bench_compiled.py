#!/usr/bin/env python3
"""Per-step time of the eager paged forward against the inductor-compiled one, on one CPU thread.

Loads the engine twice (``--torch_compile off``: oneDNN projections, :mod:`runtime.cpu_linear`;
``--torch_compile inductor``: :mod:`runtime.compiled`), prefills one sequence of
``--context`` prompt tokens, then times steps feeding ``q`` tokens (a chain) at that
context through ``TorchRunner.forward``, as a decoding or verification step does (the
compiled runner pads to its bucket). Each figure is the minimum of ``--reps`` calls of
``time.thread_time()`` (CPU time of this thread: robust on a shared machine; the run uses
one thread, so it is the step's cost). The compiled runner's first step of each bucket
compiles it: that wall time is reported as ``compile_s`` (inductor's cache directory
should be empty for a cold figure: set ``TORCHINDUCTOR_CACHE_DIR`` to a new folder).
Mode ``inductor`` compiles the step as a run does, attention reading the KV pool in place
(FlexAttention, :mod:`runtime.paged_attention`); ``inductor-gather`` compiles it with the
attended slots gathered per layer instead (SDPA, one graph per context bucket too).

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_COMPILE_THREADS=1 OMP_NUM_THREADS=1 \\
        python bench/bench_compiled.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser  # noqa: E402


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_compiled.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="a PyTorch engine")
    p.add_argument("--context", type=int, default=400, help="prompt tokens before the timed steps")
    p.add_argument("--tokens", default="1,2,4,11", help="tokens fed per timed step")
    p.add_argument("--reps", type=int, default=15, help="timed calls per step size (the minimum is kept)")
    p.add_argument("--modes", default="off,inductor,inductor-gather", help="compile modes to time")
    p.add_argument("--output_json", default=None, help="also write the figures here")
    return p


def gathering_forward(compiled):
    """``compiled`` (a ``CompiledForward``) made to gather each layer's attended K/V rows under a
    dense mask (SDPA, as the eager path does) instead of reading the pool in place: graphs then
    depend on a context bucket too. For this comparison only; runs use the in-place attention."""
    from promptlookup.runtime.cuda_graphs import StepBuckets

    b = compiled.buckets
    compiled.buckets = StepBuckets(b.max_b, b.max_q, b.max_k)  # split by context
    compiled._pool_blocks = None  # padded_layout then gathers
    compiled._probed = True  # the in-place kernel is not used
    compiled.shapes.clear()
    return compiled


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    info = machine_info(torch.get_num_threads())
    print(f"{machine_header(info)}; torch {torch.__version__}; {args.context} tokens of context", flush=True)
    from promptlookup.engine.load import load_runner
    from promptlookup.runtime.kv_cache import SequenceBlocks

    tokens = [int(t) for t in args.tokens.split(",")]
    results: dict[str, dict[str, float]] = {}
    for mode in args.modes.split(","):
        runner = load_runner(args.engine_dir, device="cpu", compile_mode=mode.removesuffix("-gather"))
        if mode.endswith("-gather"):
            runner.compiled = gathering_forward(runner.compiled)
        prompt = [(7 * i) % 1000 + 10 for i in range(args.context)]
        blocks = SequenceBlocks()
        runner.blocks.ensure_capacity(blocks, args.context + max(tokens))
        runner.forward([prompt], [args.context], [blocks.blocks], [1])
        row: dict[str, float] = {}
        for q in tokens:
            step = ([list(range(20, 20 + q))], [args.context + q], [blocks.blocks], [q])
            t0 = time.perf_counter()
            runner.forward(*step)  # compiles the bucket in the compiled runner
            row[f"first_call_s_q{q}"] = time.perf_counter() - t0
            best = float("inf")
            for _ in range(args.reps):
                c0 = time.thread_time()
                runner.forward(*step)
                best = min(best, time.thread_time() - c0)
            row[f"step_ms_q{q}"] = 1e3 * best
            print(f"{mode:15s} q={q:2d}: {1e3 * best:7.1f} ms/step (min of {args.reps}), first call "
                  f"{row[f'first_call_s_q{q}']:.1f} s", flush=True)
        results[mode] = row
        del runner
    if args.output_json:
        # the modes' rows at the top level, as before, beside the machine's keys
        Path(args.output_json).write_text(json.dumps({**info, "torch": torch.__version__, **results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
