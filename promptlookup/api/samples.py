"""``SamplingParams.n``: several samples of one prompt, as separate requests and one output.

Sample ``j`` of prompt ``i`` (of ``P`` prompts) runs as its own request with request id
``i + j * P``: with ``n == 1`` a list's requests are numbered by position, as
``decoding.generate`` numbers them, and one prompt's samples are request ids ``0..n-1`` with
the same seed, as ``serve.py`` numbers the choices of a seeded request. The sampling noise
is keyed by ``(seed, request id, position)``, so every sample is reproducible on its own
(it equals ``generate_async(prompt, params, request_id=i + j * P)``) and the samples differ.
The samples of a prompt share its cached prefix through KV block reuse when it is on.
Greedy selection (``temperature == 0`` or ``top_k == 1``) would give ``n`` equal samples,
so it runs once and its output is copied ``n`` times (vLLM also returns ``n`` identical
outputs for greedy ``n > 1``). Cost: one request per sample (one per prompt when greedy).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .configs import SamplingParams


@dataclass(frozen=True)
class Run:
    """One request to submit: sample ``index`` of prompt ``owner``."""

    owner: int
    prompt: Any
    params: SamplingParams  # n == 1
    request_id: int
    index: int


def expand(prompts: Sequence[Any], params: Sequence[SamplingParams]) -> list[Run]:
    """The requests to run for ``prompts`` with their ``params`` (one each), in submission order."""
    runs: list[Run] = []
    count = len(prompts)
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        single = sp if sp.n == 1 else replace(sp, n=1)
        samples = 1 if sp.sampling_config().greedy else sp.n
        runs.extend(Run(i, prompt, single, i + j * count, j) for j in range(samples))
    return runs


def gather(done: Sequence[Any], runs: Sequence[Run], params: Sequence[SamplingParams]) -> list[Any]:
    """One finished output per prompt: the first of its requests, with ``outputs`` holding its
    ``n`` samples in order (``index`` 0..n-1; a greedy run copied to fill ``n``)."""
    mine: dict[int, list[Any]] = {}
    for out, run in zip(done, runs):
        mine.setdefault(run.owner, []).append(out)
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


__all__ = ["Run", "expand", "gather"]
