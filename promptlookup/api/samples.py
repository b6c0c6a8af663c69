"""``SamplingParams.n``: several samples of one prompt, as separate requests and one output.

Sample ``j`` of prompt ``i`` runs as its own request with request id ``i`` (a list's
requests are numbered by position, as ``decoding.generate`` numbers them) and the seed
:func:`~.validation.sample_seed` ``(seed, j)`` (sample 0 keeps ``seed``), so every sample
equals ``generate`` of that prompt alone with that seed, and ``n=1`` is the plain output.
The samples of a prompt share its cached prefix through KV block reuse when it is on.
Greedy selection (``temperature == 0`` or ``top_k == 1``) would give ``n`` equal samples,
so it runs once and its output is copied ``n`` times (as vLLM returns ``n`` identical
outputs for greedy ``n > 1``). Cost: one request per sample (one per prompt when greedy).
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Sequence

from .configs import SamplingParams
from .validation import sample_seed


def expand(prompts: Sequence[Any], params: Sequence[SamplingParams]) -> list[tuple[int, Any, SamplingParams]]:
    """``(prompt index, prompt, params with n=1 and the sample's seed)`` per request to run."""
    runs: list[tuple[int, Any, SamplingParams]] = []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        if sp.n == 1:
            runs.append((i, prompt, sp))
            continue
        count = 1 if sp.sampling_config().greedy else sp.n
        runs.extend((i, prompt, replace(sp, n=1, seed=sample_seed(sp.seed, j))) for j in range(count))
    return runs


def gather(done: Sequence[Any], owners: Sequence[int], params: Sequence[SamplingParams]) -> list[Any]:
    """One finished output per prompt: the first of its requests, with ``outputs`` holding its
    ``n`` samples in order (``index`` 0..n-1; a greedy run copied to fill ``n``)."""
    mine: dict[int, list[Any]] = {}
    for out, owner in zip(done, owners):
        mine.setdefault(owner, []).append(out)
    results = []
    for i, sp in enumerate(params):
        group = mine[i]
        outputs = [g.outputs[0] for g in group]
        while len(outputs) < sp.n:
            outputs.append(copy.deepcopy(outputs[0]))
        for j, c in enumerate(outputs):
            c.index = j
        group[0].outputs = outputs
        results.append(group[0])
    return results


__all__ = ["expand", "gather"]
