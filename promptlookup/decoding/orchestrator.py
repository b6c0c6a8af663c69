"""V1, orchestrator mode (TensorRT-LLM's ``run_dtm_pld`` workflow), for any :class:`Runner`.

A Python loop drafts from the n-gram drafter, then calls
``runner.generate(whole_sequences, draft_tokens_list=drafts, max_new_tokens=k + 1)`` and
appends what comes back (the accepted draft prefix plus one token of the target's own).
Finished requests leave the batch. Every call re-submits each whole sequence; with KV
block reuse the runner maps the already computed prefix onto cached blocks, so per step
only the last token and the draft are computed, as in the single-call V2 loop.
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import Runner, SamplingConfig
from .lookahead import LookaheadConfig
from .loop_state import LoopState
from ..runtime.results import SequenceResult, StepCallback


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
    """``trees``: the runner verifies token trees in its ``generate`` call (the PyTorch
    runner's ``draft_trees``), which several candidates and Lookahead need."""
    state = LoopState(prompts, drafter, max_new_tokens, runner.limits.max_seq_len, end_id, on_step, step_costs,
                      max_candidates=max_candidates, lookahead=lookahead,
                      max_tree_nodes=runner.limits.max_draft_len if trees else None, stop_words=sampling.stop_words)
    sequences = [list(p) for p in prompts]
    while state.active:
        if trees:
            steps = state.trees()
            outputs = runner.generate(
                [sequences[i] for i in state.active], draft_trees=steps,
                max_new_tokens=max(max(t.depths(), default=0) for t in steps) + 1, end_id=end_id,
                sampling=sampling, request_ids=list(state.active),
            )
            drafted = [t.num_walkable for t in steps]
        else:
            drafts = state.drafts()
            outputs = runner.generate(
                [sequences[i] for i in state.active],
                draft_tokens_list=drafts,
                max_new_tokens=max(len(d) for d in drafts) + 1,
                end_id=end_id,
                sampling=sampling,
                request_ids=list(state.active),
            )
            drafted = [len(d) for d in drafts]
        for i, n, out in zip(state.active, drafted, outputs):
            state.commit(i, n, out.output_ids, out.accepted, getattr(out, "choices", ()))
            sequences[i].extend(out.output_ids)
        state.retire_finished()
    return state.results
