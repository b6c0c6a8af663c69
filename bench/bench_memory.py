#!/usr/bin/env python3
"""Resident weight memory of a loaded engine, against the engine's own weight bytes.

Each route loads the engine in a fresh process and reports how much memory the weights
keep alive once loading is over:

- ``engine``: ``load_runner``, the path run.py takes (the paged model is built from the
  engine's tensors and owns them; no Hugging Face model is kept);
- ``engine_2copies``: the same with ``--cpu_weight_copies 2`` (row-major copies kept too, for
  faster plain decoding steps on a CPU);
- ``engine_dense``: the same with row-major projections through ``F.linear`` (the layout
  of a GPU, and of ``--torch_compile inductor``), to show that layout's memory on a CPU;
- ``hf_model``: a ``LlamaForCausalLM`` loaded from the engine and handed to
  ``TorchRunner``, as ``promptlookup.hf.generate`` does with a user's model in memory
  (the user keeps their model, so its weights plus the runner's fused copies are live).

Figures: ``rss_mib`` (the growth of the process's resident set, after freeing the
allocator's cached pages, less the KV pool), ``accounted_mib`` (the bytes of the tensors the
runner holds, each storage once), and their ratio to the engine's weight bytes (the
tensors in its ``rank*.safetensors``). On a GPU the device's allocated memory replaces the
resident set.

Each route also times forward steps feeding 1, 2, 4 and 11 tokens after 400 cached ones
(the CPU time of the fastest of 15, in this process, so that other load on the machine
counts little), reported relative to the ``engine`` route's one-token step: what the
second copy buys.

    python bench/bench_memory.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch)

ROUTES = ("engine", "engine_2copies", "engine_dense", "hf_model")
STEP_SIZES = (1, 2, 4, 11)


def _rss_bytes() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # return freed heap pages to the system
    except OSError:
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(route: str, engine_dir: str, device: str) -> dict:
    """Load by ``route`` in this process and return the figures (run in a child process)."""
    import torch

    from promptlookup.checkpoint.load import load_checkpoint, load_checkpoint_state
    from promptlookup.engine.config import read_engine_config
    from promptlookup.engine.load import load_runner
    from promptlookup.runtime.paged_llama import PagedLlama
    from promptlookup.runtime.torch_runner import TorchRunner

    cuda = device.startswith("cuda")
    cfg = read_engine_config(engine_dir)
    before = torch.cuda.memory_allocated() if cuda else _rss_bytes()
    kept = None
    if route == "engine_dense":  # load_runner's path, with the projections a GPU uses
        config, state = load_checkpoint_state(engine_dir, device=device)
        runner = TorchRunner(PagedLlama(config, state, dense_projections=True), cfg.limits,
                             tokens_per_block=cfg.tokens_per_block, max_tokens_in_paged_kv_cache=512)
    elif route.startswith("engine"):
        runner = load_runner(engine_dir, device=device, max_tokens_in_paged_kv_cache=512,
                             cpu_weight_copies=2 if route == "engine_2copies" else 1)
    else:
        kept = load_checkpoint(engine_dir).to(device)  # the user's model, alive beside the runner
        runner = TorchRunner(kept, cfg.limits, tokens_per_block=cfg.tokens_per_block,
                             max_tokens_in_paged_kv_cache=512)
    after = torch.cuda.memory_allocated() if cuda else _rss_bytes()
    pool = sum(t.numel() * t.element_size() for t in (*runner.pool.k, *runner.pool.v))
    accounted = runner.model.resident_weight_bytes()
    if kept is not None:
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in kept.parameters()}
        accounted += sum(storages.values())
    return {"route": route, "device": device, "grown_bytes": after - before - pool, "accounted_bytes": accounted,
            "step_seconds": {str(q): t for q, t in step_seconds(runner, cuda).items()}}


def step_seconds(runner, cuda: bool, context: int = 400, sizes: tuple[int, ...] = STEP_SIZES) -> dict[int, float]:
    """The fastest of 15 forward steps feeding ``q`` tokens after ``context`` cached ones,
    for each ``q`` in ``sizes`` (CPU time of this thread on a CPU, wall time on a GPU)."""
    import time

    from promptlookup.runtime.device import synchronize
    from promptlookup.runtime.kv_cache import SequenceBlocks

    clock = time.perf_counter if cuda else time.thread_time
    seq = SequenceBlocks()
    runner.blocks.ensure_capacity(seq, context + max(sizes))
    runner.forward([[7] * context], [context], [seq.blocks], [1])
    out = {}
    for q in sizes:
        best = float("inf")
        for _ in range(15):
            synchronize(runner.model.device)
            start = clock()
            runner.forward([[7] * q], [context + q], [seq.blocks], [q])
            synchronize(runner.model.device)
            best = min(best, clock() - start)
        out[q] = best
    runner.blocks.release(seq, [])
    return out


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_memory.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="the engine to load")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--routes", default=",".join(ROUTES), help=f"comma-separated subset of {', '.join(ROUTES)}")
    add_num_threads_argument(p, None, "--threads")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/memory.json"), help="where results are written")
    p.add_argument("--child", default=None, choices=ROUTES, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.engine_dir, args.device)))
        return 0
    from promptlookup.errors import UserError
    from promptlookup.fsutil import atomic_write_json
    from promptlookup.threads import configure_threads

    routes = [r for r in args.routes.split(",") if r]
    bad = [r for r in routes if r not in ROUTES]
    if bad:
        raise UserError(f"--routes: unknown route {bad[0]!r}; choose from {', '.join(ROUTES)}")
    threads = configure_threads(args.num_threads)
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_runtime import machine
    from bench.machine import machine_info

    from promptlookup.engine.config import engine_weight_bytes

    engine_bytes = engine_weight_bytes(args.engine_dir)
    rows = []
    for route in routes:
        out = subprocess.run([sys.executable, __file__, "--engine_dir", args.engine_dir, "--device", args.device,
                              "--num_threads", str(threads), "--child", route],
                             check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    mib = 1 << 20
    what = "device memory" if args.device.startswith("cuda") else "resident set"
    print(f"machine: {machine(args.device)}")  # its threads: torch's, set to --threads above
    print(f"engine weight bytes: {engine_bytes / mib:.0f} MiB ({args.engine_dir})")
    unit = rows[0]["step_seconds"]["1"]
    steps = "  ".join(f"{'step ' + str(q):>8s}" for q in STEP_SIZES)
    print(f"{'route':15s} {what + ' grown':>20s} {'ratio':>6s} {'accounted':>12s} {'ratio':>6s}  {steps}")
    for r in rows:
        r["ratio"] = r["grown_bytes"] / engine_bytes
        r["accounted_ratio"] = r["accounted_bytes"] / engine_bytes
        r["relative_step_time"] = {q: t / unit for q, t in r["step_seconds"].items()}
        rel = "  ".join(f"{v:8.2f}" for v in r["relative_step_time"].values())
        print(f"{r['route']:15s} {r['grown_bytes'] / mib:16.0f} MiB {r['ratio']:5.2f}x "
              f"{r['accounted_bytes'] / mib:8.0f} MiB {r['accounted_ratio']:5.2f}x  {rel}")
    print(f"step times are relative to the first route's one-token step ({rows[0]['route']})")
    atomic_write_json(args.output_json, {**machine_info(threads, args.device),
                                         "machine": machine(args.device), "num_threads": threads,
                                         "torch": torch.__version__, "engine_dir": str(args.engine_dir),
                                         "engine_weight_bytes": engine_bytes, "routes": rows})
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
