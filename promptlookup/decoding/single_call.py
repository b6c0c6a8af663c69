"""V2, single call: the drafting loop inside one ``generate`` on a live-batch runner.

The batch's sequences keep their KV blocks for the whole call, so nothing is ever
re-submitted: each :func:`~.step.step` feeds every live sequence its last token plus its
draft tree (a chain, several candidates, or Lookahead's window and candidates), in one
forward pass for the whole batch, and keeps each sequence's accepted path. Each request's
own cost policy sizes its drafts; with chain drafts, several prompts and the engine's
batched step costs, the drafts of a step are then cut to those expected to pay for
themselves in the batched step (:func:`~.draft_budget.allot_by_cost`, as the server's
scheduler does, with a token budget that never binds: every request may draft its k).
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import LiveBatchRunner, SamplingConfig
from ..runtime.results import SequenceResult, StepCallback
from .draft_budget import BatchBudget
from .lookahead import LookaheadConfig
from .request import request_states
from .step import step


def run_single_call(
    runner: LiveBatchRunner,
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
) -> list[SequenceResult]:
    states = request_states(prompts, drafter, runner.limits, max_new_tokens=max_new_tokens, end_id=end_id,
                            sampling=sampling, step_costs=step_costs, max_candidates=max_candidates,
                            lookahead=lookahead, trees=True, live=True)
    budget = None
    if step_costs and runner.batch_step_costs is not None and drafter is not None and lookahead is None \
            and max_candidates == 1 and len(prompts) > 1:
        k = drafter.config.prompt_lookup_num_tokens
        budget = BatchBudget(len(prompts) * (k + 1), step_costs, runner.batch_step_costs, k,
                             ragged=runner.skips_padding)
    batch = runner.open(prompts)
    try:
        live = states
        while live:
            for event in step(batch, live, budget):
                if on_step is not None:
                    on_step(event)
            for s in live:
                if s.done:
                    s.finish()
            live = [s for s in live if not s.done]
    finally:
        batch.close()
    return [s.result for s in states]
