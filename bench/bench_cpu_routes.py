#!/usr/bin/env python3
"""The real engine's CPU projections through the C kernels (route ``gemv``) against oneDNN
(the route where the C kernels are not built): step times and decoding speed.

The engine is loaded twice, once per route (the route is fixed when a layer is built).
Step times: one forward step feeding ``q`` tokens after ``--context`` cached ones, the
median of ``--repeats``, the routes taking turns inside every repetition. Decoding: each
prompt decoded plainly and with prompt lookup (``[k, n]``), the routes alternating; the
tokens of the two routes are compared (they may part only at near-ties of the logits,
since their sums run in different orders).

    python bench/bench_cpu_routes.py --engine_dir artifacts/smollm2/engine --num_threads 1
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch: OpenMP policy)

import torch  # noqa: E402

from promptlookup.decoding import generate  # noqa: E402
from promptlookup.drafting.base import DraftConfig  # noqa: E402
from promptlookup.engine.load import load_runner  # noqa: E402
from promptlookup.evaluation.grounded_prompts import code_edit_prompts  # noqa: E402
from promptlookup.cli.inputs import encode_text  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime import kernels, load_tokenizer  # noqa: E402
from promptlookup.runtime.kv_cache import SequenceBlocks  # noqa: E402
from promptlookup.threads import configure_threads  # noqa: E402

STEP_TOKENS = (1, 2, 4, 11, 17, 33, 64)


def load(engine_dir: str, route: str):
    """The engine's runner with its projections on ``route`` (``gemv`` or ``onednn``)."""
    saved = kernels._C
    if route == "onednn":
        kernels._C = None  # CpuLinear then takes the route it takes without the C kernels
    try:
        runner = load_runner(engine_dir, device="cpu")
    finally:
        kernels._C = saved
    assert runner.model.layers[0].qkv.kernel == route, runner.model.layers[0].qkv.kernel
    return runner


def step_ms(runners: dict, context: int, repeats: int) -> dict[str, dict[int, float]]:
    seqs = {}
    for name, r in runners.items():
        seqs[name] = SequenceBlocks()
        r.blocks.ensure_capacity(seqs[name], context + max(STEP_TOKENS))
        r.forward([[0] * context], [context], [seqs[name].blocks], [1])
    times = {name: {q: [] for q in STEP_TOKENS} for name in runners}
    for _ in range(repeats):
        for q in STEP_TOKENS:
            for name, r in runners.items():
                start = time.perf_counter()
                r.forward([[0] * q], [context + q], [seqs[name].blocks], [q])
                times[name][q].append((time.perf_counter() - start) * 1e3)
    for name, r in runners.items():
        r.blocks.release(seqs[name], [])
    return {n: {q: statistics.median(v) for q, v in by_q.items()} for n, by_q in times.items()}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_cpu_routes.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="the SmolLM2 engine")
    p.add_argument("--num_code", type=int, default=2, help="code-edit prompts")
    p.add_argument("--max_new_tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--context", type=int, default=256, help="cached tokens before a timed step")
    p.add_argument("--repeats", type=int, default=5, help="timings per step size and route (the median is kept)")
    add_num_threads_argument(p, None)
    p.add_argument("--output_json", default=str(ROOT / "bench/results/cpu_routes.json"), help="where to write the results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = configure_threads(args.num_threads)
    if kernels.isa() == "reference":
        print("error: the C kernels are not built; run `make native`", file=sys.stderr)
        return 2
    runners = {route: load(args.engine_dir, route) for route in ("gemv", "onednn")}
    info = machine_info(threads)
    print(f"{machine_header(info)}; C path {kernels.isa()}; torch {torch.__version__}")
    steps = step_ms(runners, args.context, args.repeats)
    print("step ms (median) after", args.context, "cached tokens:")
    for q in STEP_TOKENS:
        print(f"  q={q:>2}: " + "  ".join(f"{n} {steps[n][q]:6.1f}" for n in runners)
              + f"  onednn/gemv {steps['onednn'][q] / steps['gemv'][q]:.2f}")
    tok = load_tokenizer(args.engine_dir)
    prompts = [encode_text(tok, text, use_chat_template=True) for text in code_edit_prompts(args.num_code)]
    modes = {"plain": None, "pld": DraftConfig(prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n)}
    secs = {(r, m): 0.0 for r in runners for m in modes}
    tokens = {(r, m): 0 for r in runners for m in modes}
    outputs: dict[tuple[str, str], list] = {key: [] for key in secs}
    for prompt in prompts:
        for mode, draft in modes.items():
            for route, runner in runners.items():
                start = time.perf_counter()
                res = generate(runner, [prompt], max_new_tokens=args.max_new_tokens, end_id=-1, draft=draft)
                secs[route, mode] += time.perf_counter() - start
                tokens[route, mode] += len(res[0].output_ids)
                outputs[route, mode].append(res[0].output_ids)
    speed = {f"{r}/{m}": tokens[r, m] / secs[r, m] for r, m in secs}
    for key, value in speed.items():
        print(f"  {key}: {value:.1f} tok/s")
    same = {m: outputs["gemv", m] == outputs["onednn", m] for m in modes}
    lookup_exact = outputs["gemv", "pld"] == outputs["gemv", "plain"]
    print(f"  routes give the same tokens: {same}; gemv prompt lookup == gemv plain: {lookup_exact}")
    atomic_write_json(Path(args.output_json), {
        **info, "isa": kernels.isa(), "num_threads": threads, "torch": torch.__version__, "context": args.context,
        "step_ms": {n: {str(q): v for q, v in by_q.items()} for n, by_q in steps.items()},
        "tok_per_s": speed, "same_tokens": same, "gemv_lookup_equals_plain": lookup_exact,
    })
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
