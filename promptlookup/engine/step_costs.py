"""Step costs measured once, when the engine is built, on the device it is built for.

The cost-aware draft policy (:mod:`promptlookup.decoding.draft_policy`) needs the relative
cost ``costs[q]`` of a forward step that feeds ``q`` tokens (``costs[1] == 1``). Measuring
it at run time made draft lengths change from run to run and cost every process time, so
``build.sh`` measures it once and stores it in the engine's ``config.json``::

    "step_costs": {"<device type>": {"context": 512, "threads": 2, "costs": [0.0, 1.0, ...],
                                      "kernels": "avx512",
                                      "batched": {"batch_sizes": [1, 2, 4, 8], "costs": [[...], ...]}}}

``run.py`` reads the table for the device it runs on and times nothing; a device without
a table gets full drafts (and a note). On the CPU the table names the product kernels it was
measured on (``kernels``: :func:`promptlookup.runtime.kernels.isa`, ``reference`` being
PyTorch's route, which costs a verification step far less against a plain one); a process
that runs other kernels still reads it, with a note (:func:`route_note`) that a rebuild
measures its own. Tests pass fixed tables. Cost of measuring: four
forward passes per size ``q = 1 .. max_draft_len + 1`` on a scratch sequence, and for the
batched table (:class:`~promptlookup.runtime.batch_costs.BatchStepCosts`, read by the
server's draft budget) three per (batch size, q) on a grid of at most
:data:`BATCH_GRID_ROWS` rows per step, the sequences sharing one prefilled context.
"""
from __future__ import annotations

import time
from typing import Any

from ..runtime.batch_costs import BatchStepCosts
from ..runtime.device import synchronize
from ..runtime.kv_cache import SequenceBlocks
from ..runtime.torch_runner import TorchRunner

DEFAULT_CONTEXT = 512
BATCH_GRID_ROWS = 288  # the largest batched step measured (rows = sequences x tokens each)
BATCH_GRID_Q = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # tokens per sequence measured; others interpolated
TIMED_RUNS = 3  # per step size, after one warm-up; the fastest counts
BATCH_TIMED_RUNS = 2  # the same for the batched grid (larger steps, steadier times)


def _best_time(runner: TorchRunner, *step: Any, runs: int = TIMED_RUNS) -> float:
    """The fastest of ``runs`` runs of ``runner.forward(*step)``, after a warm-up.

    On a CPU the clock is the process's CPU time, so that other load on the machine (time
    spent waiting for a core) does not count; on a GPU it is wall time around a
    synchronised step."""
    dev = runner.model.device
    clock = time.process_time if dev.type == "cpu" else time.perf_counter
    best = float("inf")
    for rep in range(runs + 1):
        synchronize(dev)
        start = clock()
        runner.forward(*step)
        synchronize(dev)
        if rep:
            best = min(best, clock() - start)
    return best


def _monotone(costs: list[float]) -> list[float]:
    for q in range(2, len(costs)):
        costs[q] = max(costs[q], costs[q - 1])
    return costs


def measure_step_costs(runner: TorchRunner, max_tokens: int, context: int = DEFAULT_CONTEXT) -> list[float]:
    """``costs[q]`` for ``1 <= q <= max_tokens`` (``costs[0] = 0``): the fastest step
    (:func:`_best_time`) feeding ``q`` tokens after ``context`` cached ones, divided by
    the one-token time. Made monotone (a larger step never costs less)."""
    seq = SequenceBlocks()
    room = runner.blocks.num_available * runner.pool.block_size - max_tokens
    context = max(1, min(context, room, runner.limits.max_seq_len - max_tokens))
    try:
        runner.blocks.ensure_capacity(seq, context + max_tokens)
        runner.forward([[0] * context], [context], [seq.blocks], [1])  # real K/V for the context
        times = [0.0] + [_best_time(runner, [[0] * q], [context + q], [seq.blocks], [q])
                         for q in range(1, max_tokens + 1)]
    finally:
        runner.blocks.release(seq, [])
    return _monotone([0.0] + [t / times[1] for t in times[1:]])


def batch_sizes_for(max_batch_size: int) -> list[int]:
    """Powers of two up to ``max_batch_size``, and ``max_batch_size`` itself."""
    sizes = [1]
    while sizes[-1] * 2 <= max_batch_size:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == max_batch_size else sizes + [max_batch_size]


def measure_batch_costs(
    runner: TorchRunner, max_tokens: int, batch_sizes: list[int], context: int = DEFAULT_CONTEXT
) -> BatchStepCosts:
    """The batched table: for each ``n`` in ``batch_sizes``, the cost of a step in which ``n``
    sequences each feed ``q`` tokens after ``context`` cached ones, relative to one sequence
    feeding one token; ``q`` on :data:`BATCH_GRID_Q` and ``max_tokens``, with
    ``n * q <= BATCH_GRID_ROWS`` (at least ``q = 2``), linearly interpolated in between;
    made monotone in ``q`` and in ``n``.

    The sequences share one prefilled context (their block tables start with the same
    blocks; each writes its new tokens into blocks of its own), which costs one prefill
    and reads as many K/V rows per step as separate contexts would."""
    bs = runner.pool.block_size
    context = max(bs, context - context % bs)
    shared = SequenceBlocks()
    tails = [SequenceBlocks() for _ in range(max(batch_sizes))]
    try:
        runner.blocks.ensure_capacity(shared, context)
        runner.forward([[0] * context], [context], [shared.blocks], [1])
        for t in tails:
            runner.blocks.ensure_capacity(t, max_tokens)
        tables = [shared.blocks + t.blocks for t in tails]
        rows = []
        unit = None
        grid = sorted({q for q in BATCH_GRID_Q if q <= max_tokens} | {max_tokens})
        for n in batch_sizes:
            qs = [q for q in grid if n * q <= BATCH_GRID_ROWS or q <= 2]
            timed = {q: _best_time(runner, [[0] * q] * n, [context + q] * n, tables[:n], [q] * n, runs=BATCH_TIMED_RUNS)
                     for q in qs}
            unit = unit or timed[1]
            row = [0.0]
            for q in range(1, qs[-1] + 1):  # linear in q between measured sizes
                lo = max(x for x in qs if x <= q)
                hi = min(x for x in qs if x >= q)
                t = timed[lo] if lo == hi else timed[lo] + (q - lo) / (hi - lo) * (timed[hi] - timed[lo])
                row.append(t / unit)
            if rows:  # more sequences never cost less
                row = [max(c, rows[-1][q]) if q < len(rows[-1]) else c for q, c in enumerate(row)]
            rows.append(tuple(_monotone(row)))
    finally:
        runner.blocks.release(shared, [])
        for t in tails:
            runner.blocks.release(t, [])
    return BatchStepCosts(tuple(batch_sizes), tuple(rows))


def table_entry(
    runner: TorchRunner, max_tokens: int, context: int = DEFAULT_CONTEXT, max_batch_size: int = 1
) -> dict[str, Any]:
    """What ``config.json``'s ``step_costs`` holds for the runner's device type (the
    batched table too when ``max_batch_size > 1``)."""
    import torch

    costs = measure_step_costs(runner, max_tokens, context)
    entry: dict[str, Any] = {"context": context, "threads": torch.get_num_threads(), "costs": [round(c, 4) for c in costs]}
    if runner.model.device.type == "cpu":
        from ..runtime import kernels

        entry["kernels"] = kernels.isa()
    if max_batch_size > 1:
        entry["batched"] = measure_batch_costs(runner, max_tokens, batch_sizes_for(max_batch_size), context).to_json()
    return entry


def batch_costs_for(config_step_costs: dict[str, Any] | None, device_type: str) -> BatchStepCosts | None:
    """The stored batched table for ``device_type``, or ``None``."""
    entry = (config_step_costs or {}).get(device_type)
    return BatchStepCosts.from_json(entry.get("batched")) if isinstance(entry, dict) else None


def costs_for(config_step_costs: dict[str, Any] | None, device_type: str) -> list[float] | None:
    """The stored table for ``device_type`` (``cpu``, ``cuda``), or ``None``."""
    entry = (config_step_costs or {}).get(device_type)
    if not isinstance(entry, dict) or not isinstance(entry.get("costs"), list) or len(entry["costs"]) < 2:
        return None
    return [float(c) for c in entry["costs"]]


def route_note(config_step_costs: dict[str, Any] | None, device_type: str) -> str | None:
    """A note where the stored CPU table was measured on other product kernels than this
    process runs (``None`` otherwise, and for tables that do not say)."""
    entry = (config_step_costs or {}).get(device_type)
    measured = entry.get("kernels") if isinstance(entry, dict) else None
    if device_type != "cpu" or not isinstance(measured, str):
        return None
    from ..runtime import kernels

    now = kernels.isa()
    if measured == now:
        return None
    name = {"reference": "PyTorch's"}.get
    return (f"its step-cost table was measured on {name(measured, 'the ' + measured)} products and this process "
            f"runs {name(now, 'the ' + now)} ones, so the draft lengths follow costs of another route; rebuild it "
            "with build.sh to measure them")
