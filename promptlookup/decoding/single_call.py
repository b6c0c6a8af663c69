"""V2, single call: the drafting loop inside one ``generate`` on the PyTorch runner.

The batch's sequences keep their KV blocks for the whole call, so nothing is ever
re-submitted: each step feeds every live sequence its last token plus its draft, in one
forward pass for the whole batch, and rolls back the rejected slots per sequence.
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import SamplingConfig
from ..runtime.torch_runner import TorchRunner
from .loop_state import LoopState
from .result import SequenceResult, StepCallback


def run_single_call(
    runner: TorchRunner,
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
    batch = runner.open(prompts)
    try:
        while state.active:
            drafts = state.drafts()
            steps = batch.step(state.active, drafts, end_id, sampling)
            for i, draft, step in zip(state.active, drafts, steps):
                state.commit(i, len(draft), step.tokens, step.accepted)
            state.retire_finished()
    finally:
        batch.close()
    return state.results
