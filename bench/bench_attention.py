#!/usr/bin/env python3
"""Attention alone (``step_ops.attention``, the C kernel a decoding or verification step runs),
on every instruction-set path this CPU has, side by side in one process.

A step's attention is timed as SmolLM2-135M runs it: ``--layers`` layers' K/V pools (3 KV
heads, 9 query heads, head size 64), ``--context`` keys of context, and ``--rows`` query rows
of one sequence (1: a decoding step; 11: a chain of 10 drafts verified, each row seeing the
context and the rows before it). "hot" repeats the step with the pools in the caches; "cold"
first streams ``--flush_mib`` MiB through the caches, so the pools come from memory, as they
do in a real step where the weights' products pass between two layers' attention. Each
figure is the median of ``--rounds`` steps, and the paths alternate every round, so a busy
machine slows them alike. Every path gives bitwise the same outputs (checked here first).
``--kv_dtypes float32 float16`` also times each path over float16 pools (``--kv_cache_dtype
float16``: the same keys and values rounded), side by side with the float32 ones.

    python bench/bench_attention.py --rows 1 11 --num_threads 1 --output_json attention.json

Cost: the pools (2 x layers x 3 x (context + rows) x 64 floats, 35 MB at the defaults) and
the flush buffer, plus rounds x paths x rows steps.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch: OpenMP policy)

import torch  # noqa: E402

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.errors import UserError, run_cli  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime import kernels  # noqa: E402
from promptlookup.runtime.kernels import step_ops  # noqa: E402
from promptlookup.threads import configure_threads  # noqa: E402

KV_HEADS, HEADS, HEAD_SIZE = 3, 9, 64


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 11], help="query rows of the step (one sequence)")
    p.add_argument("--context", type=int, default=753, help="keys of context before the step's rows")
    p.add_argument("--layers", type=int, default=30, help="layers of distinct K/V pools")
    p.add_argument("--rounds", type=int, default=7, help="steps per path, row count and cache state (the median is kept)")
    p.add_argument("--flush_mib", type=int, default=512, help="MiB streamed through the caches before a cold step")
    p.add_argument("--kv_dtypes", nargs="+", choices=("float32", "float16"), default=["float32"],
                   help="K/V pool element types to time (each path over each)")
    p.add_argument("--output_json", default=None, help="write the results here as JSON")
    add_num_threads_argument(p)
    return p


def step_inputs(rows: int, context: int, layers: int, g: torch.Generator):
    """(q, pools, mask) of one step: rows query rows over context + rows keys, causal."""
    keys = context + rows
    pools = [(torch.randn(KV_HEADS, keys, HEAD_SIZE, generator=g), torch.randn(KV_HEADS, keys, HEAD_SIZE, generator=g))
             for _ in range(layers)]
    q = torch.randn(rows, HEADS, HEAD_SIZE, generator=g)
    mask = None
    if rows > 1:
        mask = torch.ones(1, rows, keys, dtype=torch.bool)
        for i in range(rows):
            mask[0, i, context + i + 1:] = False
    return q, pools, mask


def label(path: str, dtype: str, dtypes: list[str]) -> str:
    """A column's name: the path, with the pool's type where several are timed."""
    return path if len(dtypes) == 1 else f"{path} {dtype}"


def run_step(q, pools, mask) -> list[torch.Tensor]:
    keys = pools[0][0].shape[1]
    return [step_ops.attention(q, pk, pv, 1, keys, HEAD_SIZE ** -0.5, None, 0, mask) for pk, pv in pools]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = configure_threads(args.num_threads)
    paths = kernels.available_isas()
    if not paths:
        raise UserError("the C kernels are not built: run `make native` first")
    for name, value in (("--context", args.context), ("--layers", args.layers), ("--rounds", args.rounds)):
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    if min(args.rows) < 1:
        raise UserError(f"--rows must be at least 1, got {min(args.rows)}")
    info = machine_info(threads)
    print(f"{machine_header(info)}; torch {torch.__version__}; "
          f"paths: {', '.join(paths)}; {args.layers} layers, {args.context} keys of context")
    flush = torch.empty(args.flush_mib * 2 ** 18)
    g = torch.Generator().manual_seed(0)
    before = kernels.isa()
    results: dict[str, dict[str, float]] = {}
    try:
        for rows in args.rows:
            q, pools32, mask = step_inputs(rows, args.context, args.layers, g)
            by_dtype = {"float32": pools32, "float16": [(k.half(), v.half()) for k, v in pools32]}
            for dtype in args.kv_dtypes:
                outputs = []
                for path in paths:
                    kernels.set_isa(path)
                    outputs.append(run_step(q, by_dtype[dtype], mask))
                for path, out in zip(paths[1:], outputs[1:]):
                    if not all(torch.equal(a, b) for a, b in zip(outputs[0], out)):
                        raise RuntimeError(f"the {path} path's attention differs from the {paths[0]} path's ({dtype})")
            variants = [(label(path, dtype, args.kv_dtypes), path, by_dtype[dtype])
                        for path in paths for dtype in args.kv_dtypes]
            times: dict[tuple[str, str], list[float]] = {(v[0], s): [] for v in variants for s in ("hot", "cold")}
            for r in range(args.rounds):
                for name, path, pools in variants if r % 2 == 0 else variants[::-1]:
                    kernels.set_isa(path)
                    run_step(q, pools, mask)  # the pools into the caches
                    t = time.perf_counter()
                    run_step(q, pools, mask)
                    times[name, "hot"].append(time.perf_counter() - t)
                    flush.fill_(float(r))  # ... and out of them
                    t = time.perf_counter()
                    run_step(q, pools, mask)
                    times[name, "cold"].append(time.perf_counter() - t)
            for (path, state), ts in times.items():
                results.setdefault(f"{rows} rows, {state}", {})[path] = statistics.median(ts) * 1e3
    finally:
        kernels.set_isa(before)
    columns = [label(p, d, args.kv_dtypes) for p in paths for d in args.kv_dtypes]
    if len(args.kv_dtypes) > 1:  # the widest path over each cache type: the first type's time over the last's
        ratio_name = f"{args.kv_dtypes[0]}/{args.kv_dtypes[-1]}"
        num, den = label(paths[-1], args.kv_dtypes[0], args.kv_dtypes), label(paths[-1], args.kv_dtypes[-1], args.kv_dtypes)
    elif len(paths) > 2:  # the widest path over AVX2
        ratio_name, num, den = f"{paths[-1]}/{paths[1]}", paths[-1], paths[1]
    else:
        ratio_name = ""
    print(f"\nms per step (median of {args.rounds}; bitwise-equal outputs on every path)")
    print(f"{'step':<16}" + "".join(f"{c:>18}" for c in columns) + (f"{ratio_name:>18}" if ratio_name else ""))
    for name, by_path in results.items():
        ratio = f"{by_path[num] / by_path[den]:18.2f}" if ratio_name else ""
        print(f"{name:<16}" + "".join(f"{by_path[c]:18.2f}" for c in columns) + ratio)
    if args.output_json:
        atomic_write_json(args.output_json, {
            **info, "flags": info["cpu_flags"], "torch": torch.__version__, "paths": list(paths),
            "layers": args.layers, "context": args.context, "rounds": args.rounds, "kv_dtypes": args.kv_dtypes,
            "ms": results})
        print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    run_cli(main)
