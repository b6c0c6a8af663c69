#!/usr/bin/env python3
"""Host time per step of draft acceptance: on the device (``runtime/acceptance.py``,
what the runner does) against the host walk (``tolist`` then ``runtime/tree.accept_path``).

Both start from the chosen tokens on ``--device`` and end with the choices and accepted
paths on the host; both make one device-to-host copy. Shapes: one or eight chains of
10 drafts, eight plain rows, four merged trees of six 8-token candidates.

    python bench/bench_acceptance.py [--device cpu]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.runtime.acceptance import fetch_step  # noqa: E402
from promptlookup.runtime.device import synchronize  # noqa: E402
from promptlookup.runtime.tree import DraftTree, accept_path, merge_chains  # noqa: E402


def host_walk(trees: list[DraftTree], chosen: torch.Tensor, end_id: int) -> list[list[int]]:
    host, row, paths = chosen.tolist(), 0, []
    for tree in trees:
        paths.append(accept_path(tree, host[row : row + len(tree) + 1], end_id)[0])
        row += len(tree) + 1
    return paths


def per_call_us(fn, repeat: int, device: str) -> float:
    fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / repeat * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=2000)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(0)
    shapes = {
        "1 chain of 10": [DraftTree.chain([3] * 10)],
        "8 chains of 10": [DraftTree.chain([3] * 10)] * 8,
        "8 plain rows": [DraftTree.chain([])] * 8,
        "4 trees of 6x8 candidates": [merge_chains([[rng.randrange(3, 6) for _ in range(8)] for _ in range(6)])] * 4,
    }
    print(f"{machine_header(machine_info(torch.get_num_threads(), args.device))}; torch {torch.__version__}, "
          f"{args.device}; microseconds per step")
    print(f"{'step':28} {'device walk':>12} {'host walk':>10}")
    for name, trees in shapes.items():
        rows = sum(len(t) + 1 for t in trees)
        chosen = torch.tensor([rng.randrange(3, 6) for _ in range(rows)], device=args.device)
        device = per_call_us(lambda: fetch_step(trees, chosen, 2), args.repeat, args.device)
        host = per_call_us(lambda: host_walk(trees, chosen, 2), args.repeat, args.device)
        assert fetch_step(trees, chosen, 2)[1] == host_walk(trees, chosen, 2)
        print(f"{name:28} {device:12.1f} {host:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
