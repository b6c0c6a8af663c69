"""V2's single call sizes a batch's chain drafts by the engine's batched step costs
(:func:`promptlookup.decoding.draft_budget.allot_by_cost`), never changing the output."""
from __future__ import annotations

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.batch_costs import BatchStepCosts
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import END_ID, MAX_NEW, make_prompts
from tests.tiny import tiny_llama

FLAT = [0.0] + [1.0] * 40  # one sequence alone: drafts look free


def run(batch_costs: BatchStepCosts | None, prompts: list[list[int]]):
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    runner = TorchRunner(tiny_llama(seed=0), limits, tokens_per_block=8, step_cost_table=FLAT,
                         batch_step_costs=batch_costs)
    return generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft_length_policy="cost",
                    draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2))


def test_batched_drafts_follow_the_batched_costs_and_the_output_does_not_change():
    prompts = make_prompts(0)[:3]
    sizes = (1, 2, 3)
    cheap = BatchStepCosts(sizes, tuple((0.0,) + (1.0,) * 16 for _ in sizes))
    dear = BatchStepCosts(sizes, ((0.0,) + (1.0,) * 16, (0.0, 1.0) + (4.0,) * 15, (0.0, 1.0) + (6.0,) * 15))
    plain = [r.output_ids for r in run(None, prompts)]
    free, priced = run(cheap, prompts), run(dear, prompts)
    assert [r.output_ids for r in free] == plain and [r.output_ids for r in priced] == plain
    assert sum(r.tree_tokens for r in free) > 0
    # a draft token multiplies a batched step's cost by 4-6: no draft pays for itself until one sequence is left
    assert sum(r.tree_tokens for r in priced) < sum(r.tree_tokens for r in free)
