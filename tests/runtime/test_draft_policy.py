"""The cost-aware draft length policy: output-neutral, and sensible choices."""
import pytest

from promptlookup.decoding import generate
from promptlookup.decoding.draft_policy import DraftLengthPolicy
from promptlookup.drafting.base import DraftConfig
from tests.runtime.test_greedy_equivalence import END_ID, MAX_NEW, make_prompts, runner_for
from tests.tiny import tiny_llama

FLAT = [0.0] + [1.0] * 17
STEEP = [0.0, 1.0] + [1.0 + 0.5 * q for q in range(1, 17)]


def test_flat_costs_verify_the_whole_draft():
    policy = DraftLengthPolicy(FLAT)
    assert policy.choose(list(range(10))) == 10


def test_steep_costs_and_failing_drafts_switch_drafting_off_then_recover():
    policy = DraftLengthPolicy(STEEP)
    proposal = [7, 8, 9, 10]
    for _ in range(12):
        d = policy.choose(proposal)
        policy.observe(proposal, d, [99])  # the target never agrees
    assert policy.choose(proposal) == 0
    for _ in range(12):
        d = policy.choose(proposal)
        policy.observe(proposal, d, proposal[: d] + [proposal[d] if d < len(proposal) else 5])
    assert policy.choose(proposal) == len(proposal)


def test_draft_never_longer_than_the_cost_table():
    policy = DraftLengthPolicy([0.0, 1.0, 1.0, 1.0])
    assert policy.choose(list(range(10))) <= 2


@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_policy_changes_no_token(workflow):
    model = tiny_llama(seed=5)
    prompts = make_prompts(5)
    draft = DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)
    outs = {}
    for policy in ("cost", "full"):
        runner = runner_for(model)
        runner.step_cost_table = STEEP  # a fixed table, as an engine stores it
        res = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow,
                       draft_length_policy=policy)
        outs[policy] = ([r.output_ids for r in res], sum(r.drafted for r in res))
    assert outs["cost"][0] == outs["full"][0]
    assert outs["cost"][1] < outs["full"][1]
