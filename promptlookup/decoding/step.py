"""The step: schedule -> draft -> verify -> commit, over a batch of request states.

One function, :func:`step`, is every live-batch loop's step: V2's single call
(``decoding.generate``), the scheduler's continuous batching (the LLM API and
``serve.py``) and so the server's output equals ``generate``'s by construction::

    states (live requests)
      | plan      each proposer prepares its draft tree within its limits
      | grant     a batch budget (the scheduler's) cuts chain drafts; generate has none
      | tree      each tree is built once, from the plan and the grant
      | verify    one DecodeBatch.step_trees per (sampling, end_id) group
      | commit    RequestState.commit: the one commit rule (max_new_tokens, stop words, end_id)
      v
    one StepEvent per request

V1's orchestrator (:mod:`.orchestrator`) runs the same plan/tree/commit around a
``Runner.generate`` call instead of a live batch.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..runtime.base import LiveBatch, SamplingConfig
from ..runtime.results import StepEvent
from .draft_budget import BatchBudget
from .request import RequestState


def sampling_groups(states: Sequence[RequestState]) -> dict[tuple[SamplingConfig, int], list[int]]:
    """Positions in ``states`` by (sampling, end_id), in order: one forward pass each. The
    sampling's ``logprobs`` is not part of the key (it changes no token: a group's members
    ask for theirs each)."""
    groups: dict[tuple[SamplingConfig, int], list[int]] = {}
    for j, s in enumerate(states):
        key = s.sampling if s.sampling.logprobs is None else replace(s.sampling, logprobs=None)
        groups.setdefault((key, s.end_id), []).append(j)
    return groups


def step(batch: LiveBatch, states: Sequence[RequestState], budget: BatchBudget | None = None) -> list[StepEvent]:
    """One step for every request in ``states`` (each holding its ``slot`` in ``batch``);
    returns their events, in order. Finished requests stay in ``states``: the caller
    retires them (``state.done``). Cost: one forward pass per sampling group, plus the
    proposers' and the budget's host work."""
    wanted = [s.plan() for s in states]
    caps: Sequence[int | None] = [None] * len(states)
    if budget is not None:
        caps = budget.grant(wanted, [s.proposer.rates() for s in states])
    trees = [s.tree(c) for s, c in zip(states, caps)]
    events: list[StepEvent | None] = [None] * len(states)
    for (sampling, end_id), members in sampling_groups(states).items():
        slots = [states[j].slot for j in members]
        group = [trees[j] for j in members]
        wanted = [states[j].sampling.logprobs for j in members]
        if any(w is not None for w in wanted):  # only then the keyword: a step without it is unchanged
            results = batch.step_trees(slots, group, end_id, sampling, logprobs=wanted)  # type: ignore[arg-type]
        else:
            results = batch.step_trees(slots, group, end_id, sampling)  # type: ignore[arg-type]
        for j, r in zip(members, results):
            events[j] = states[j].commit(r.tokens, r.accepted, r.choices, r.logprobs)
    return events  # type: ignore[return-value]
