"""``/metrics``: the server's Prometheus text (exposition format 0.0.4), and what holds memory.

Counters and gauges come from the scheduler's :class:`~.scheduler.SchedulerStats` and
the KV block manager. Memory: the bytes of the weights (every distinct tensor storage the
model holds, counted once at start), of the KV pool (committed at start-up by
``serve.py``, so it is resident from the first request on), the process's resident set
(``/proc/self/statm``, Linux), and the drafter's process-wide state: the public n-gram
pool's bytes (exact for the C pool's own allocations, an estimate for the pure-Python pool
and the longest mode's public text), its patterns, the public text's tokens, and the
evictions its size limit made (:meth:`~..drafting.drafter.NgramDrafter.public_pool_stats`).
Cost: O(blocks + the C pool's pattern slots) per scrape.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

import torch

from ..api import LLM


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth + 1)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages of every tensor ``model`` holds (parameters, buffers,
    and tensors kept as plain attributes, e.g. fused or quantized weights). O(tensors)."""
    storages: dict[tuple[str, int], int] = {}
    for module in model.modules():
        found = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        found += [t for v in vars(module).values() for t in _tensors(v)]
        for t in found:
            s = t.untyped_storage()
            storages[(str(t.device), s.data_ptr())] = s.nbytes()
    return sum(storages.values())


def resident_bytes() -> int:
    """The process's resident set in bytes (0 where ``/proc`` is not available)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def ngram_pool_stats(llm: LLM) -> dict[str, int]:
    """The drafter's public pool: patterns, public-text tokens, bytes, evictions (zeros without one)."""
    if llm.drafter is None:
        return {"patterns": 0, "tokens": 0, "bytes": 0, "evictions": 0}
    return llm.drafter.public_pool_stats()


def ngram_pool_patterns(llm: LLM) -> int:
    """Distinct n-grams indexed by the drafter's public pool (0 without one)."""
    return llm.drafter.public_patterns() if llm.drafter is not None else 0


def prometheus_text(llm: LLM, weights: int | None = None) -> str:
    """The ``/metrics`` body. ``weights``: the weights' bytes when already counted."""
    scheduler = llm.scheduler
    s = scheduler.stats
    blocks = llm.runner.blocks
    pool = llm.runner.pool
    ngram = ngram_pool_stats(llm)
    rows = [
        ("promptlookup_requests_total", "counter", "Requests by outcome (a stop string ends one as finished).", [
            ('{state="submitted"}', s.requests_submitted), ('{state="finished"}', s.requests_finished),
            ('{state="cancelled"}', s.requests_cancelled), ('{state="failed"}', s.requests_failed)]),
        ("promptlookup_generated_tokens_total", "counter", "Tokens generated.", [("", s.generated_tokens)]),
        ("promptlookup_draft_tokens_total", "counter", "Draft tokens verified.", [("", s.drafted)]),
        ("promptlookup_accepted_draft_tokens_total", "counter", "Draft tokens accepted.", [("", s.accepted)]),
        ("promptlookup_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
         [("", s.accepted / s.drafted if s.drafted else 0.0)]),
        ("promptlookup_tokens_per_step", "gauge", "Generated tokens per sequence step since start.",
         [("", s.generated_tokens / s.sequence_steps if s.sequence_steps else 0.0)]),
        ("promptlookup_sequence_steps_total", "counter", "Verification steps, one per live sequence.",
         [("", s.sequence_steps)]),
        ("promptlookup_batch_steps_total", "counter", "Forward passes of the live batch.", [("", s.batch_steps)]),
        ("promptlookup_prompt_tokens_total", "counter", "Prompt tokens admitted, by source (reused: cached KV blocks).",
         [('{source="computed"}', s.prefill_tokens_computed), ('{source="reused"}', s.prefix_tokens_reused)]),
        ("promptlookup_live_requests", "gauge", "Requests in the live batch.", [("", s.live)]),
        ("promptlookup_waiting_requests", "gauge", "Requests waiting to join the batch.", [("", s.waiting)]),
        ("promptlookup_kv_blocks_in_use", "gauge", "KV cache blocks referenced by live requests.",
         [("", blocks.num_in_use)]),
        ("promptlookup_kv_blocks_total", "gauge", "KV cache blocks.", [("", pool.num_blocks - 1)]),
        ("promptlookup_draft_token_budget", "gauge", "Tokens one step may feed (batch-aware draft budget).",
         [("", scheduler.token_budget)]),
        ("promptlookup_memory_bytes", "gauge", "Bytes held, by holder (resident: the whole process; ngram_pool: "
         "the drafter's public pool or public text, exact for the C pool, else an estimate).", [
            ('{holder="weights"}', weights if weights is not None else weight_bytes(llm.runner.model)),
            ('{holder="kv_pool"}', pool.nbytes), ('{holder="ngram_pool"}', ngram["bytes"]),
            ('{holder="resident"}', resident_bytes())]),
        ("promptlookup_ngram_pool_patterns", "gauge", "Distinct n-grams in the public n-gram pool.",
         [("", ngram["patterns"])]),
        ("promptlookup_ngram_public_text_tokens", "gauge", "Tokens in the longest mode's public text.",
         [("", ngram["tokens"])]),
        ("promptlookup_ngram_pool_evictions_total", "counter", "Size-limit evictions (pool: patterns, least "
         "recently used first; longest mode: public-text rebuilds).", [("", ngram["evictions"])]),
    ]
    lines = []
    for name, kind, help_text, samples in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {value}" for labels, value in samples]
    return "\n".join(lines) + "\n"
