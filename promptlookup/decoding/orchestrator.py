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
from .loop_state import LoopState
from .result import SequenceResult, StepCallback


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
) -> list[SequenceResult]:
    state = LoopState(prompts, drafter, max_new_tokens, runner.limits.max_seq_len, end_id, on_step, step_costs,
                      stop_words=sampling.stop_words)
    sequences = [list(p) for p in prompts]
    while state.active:
        drafts = state.drafts()
        outputs = runner.generate(
            [sequences[i] for i in state.active],
            draft_tokens_list=drafts,
            max_new_tokens=max(len(d) for d in drafts) + 1,
            end_id=end_id,
            sampling=sampling,
            request_ids=list(state.active),
        )
        for i, draft, out in zip(state.active, drafts, outputs):
            state.commit(i, len(draft), out.output_ids, out.num_accepted_draft_tokens)
            sequences[i].extend(out.output_ids)
        state.retire_finished()
    return state.results
