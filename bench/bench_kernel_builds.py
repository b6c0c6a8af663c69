#!/usr/bin/env python3
"""Two or more builds of the C kernels (``_gemv*.so``) side by side in one process, on the
products of one SmolLM2-135M step, for before/after measurements of a change to gemv.c.

A candidate is ``PATH:KIND[:ISA]``: a built module (e.g. a copy of
``promptlookup/runtime/kernels/_gemv*.so`` taken before the change), ``KIND`` one of
``fp32``, ``int8``, ``int4_32``, ``int4_128`` (int4 with that group size), ``int8g_32``,
``int8g_128`` (int8 per group), ``ISA`` one of
``avx512``, ``avx2``, ``generic`` (default: the widest this CPU runs). A step is what a
decoding step reads: per layer the fused QKV [960, H], o_proj [H, H], gate/up [3072, H]
and down [H, 1536], with ``--layers`` layers of distinct weights (so they stream from
memory), then the LM head [49152, H], in that order. ``--hidden`` (H, 576 for SmolLM2) may
be raised to 640 so that a group of 128 divides it. Every round runs each candidate's
step once, the candidates in turn (reversed every other round, so a busy machine slows
them alike); the table gives per shape the median over rounds and the speed relative to
the first candidate, and the best round of whole steps. Builds of the same kind and path
are first checked to give bitwise-equal outputs (int4 is compared within a build only:
its summation order is each build's own). Cost: the weights of each kind once (538 MB for
fp32 at H = 576), and rounds x candidates steps.

    cp promptlookup/runtime/kernels/_gemv*.so /tmp/before.so   # then change and rebuild
    python bench/bench_kernel_builds.py /tmp/before.so:fp32:avx2 \\
        promptlookup/runtime/kernels/_gemv.cpython-311-x86_64-linux-gnu.so:fp32:avx2 --num_threads 1
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch: OpenMP policy)

import torch  # noqa: E402

from promptlookup.threads import configure_threads  # noqa: E402

KINDS = ("fp32", "int8", "int4_32", "int4_128", "int8g_32", "int8g_128")
ISAS = {"generic": 0, "avx2": 1, "avx512": 2}
LAYER = ("qkv", "o_proj", "gate_up", "down")


def shapes(hidden: int, layers: int) -> dict[str, tuple[int, int, int]]:
    """``{name: (out, in, copies)}`` of one step."""
    return {"qkv": (960, hidden, layers), "o_proj": (hidden, hidden, layers), "gate_up": (3072, hidden, layers),
            "down": (hidden, 1536, layers), "lm_head": (49152, hidden, 1)}


def load(path: str) -> ModuleType:
    """A built ``_gemv`` module from ``path`` (each path its own module object)."""
    spec = importlib.util.spec_from_file_location("_gemv", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_weights(kind: str, sizes: dict[str, tuple[int, int, int]], seed: int) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """``copies`` distinct weights per shape in ``kind``'s layout (gemv.c's contract)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, list[tuple[torch.Tensor, ...]]] = {}
    for name, (n, k, copies) in sizes.items():
        if kind == "fp32":
            out[name] = [(torch.randn(n, k, generator=g) * 0.05,) for _ in range(copies)]
        elif kind == "int8":
            out[name] = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g),
                          torch.rand(n, generator=g) * 1e-3) for _ in range(copies)]
        else:
            gs = int(kind.split("_")[1])
            out[name] = []
            for _ in range(copies):
                scale = torch.rand(n, k // gs, generator=g) * 1e-2
                codes = (torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g) if kind.startswith("int8g")
                         else torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g))
                out[name].append((codes, scale, -8 * scale))
    return out


def call(module: ModuleType, kind: str, w: tuple[torch.Tensor, ...], x: torch.Tensor, y: torch.Tensor) -> float:
    """One product ``y = x @ W.T`` through ``module``; its seconds."""
    rows, k = x.shape
    n = y.shape[1]
    xp, yp = x.data_ptr(), y.data_ptr()
    if kind == "fp32":
        start = time.perf_counter()
        module.fp32(xp, w[0].data_ptr(), yp, rows, k, n)
    elif kind == "int8":
        start = time.perf_counter()
        module.int8(xp, w[0].data_ptr(), w[1].data_ptr(), yp, rows, k, n)
    else:
        gs = int(kind.split("_")[1])
        run = module.int8g if kind.startswith("int8g") else module.int4
        start = time.perf_counter()
        run(xp, w[0].data_ptr(), w[1].data_ptr(), w[2].data_ptr(), yp, rows, k, n, gs)
    return time.perf_counter() - start


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_kernel_builds.py", description=__doc__.splitlines()[0])
    p.add_argument("candidates", nargs="+", help=f"PATH:KIND[:ISA] (KIND: {', '.join(KINDS)})")
    p.add_argument("--rows", type=int, default=1, help="rows of x (1: a decoding step)")
    p.add_argument("--rounds", type=int, default=9, help="steps per candidate (the median is kept)")
    p.add_argument("--layers", type=int, default=30, help="layers of distinct weights (SmolLM2 has 30)")
    p.add_argument("--hidden", type=int, default=576, help="hidden size (640 lets a group of 128 divide it)")
    add_num_threads_argument(p, None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = configure_threads(args.num_threads)
    cands = []
    for spec in args.candidates:
        parts = spec.rsplit(":", 2) if spec.count(":") >= 2 else spec.rsplit(":", 1)
        if len(parts) < 2 or parts[1] not in KINDS or (len(parts) == 3 and parts[2] not in ISAS):
            print(f"error: candidate {spec!r}: use PATH:KIND[:ISA], KIND one of {', '.join(KINDS)}, "
                  f"ISA one of {', '.join(ISAS)}", file=sys.stderr)
            return 2
        if parts[1].endswith("_128") and args.hidden % 128:
            print(f"error: {parts[1]} needs --hidden divisible by 128 (got {args.hidden}); try --hidden 640", file=sys.stderr)
            return 2
        cands.append(tuple(parts) if len(parts) == 3 else (parts[0], parts[1], ""))
    modules: dict[str, ModuleType] = {}
    for path, _, isa in cands:
        if path not in modules:
            try:
                modules[path] = load(path)
            except (ImportError, OSError, ValueError) as exc:
                print(f"error: {path}: cannot load it as the kernels' module ({exc})", file=sys.stderr)
                return 2
        if isa and ISAS[isa] > modules[path].best_isa():
            print(f"error: {path}: this CPU cannot run the {isa} path", file=sys.stderr)
            return 2
    sizes = shapes(args.hidden, args.layers)
    weights = {kind: make_weights(kind, sizes, seed) for seed, kind in enumerate(dict.fromkeys(k for _, k, _ in cands))}
    xs = {s: torch.randn(args.rows, k) for s, (_, k, _) in sizes.items()}
    ys = {s: torch.empty(args.rows, n) for s, (n, _, _) in sizes.items()}
    names = [":".join(p for p in c if p) for c in cands]

    def use(i: int) -> tuple[ModuleType, str]:
        path, kind, isa = cands[i]
        module = modules[path]
        module.set_isa(ISAS[isa] if isa else module.best_isa())
        return module, kind

    first: dict[tuple[str, str, str], torch.Tensor] = {}
    for i, (path, kind, isa) in enumerate(cands):
        module, _ = use(i)
        for s in sizes:
            call(module, kind, weights[kind][s][0], xs[s], ys[s])
            key = (kind, isa, s if not kind.startswith("int4") else f"{s}@{path}")
            if key in first and not torch.equal(first[key], ys[s]):
                print(f"error: {names[i]} differs from an earlier build of the same kind and path on {s}", file=sys.stderr)
                return 1
            first.setdefault(key, ys[s].clone())
    times = {n: {s: [] for s in sizes} for n in names}
    for r in range(args.rounds):
        order = range(len(cands)) if r % 2 == 0 else reversed(range(len(cands)))
        for i in order:
            module, kind = use(i)
            spent = dict.fromkeys(sizes, 0.0)
            for layer in range(args.layers):
                for s in LAYER:
                    spent[s] += call(module, kind, weights[kind][s][layer], xs[s], ys[s])
            spent["lm_head"] += call(module, kind, weights[kind]["lm_head"][0], xs["lm_head"], ys["lm_head"])
            for s, t in spent.items():
                times[names[i]][s].append(t)
    print(machine_header(machine_info(threads)))
    print(f"{args.rows} row(s), {threads} thread(s), {args.rounds} rounds, hidden {args.hidden}; per shape: median ms "
          f"of a step's products, speed relative to {names[0]}")
    print(f"{'shape':>8}  " + "  ".join(f"{n[-34:]:>34}" for n in names))
    total = dict.fromkeys(names, 0.0)
    for s in sizes:
        med = {n: statistics.median(times[n][s]) for n in names}
        for n in names:
            total[n] += med[n]
        print(f"{s:>8}  " + "  ".join(f"{med[n] * 1e3:24.2f} ms {med[names[0]] / med[n]:5.2f}x" for n in names))
    print(f"{'step':>8}  " + "  ".join(f"{total[n] * 1e3:24.2f} ms {total[names[0]] / total[n]:5.2f}x" for n in names))
    best = {n: min(sum(times[n][s][r] for s in sizes) for r in range(args.rounds)) for n in names}
    print(f"{'best':>8}  " + "  ".join(f"{best[n] * 1e3:24.2f} ms {best[names[0]] / best[n]:5.2f}x" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
