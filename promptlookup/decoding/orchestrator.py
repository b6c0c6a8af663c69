"""V1, orchestrator mode (TensorRT-LLM's ``run_dtm_pld`` workflow), for any :class:`Runner`.

A Python loop drafts from the n-gram drafter, then calls
``runner.generate(whole_sequences, draft_tokens_list=drafts, max_new_tokens=k + 1)`` and
appends what comes back (the accepted draft prefix plus one token of the target's own).
Finished requests leave the batch. Every call re-submits each whole sequence; with KV
block reuse the runner maps the already computed prefix onto cached blocks, so per step
only the last token and the draft are computed, as in the single-call V2 loop. It shares
the request state and its commit rule (:class:`~.request.RequestState`) with
:func:`~.step.step`; only the engine call differs.
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import Runner, SamplingConfig, TreeRunner
from ..runtime.results import SequenceResult, StepCallback
from .lookahead import LookaheadConfig
from .request import request_states


def run_orchestrator(
    runner: Runner,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    end_id: int,
    drafter: Drafter | None,
    sampling: SamplingConfig = SamplingConfig(),
    on_step: StepCallback | None = None,
    step_costs: Sequence[float] | None = None,
    max_candidates: int = 1,
    lookahead: LookaheadConfig | None = None,
    trees: bool = False,
) -> list[SequenceResult]:
    """``trees``: the runner verifies token trees in its ``generate`` call (a
    :class:`~promptlookup.runtime.base.TreeRunner`, ``capabilities.token_trees``), which
    several candidates and Lookahead need."""
    states = request_states(prompts, drafter, runner.limits, max_new_tokens=max_new_tokens, end_id=end_id,
                            sampling=sampling, step_costs=step_costs, max_candidates=max_candidates,
                            lookahead=lookahead, trees=trees, live=False)
    sequences = [list(p) for p in prompts]
    live = states
    while live:
        for s in live:
            s.plan()
        steps = [s.tree() for s in live]
        inputs, ids = [sequences[s.index] for s in live], [s.index for s in live]
        if trees:
            tree_runner: TreeRunner = runner  # type: ignore[assignment]  (capabilities.token_trees)
            outputs = tree_runner.generate(
                inputs, draft_trees=steps, max_new_tokens=max(max(t.depths(), default=0) for t in steps) + 1,
                end_id=end_id, sampling=sampling, request_ids=ids,
            )
        else:
            if not all(t.is_chain for t in steps):
                raise ValueError("this loop verifies chains only")
            drafts = [t.tokens for t in steps]
            outputs = runner.generate(inputs, draft_tokens_list=drafts, max_new_tokens=max(len(d) for d in drafts) + 1,
                                      end_id=end_id, sampling=sampling, request_ids=ids)
        for s, out in zip(live, outputs):
            event = s.commit(out.output_ids, out.accepted, out.choices)
            sequences[s.index].extend(out.output_ids)
            if on_step is not None:
                on_step(event)
        for s in live:
            if s.done:
                s.finish()
        live = [s for s in live if not s.done]
    return [s.result for s in states]
