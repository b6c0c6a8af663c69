"""Step costs measured once, when the engine is built, on the device it is built for.

The cost-aware draft policy (:mod:`promptlookup.decoding.draft_policy`) needs the relative
cost ``costs[q]`` of a forward step that feeds ``q`` tokens (``costs[1] == 1``). Measuring
it at run time made draft lengths change from run to run and cost every process time, so
``build.sh`` measures it once and stores it in the engine's ``config.json``::

    "step_costs": {"<device type>": {"context": 512, "threads": 2, "costs": [0.0, 1.0, ...]}}

``run.py`` reads the table for the device it runs on and times nothing; a device without
a table gets full drafts (and a note). Tests pass fixed tables. Cost of measuring: three
forward passes per size ``q = 1 .. max_draft_len + 1`` on a scratch sequence.
"""
from __future__ import annotations

import time
from typing import Any

from ..runtime.device import synchronize
from ..runtime.kv_cache import SequenceBlocks
from ..runtime.torch_runner import TorchRunner

DEFAULT_CONTEXT = 512


def measure_step_costs(runner: TorchRunner, max_tokens: int, context: int = DEFAULT_CONTEXT) -> list[float]:
    """``costs[q]`` for ``1 <= q <= max_tokens`` (``costs[0] = 0``): the best of two timed
    steps (after a warm-up) feeding ``q`` tokens after ``context`` cached ones, divided by
    the one-token time. Made monotone (a larger step never costs less)."""
    seq = SequenceBlocks()
    room = runner.blocks.num_available * runner.pool.block_size - max_tokens
    context = max(1, min(context, room, runner.limits.max_seq_len - max_tokens))
    dev = runner.model.device
    try:
        runner.blocks.ensure_capacity(seq, context + max_tokens)
        runner.forward([[0] * context], [context], [seq.blocks], [1])  # real K/V for the context
        times = [0.0]
        for q in range(1, max_tokens + 1):
            best = float("inf")
            for rep in range(3):
                synchronize(dev)
                start = time.perf_counter()
                runner.forward([[0] * q], [context + q], [seq.blocks], [q])
                synchronize(dev)
                if rep:
                    best = min(best, time.perf_counter() - start)
            times.append(best)
    finally:
        runner.blocks.release(seq, [])
    costs = [0.0] + [t / times[1] for t in times[1:]]
    for q in range(2, len(costs)):
        costs[q] = max(costs[q], costs[q - 1])
    return costs


def table_entry(runner: TorchRunner, max_tokens: int, context: int = DEFAULT_CONTEXT) -> dict[str, Any]:
    """What ``config.json``'s ``step_costs`` holds for the runner's device type."""
    import torch

    costs = measure_step_costs(runner, max_tokens, context)
    return {"context": context, "threads": torch.get_num_threads(), "costs": [round(c, 4) for c in costs]}


def costs_for(config_step_costs: dict[str, Any] | None, device_type: str) -> list[float] | None:
    """The stored table for ``device_type`` (``cpu``, ``cuda``), or ``None``."""
    entry = (config_step_costs or {}).get(device_type)
    if not isinstance(entry, dict) or not isinstance(entry.get("costs"), list) or len(entry["costs"]) < 2:
        return None
    return [float(c) for c in entry["costs"]]
