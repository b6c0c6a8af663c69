#!/usr/bin/env python3
"""Products of decode and verification steps on the CPU: the C kernels against MKL, oneDNN
and PyTorch's weight-only int8/int4 kernels, for SmolLM2-135M's shapes.

Every candidate multiplies ``rows`` activations (1, 2, 4, 11, 16, 33 by default) by the
projections of ``--layers`` layers, each layer with its own weights (so the weights stream
from memory, as in a real step), plus one LM head: the time of a candidate at a row count
is the median over ``--repeats`` passes, and the candidates take turns inside every
repetition (a busy machine slows them alike). Candidates:

- ``mkl``: ``torch.mm`` on the row-major fp32 weight, as ``W @ x.T`` (one row padded to two:
  :func:`promptlookup.runtime.cpu_linear._mkl`, MKL's fastest route for few rows);
- ``onednn``: ``torch.ops.mkldnn._linear_pointwise`` on the weight reordered once, fewer
  than 4 rows padded to 4 (as :mod:`promptlookup.runtime.cpu_linear` runs it);
- ``c_fp32``, ``c_int8``, ``c_int4`` and ``c_int8g`` (int4 and int8 in groups of 32):
  :mod:`promptlookup.runtime.kernels` on the path in use (``--isa`` adds the same candidates
  on narrower paths, e.g. ``c_fp32@avx2``);
- ``aten_int8``, ``aten_int4``: ``torch.ops.aten._weight_int8pack_mm`` and
  ``_weight_int4pack_mm_for_cpu`` (group 32), where this PyTorch runs them.

The memory-bandwidth limit is measured in the same run: the best of a read of a 512 MiB
buffer by the C probe on every thread and an fp32 matrix-vector product over a 512 MiB
matrix through MKL. ``limit`` in the table is the share of that bandwidth a candidate's
weight bytes stream at (1.0: memory-bound at the measured peak).

    python bench/bench_kernels.py --num_threads 1
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch: OpenMP policy)

import torch  # noqa: E402

from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime import kernels  # noqa: E402
from promptlookup.runtime.cpu_linear import _mkl  # noqa: E402  (W @ x.T, one row padded to two)
from promptlookup.threads import configure_threads  # noqa: E402

# SmolLM2-135M: fused QKV (9 query heads + 3 + 3 key/value heads of 64), o_proj, fused gate/up, down (per
# layer), and the LM head (once)
LAYER_SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LM_HEAD = (49152, 576)
ROWS = (1, 2, 4, 11, 16, 33)
GROUP = 32
PROBE_MIB = 512

Product = Callable[[torch.Tensor], torch.Tensor]


class Weights:
    """One layer shape's weights in every candidate's format (``count`` distinct matrices)."""

    def __init__(self, out: int, in_: int, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.fp32 = [torch.randn(out, in_, generator=g) * 0.05 for _ in range(count)]
        self.int8 = [(torch.randint(-127, 128, (out, in_), dtype=torch.int8, generator=g),
                      torch.rand(out, generator=g) * 1e-3) for _ in range(count)]
        self.int4 = []
        for _ in range(count):
            codes = torch.randint(0, 16, (out, in_), dtype=torch.int32, generator=g)
            scale = torch.rand(out, in_ // GROUP, generator=g) * 1e-2
            packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
            self.int4.append((codes, packed, scale, -8 * scale))
        self.int8g = [(torch.randint(-128, 128, (out, in_), dtype=torch.int8, generator=g),
                       torch.rand(out, in_ // GROUP, generator=g) * 1e-3, torch.randn(out, in_ // GROUP, generator=g) * 1e-3)
                      for _ in range(count)]
        self.onednn = self.aten_int8 = self.aten_int4 = None

    def pack_onednn(self) -> bool:
        try:
            self.onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 16) for w in self.fp32]
        except (RuntimeError, AttributeError):
            return False
        return True

    def pack_aten(self) -> tuple[bool, bool]:
        """PyTorch's own layouts for its int8/int4 weight-only kernels (whichever this build runs)."""
        ok8 = ok4 = True
        try:
            self.aten_int8 = [(q, s) for q, s in self.int8]
            torch.ops.aten._weight_int8pack_mm(torch.zeros(1, self.int8[0][0].shape[1]), *self.aten_int8[0])
        except (RuntimeError, AttributeError, NotImplementedError):
            ok8, self.aten_int8 = False, None
        try:
            packs = []
            for codes, _, scale, offset in self.int4:
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
                # _weight_int4pack_mm: w = (code - 8) * scale + zero, so zero = offset + 8 * scale
                sz = torch.stack([scale, offset + 8 * scale], dim=-1).transpose(0, 1).contiguous()
                packs.append((packed, sz))
            torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, codes.shape[1]), packs[0][0], GROUP, packs[0][1])
            self.aten_int4 = packs
        except (RuntimeError, AttributeError, NotImplementedError):
            ok4 = False
        self.int4 = [(packed, scale, offset) for _, packed, scale, offset in self.int4]  # drop the int32 codes
        return ok8, ok4


def products(w: Weights, isas: list[str]) -> dict[str, list[tuple[Product, int]]]:
    """Per candidate: one (product, weight bytes) per weight matrix."""
    def nbytes(*ts: torch.Tensor) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    def onednn(p: torch.Tensor) -> Product:
        def run(x: torch.Tensor) -> torch.Tensor:
            rows = x.shape[0]
            if rows < 4:
                x = torch.cat([x, x.new_zeros(4 - rows, x.shape[1])])
            return torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")[:rows]
        return run

    out: dict[str, list[tuple[Product, int]]] = {
        "mkl": [((lambda x, m=m: _mkl(m, x)), nbytes(m)) for m in w.fp32],
    }
    if w.onednn is not None:
        out["onednn"] = [(onednn(p), nbytes(m)) for p, m in zip(w.onednn, w.fp32)]
    for i, name in enumerate(isas):
        tag = "" if i == 0 else f"@{name}"  # measure() switches the path before a tagged candidate
        out[f"c_fp32{tag}"] = [(kernels.fp32_product(m), nbytes(m)) for m in w.fp32]  # as CpuLinear calls it
        out[f"c_int8{tag}"] = [((lambda x, q=q, s=s: kernels.linear_int8(x, q, s)), nbytes(q, s)) for q, s in w.int8]
        out[f"c_int4{tag}"] = [((lambda x, q=q, s=s, o=o: kernels.linear_int4(x, q, s, o, GROUP)), nbytes(q, s, o))
                               for q, s, o in w.int4]
        out[f"c_int8g{tag}"] = [((lambda x, q=q, s=s, o=o: kernels.linear_int8_groups(x, q, s, o, GROUP)),
                                 nbytes(q, s, o)) for q, s, o in w.int8g]
    if w.aten_int8 is not None:
        out["aten_int8"] = [((lambda x, q=q, s=s: torch.ops.aten._weight_int8pack_mm(x, q, s)), nbytes(q, s))
                            for q, s in w.aten_int8]
    if w.aten_int4 is not None:
        out["aten_int4"] = [((lambda x, p=p, sz=sz: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, GROUP, sz)),
                             nbytes(p, sz)) for p, sz in w.aten_int4]
    return out


def bandwidth_gbs(repeats: int, mib: int) -> dict[str, float]:
    """Read bandwidth (GB/s): the C probe over a ``mib`` MiB buffer, and MKL's mv over a matrix of that size."""
    probe_bytes = mib << 20
    buf = torch.rand(probe_bytes // 4)
    mat = buf.view(-1, 4096)
    vec = torch.rand(4096)
    result = {"c_read": 0.0, "mkl_mv": 0.0}
    probe = kernels.read_bandwidth_probe if kernels.isa() != "reference" else None
    for _ in range(repeats):
        if probe is not None:
            t = time.perf_counter()
            probe(buf)
            result["c_read"] = max(result["c_read"], probe_bytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        torch.mv(mat, vec)
        result["mkl_mv"] = max(result["mkl_mv"], probe_bytes / (time.perf_counter() - t) / 1e9)
    return result


def measure(groups: dict[str, dict[str, list[tuple[Product, int]]]], rows_list: tuple[int, ...], repeats: int,
            in_sizes: dict[str, int]) -> dict[str, dict[int, dict[str, float]]]:
    """``{candidate: {rows: {shape: median seconds per product, summed over the shape's matrices}}}``."""
    names = list(next(iter(groups.values())))
    times: dict[str, dict[int, dict[str, list[float]]]] = {n: {r: {s: [] for s in groups} for r in rows_list} for n in names}
    xs = {r: {s: torch.randn(r, in_sizes[s]) for s in groups} for r in rows_list}
    default_isa = kernels.isa() if kernels.isa() != "reference" else None
    for _ in range(repeats):
        for rows in rows_list:
            for name in names:
                if default_isa is not None:
                    kernels.set_isa(name.split("@")[1] if "@" in name else default_isa)
                for shape, cands in groups.items():
                    x = xs[rows][shape]
                    start = time.perf_counter()
                    for fn, _ in cands[name]:
                        fn(x)
                    times[name][rows][shape].append(time.perf_counter() - start)
    return {n: {r: {s: statistics.median(v) for s, v in by_shape.items()} for r, by_shape in by_rows.items()}
            for n, by_rows in times.items()}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_kernels.py", description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    p.add_argument("--layers", type=int, default=30, help="layers of distinct weights (SmolLM2 has 30)")
    p.add_argument("--repeats", type=int, default=7, help="passes per candidate and row count (the median is kept)")
    p.add_argument("--candidates", default="", help="comma-separated candidates to keep, mkl always (the ratios' base; default: all that run here)")
    p.add_argument("--isa", default="", help="comma-separated narrower C paths to measure too (e.g. avx2,generic)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink every shape by this factor (smoke tests)")
    p.add_argument("--probe_mib", type=int, default=PROBE_MIB, help="MiB read by the bandwidth measurement")
    add_num_threads_argument(p, None)
    p.add_argument("--output_json", default=str(ROOT / "bench/results/kernels.json"), help="where to write the results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = configure_threads(args.num_threads)
    rows_list = tuple(int(r) for r in args.rows.split(",") if r.strip())
    isas = [kernels.isa()] + [i for i in args.isa.split(",") if i.strip() and i != kernels.isa()]
    for name in isas[1:]:
        if name not in kernels.available_isas():
            print(f"error: --isa {name}: this CPU runs only {', '.join(kernels.available_isas()) or 'the reference'}",
                  file=sys.stderr)
            return 2

    def scaled(shape: tuple[int, int]) -> tuple[int, int]:
        return tuple(max(GROUP, int(d * args.scale) // GROUP * GROUP) for d in shape)  # type: ignore[return-value]

    shapes = {name: (scaled(s), args.layers) for name, s in LAYER_SHAPES.items()}
    shapes["lm_head"] = (scaled(LM_HEAD), 1)
    groups, in_sizes, weight_bytes = {}, {}, {}
    available = {"onednn": True, "aten_int8": True, "aten_int4": True}
    for seed, (name, ((out, in_), count)) in enumerate(shapes.items()):
        w = Weights(out, in_, count, seed)
        available["onednn"] &= w.pack_onednn()
        ok8, ok4 = w.pack_aten()
        available["aten_int8"] &= ok8
        available["aten_int4"] &= ok4
        groups[name] = products(w, isas)
        in_sizes[name] = in_
        weight_bytes[name] = {c: sum(b for _, b in prods) for c, prods in groups[name].items()}
    common = set.intersection(*(set(g) for g in groups.values()))
    wanted = {c.strip() for c in args.candidates.split(",") if c.strip()}
    unknown = wanted - common
    if unknown:
        print(f"error: --candidates: {', '.join(sorted(unknown))} not among {', '.join(sorted(common))}", file=sys.stderr)
        return 2
    common = (wanted | {"mkl"}) if wanted else common  # mkl stays: the ratios' base
    groups = {s: {c: v for c, v in g.items() if c in common} for s, g in groups.items()}
    bw = bandwidth_gbs(3, args.probe_mib)
    limit = max(bw.values())
    info = machine_info(threads)
    header = (f"{machine_header(info)}; C path {kernels.isa()}; "
              f"torch {torch.__version__}; bandwidth {limit:.1f} GB/s (C read {bw['c_read']:.1f}, MKL mv {bw['mkl_mv']:.1f})")
    print(header)
    times = measure(groups, rows_list, args.repeats, in_sizes)
    if isas[0] != "reference":
        kernels.set_isa(isas[0])  # measure() left the last candidate's path in use

    names = list(next(iter(groups.values())))
    base = "mkl"
    results = []
    print(f"\nper step (all {args.layers} layers' projections + LM head), median ms; ratio = mkl / candidate; "
          "limit = weight bytes / time / bandwidth")
    print(f"{'rows':>4}  " + "  ".join(f"{n:>22}" for n in names))
    for rows in rows_list:
        cells = []
        for n in names:
            t = sum(times[n][rows].values())
            share = sum(weight_bytes[s][n] for s in groups) / t / 1e9 / limit
            ratio = sum(times[base][rows].values()) / t
            cells.append(f"{t * 1e3:7.1f} {ratio:5.2f}x {share:5.2f}")
            results.append({"rows": rows, "candidate": n, "step_ms": t * 1e3, "vs_mkl": ratio, "limit_share": share,
                            "per_shape_us": {s: times[n][rows][s] / shapes[s][1] * 1e6 for s in groups}})
        print(f"{rows:>4}  " + "  ".join(f"{c:>22}" for c in cells))
    print("\nper product (µs, median) at each row count:")
    for s in groups:
        print(f"  {s} {shapes[s][0]}: " + "; ".join(
            f"{n} " + "/".join(f"{times[n][r][s] / shapes[s][1] * 1e6:.0f}" for r in rows_list) for n in names))
    record = {
        **info, "flags": info["cpu_flags"], "isa": kernels.isa(), "isas": isas,
        "torch": torch.__version__, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "bandwidth_gbs": bw, "limit_gbs": limit, "layers": args.layers, "repeats": args.repeats,
        "shapes": {s: list(v[0]) for s, v in shapes.items()}, "rows": list(rows_list),
        "unavailable": [k for k, ok in available.items() if not ok], "results": results,
    }
    out = Path(args.output_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, record)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
