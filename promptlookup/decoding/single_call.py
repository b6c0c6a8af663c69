"""V2, single call: the drafting loop inside one ``generate`` on the PyTorch runner.

The batch's sequences keep their KV blocks for the whole call, so nothing is ever
re-submitted: each step feeds every live sequence its last token plus its draft tree (a
chain, several candidates, or Lookahead's window and candidates), in one forward pass
for the whole batch, and keeps each sequence's accepted path.
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import SamplingConfig
from ..runtime.torch_runner import TorchRunner
from .lookahead import LookaheadConfig
from .loop_state import LoopState
from ..runtime.results import SequenceResult, StepCallback


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
    max_candidates: int = 1,
    lookahead: LookaheadConfig | None = None,
) -> list[SequenceResult]:
    state = LoopState(prompts, drafter, max_new_tokens, runner.limits.max_seq_len, end_id, on_step, step_costs,
                      max_candidates=max_candidates, lookahead=lookahead, max_tree_nodes=runner.limits.max_draft_len,
                      stop_words=sampling.stop_words)
    batch = runner.open(prompts)
    try:
        while state.active:
            trees = state.trees()
            steps = batch.step_trees(state.active, trees, end_id, sampling)
            for i, tree, step in zip(state.active, trees, steps):
                state.commit(i, tree.num_walkable, step.tokens, step.accepted, step.choices)
            state.retire_finished()
    finally:
        batch.close()
    return state.results
