#!/usr/bin/env python3
"""Weight-only int8/int4 products on a CUDA GPU: ours (Triton, :mod:`promptlookup.runtime.gpu_quant`)
side by side with PyTorch's own kernels and the half-precision product, per decoder layer.

For each model shape (the four projections of one decoder layer: fused Q/K/V, O, fused
gate/up, down; ``llama-3.2-1b`` and ``llama-3.1-8b``) and each row count (``--rows``: one-row
decoding, 4-33-row verification), in one run on one GPU, the time of one layer's four
products (the median of CUDA-graph replays, ``triton.testing.do_bench_cudagraph``) for:

- ``half``: ``F.linear`` on the float weight in ``--dtype`` (cuBLAS): the baseline of every ratio;
- ``dequant``: dequantize the int4 weight to ``--dtype`` and ``F.linear`` (what a GPU product
  was before ``gpu_quant``);
- ours: ``int8`` per channel, ``int8g128`` in groups, ``int4g32`` / ``int4g128`` in groups;
- PyTorch's kernels, where this torch has them on CUDA: ``torch_int4g128``
  (``aten._weight_int4pack_mm``, tinygemm; bfloat16 only; its scale and zero held in
  bfloat16) and ``torch_int8`` (``aten._weight_int8pack_mm``);
- with ``--blocks``, ours with other tile sizes (``int4g128@64x256``): how ``gpu_quant.BLOCKS``
  was chosen.

Beside each speed: the candidate's worst error against dequantize-then-multiply (``max rel err``)
and whether its rows are bitwise the rows computed alone (``row-invariant``: the property greedy
identity between plain and speculative decoding needs; ours are, by construction and by
tests/runtime/test_gpu_quant.py).

Also printed: the effective read rate (the bytes of codes and scales, or of the half weight,
over the time) as a fraction of the device-to-device copy bandwidth measured in the same run.

    python bench/bench_gpu_quant.py                       # both shapes, rows 1,4,11,16,33
    python bench/bench_gpu_quant.py --shapes llama-3.2-1b --rows 1,11

Needs a CUDA GPU (exits 2 without one). Writes a table and ``--output_json``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runtime import ROOT, machine  # noqa: E402  (ROOT on sys.path, HF_HUB_OFFLINE, OpenMP policy before torch)
from bench_scale import copy_bandwidth  # noqa: E402
from bench.machine import machine_info  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from promptlookup.checkpoint.quantize import (quantize_int4_groups, quantize_int8, quantize_int8_groups,  # noqa: E402
                                              unpack_int4)
from promptlookup.cli.args import ArgumentParser  # noqa: E402
from promptlookup.errors import UserError  # noqa: E402
from promptlookup.evaluation.sweep import parse_int_list  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime import gpu_quant  # noqa: E402
from promptlookup.runtime.quant_linear import QuantLinear  # noqa: E402

# one decoder layer's projections, [out, in]: fused QKV, O, fused gate/up, down
LAYERS = {
    "llama-3.2-1b": [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)],
    "llama-3.1-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
OURS = {"int8": lambda w: QuantLinear(*quantize_int8(w)),
        "int8g128": lambda w: QuantLinear(*quantize_int8_groups(w, 128), group_size=128),
        "int4g32": lambda w: QuantLinear(*quantize_int4_groups(w, 32), group_size=32),
        "int4g128": lambda w: QuantLinear(*quantize_int4_groups(w, 128), group_size=128)}


def bench_ms(fn: Callable[[], Any]) -> float:
    """Median milliseconds of ``fn`` replayed in a CUDA graph."""
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def tinygemm(lin: QuantLinear, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | str:
    """PyTorch's int4 product (tinygemm) over ``lin``'s codes, or why it cannot run: codes
    ``q`` 0..15 with ``W = (q - 8) * scale + zero``, so ``zero = offset + 8 * scale``."""
    if dtype != torch.bfloat16:
        return "bfloat16 only"
    n, k = lin.qweight.shape[0], lin.qweight.shape[1] * 2
    codes = unpack_int4(lin.qweight).to(torch.int32)
    packed = ((codes[:, 0::2] << 4) | codes[:, 1::2]).to(torch.uint8)  # even column in the high nibble
    tiles = 8 if k % 128 == 0 else 4 if k % 64 == 0 else 2
    try:
        weight = torch.ops.aten._convert_weight_to_int4pack(packed, tiles)
    except (RuntimeError, NotImplementedError) as e:
        return f"unavailable: {str(e).splitlines()[0][:80]}"
    zero = lin.offset + 8.0 * lin.scale
    scales_zeros = torch.stack([lin.scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, weight, lin.group_size, scales_zeros)


def torch_int8(lin: QuantLinear, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor] | str:
    """PyTorch's int8 weight-only product, where this torch has it on CUDA."""
    scale = lin.scale.to(dtype)
    probe = torch.zeros(1, lin.qweight.shape[1], dtype=dtype, device="cuda")
    try:
        torch.ops.aten._weight_int8pack_mm(probe, lin.qweight, scale)
    except (RuntimeError, NotImplementedError) as e:
        return f"unavailable: {str(e).splitlines()[0][:80]}"
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, lin.qweight, scale)


Candidates = tuple[dict[str, list], dict[str, int], dict[str, str], list]


def layer_candidates(shape: str, dtype: torch.dtype, seed: int, variants: list[tuple[str, int, int]]) -> Candidates:
    """For each candidate: its four products (callables of x) and the bytes they read; why a
    peer is absent; and the four ``(half weight, {layout: QuantLinear})`` they were made from."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fns: dict[str, list] = {}
    nbytes: dict[str, int] = {}
    notes: dict[str, str] = {}
    mats = []
    for n, k in LAYERS[shape]:
        w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
        quant = {name: make(w) for name, make in OURS.items()}
        mats.append((w.to(dtype), quant))
    fns["half"] = [lambda x, w=w: F.linear(x, w) for w, _ in mats]
    nbytes["half"] = sum(w.numel() * w.element_size() for w, _ in mats)
    fns["dequant_int4g128"] = [lambda x, q=q["int4g128"]: F.linear(x, q.dequantize(dtype)) for _, q in mats]
    nbytes["dequant_int4g128"] = sum(q["int4g128"].resident_bytes() for _, q in mats)
    for name in OURS:
        fns[name] = [lambda x, q=q[name]: q(x) for _, q in mats]
        nbytes[name] = sum(q[name].resident_bytes() for _, q in mats)
    for name, bn, bk in variants:  # ours with other tiles (name@BNxBK)
        fns[f"{name}@{bn}x{bk}"] = [lambda x, q=q[name], b=(bn, bk): gpu_quant.linear(x, q.qweight, q.scale, q.offset,
                                                                                      q.group_size, b) for _, q in mats]
        nbytes[f"{name}@{bn}x{bk}"] = nbytes[name]
    for name, make, base in (("torch_int4g128", tinygemm, "int4g128"), ("torch_int8", torch_int8, "int8")):
        made = [make(q[base], dtype) for _, q in mats]
        if any(isinstance(m, str) for m in made):
            notes[name] = next(m for m in made if isinstance(m, str))
            continue
        fns[name] = made
        nbytes[name] = nbytes[base]
    return fns, nbytes, notes, mats


def check(fns: dict[str, list], mats: list, dtype: torch.dtype, rows: int) -> dict[str, tuple[float, bool]]:
    """Each quantized candidate's worst relative error, over the four products, against
    dequantize-then-multiply in float64 on ``rows`` random rows, and whether each of those
    rows is bitwise the row computed alone (row invariance, which greedy identity between
    plain and speculative decoding needs)."""
    out = {}
    for name, parts in fns.items():
        base = name.split("@")[0].removeprefix("dequant_").removeprefix("torch_")
        if base == "half":
            continue
        worst, invariant = 0.0, True
        for fn, (_, quant) in zip(parts, mats):
            q = quant[base]
            x = torch.randn(rows, q.qweight.shape[1] * (2 if q.precision == "int4" else 1), device="cuda").to(dtype)
            want = x.double() @ q.dequantize(dtype).double().T
            got = fn(x)
            worst = max(worst, ((got.double() - want).abs().max() / want.abs().max()).item())
            invariant &= all(torch.equal(fn(x[i:i + 1])[0], got[i]) for i in range(rows))
        out[name] = (worst, invariant)
    return out


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_gpu_quant.py", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="llama-3.2-1b,llama-3.1-8b", help=f"comma-separated, of {', '.join(LAYERS)}")
    p.add_argument("--rows", default="1,4,11,16,33", help="comma-separated rows of x per product")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="activations and the half weight")
    p.add_argument("--blocks", default="",
                   help="extra candidates: ours with other tiles, comma-separated LAYOUT:BLOCK_NxBLOCK_K "
                        "(e.g. int4g128:64x256; the defaults: gpu_quant.BLOCKS)")
    p.add_argument("--seed", type=int, default=0, help="random weights and activations")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/gpu_quant.json"), help="where results are written")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available() or not gpu_quant.available():
        raise UserError(f"bench_gpu_quant.py needs a CUDA GPU and Triton (here: GPU {torch.cuda.is_available()}, "
                        f"Triton {gpu_quant.available()})")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or any(s not in LAYERS for s in shapes):
        raise UserError(f"--shapes takes a comma-separated subset of {', '.join(LAYERS)}, got {args.shapes!r}")
    rows_list = parse_int_list(args.rows, "--rows")
    variants = []
    for item in filter(None, (v.strip() for v in args.blocks.split(","))):
        name, _, tiles = item.partition(":")
        bn, _, bk = tiles.partition("x")
        if name not in OURS or not (bn.isdigit() and bk.isdigit()) or min(int(bn), int(bk)) < 16:
            raise UserError(f"--blocks takes LAYOUT:BLOCK_NxBLOCK_K with LAYOUT of {', '.join(OURS)} and blocks of "
                            f"at least 16, got {item!r}")
        variants.append((name, int(bn), int(bk)))
    dtype = DTYPES[args.dtype]
    bandwidth = copy_bandwidth("cuda", 2 << 30)  # 2 GiB copied, read plus write counted
    results: list[dict] = []
    notes_all: dict[str, dict] = {}
    for shape in shapes:
        fns, nbytes, notes, mats = layer_candidates(shape, dtype, args.seed, variants)
        notes_all[shape] = notes
        checks = check(fns, mats, dtype, rows=11)
        for rows in rows_list:
            xs = {k: torch.randn(rows, k, device="cuda").to(dtype) for k in {k for _, k in LAYERS[shape]}}
            ks = [k for _, k in LAYERS[shape]]
            times = {}
            for name, parts in fns.items():
                def layer(parts=parts) -> None:  # noqa: ANN001
                    for fn, k in zip(parts, ks):
                        fn(xs[k])
                times[name] = bench_ms(layer)
            for name, ms in times.items():
                results.append({"shape": shape, "rows": rows, "candidate": name, "layer_us": ms * 1e3,
                                "over_half": times["half"] / ms, "bytes": nbytes[name],
                                "read_fraction_of_copy_bandwidth": nbytes[name] / (ms / 1e3) / bandwidth,
                                "max_rel_err": checks.get(name, (None, None))[0],
                                "row_invariant": checks.get(name, (None, None))[1]})
    print(f"machine: {machine('cuda')}; {args.dtype} activations; copy bandwidth {bandwidth / 1e9:.0f} GB/s "
          "(read + write); one decoder layer's four products, median of CUDA-graph replays")
    print(f"{'shape':13} {'rows':>4} {'candidate':22} {'layer us':>9} {'x half':>7} {'of bw':>6} {'max rel err':>12} "
          f"{'row-invariant':>14}")
    for r in results:
        err = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.1e}"
        print(f"{r['shape']:13} {r['rows']:4d} {r['candidate']:22} {r['layer_us']:9.1f} {r['over_half']:7.2f} "
              f"{r['read_fraction_of_copy_bandwidth']:6.2f} {err:>12} {str(r['row_invariant']):>14}")
    for shape, notes in notes_all.items():
        for name, why in notes.items():
            print(f"{shape}: {name} not measured: {why}")
    atomic_write_json(args.output_json, {**machine_info(torch.get_num_threads(), "cuda"),
                                         "machine": machine("cuda"), "torch": torch.__version__,
                                         "dtype": args.dtype, "copy_bytes_per_s": bandwidth,
                                         "rows": results, "absent": notes_all})
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
