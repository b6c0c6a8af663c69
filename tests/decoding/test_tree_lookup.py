"""Multi-candidate prompt lookup: several drafts per step, verified as one prefix tree."""
import pytest

from promptlookup.decoding import generate
from promptlookup.decoding.draft_policy import DraftLengthPolicy
from promptlookup.drafting.base import DraftConfig
from tests.decoding.test_lookahead import model_and_plain  # noqa: F401
from tests.runtime.test_greedy_equivalence import END_ID, MAX_NEW


@pytest.mark.parametrize("mode", ["pool", "longest"])
@pytest.mark.parametrize("g", [2, 4])
def test_tree_lookup_is_token_identical_and_accepts_more(model_and_plain, mode, g):  # noqa: F811
    make, prompts, plain = model_and_plain
    chain = generate(make(), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft_length_policy="full",
                     draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2, mode=mode))
    tree = generate(make(), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft_length_policy="full",
                    draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2, mode=mode,
                                      is_keep_all=True, max_candidates=g))
    assert [r.output_ids for r in chain] == plain
    assert [r.output_ids for r in tree] == plain
    assert sum(r.steps for r in tree) <= sum(r.steps for r in chain)


@pytest.mark.parametrize("reuse", [True, False])
def test_tree_lookup_unbatched_and_under_eviction(model_and_plain, reuse):  # noqa: F811
    make, prompts, plain = model_and_plain
    longest = max(len(p) for p in prompts) + MAX_NEW + 24
    runner = make(reuse=reuse, kv_tokens=longest + 24, block=4)
    draft = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=3, max_candidates=3)
    for p, want in zip(prompts, plain):
        got = generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft)
        assert got[0].output_ids == want
    if reuse:
        assert runner.blocks.stats.evicted_blocks > 0


def test_policy_keeps_trees_small_where_steps_are_expensive():
    steep = [0.0] + [1.0 + 0.6 * (q - 1) for q in range(1, 40)]
    flat = [0.0] + [1.0] * 39
    cands = [[1, 2, 3, 4], [1, 2, 9], [5, 6, 7], [8, 8]]
    cheap = DraftLengthPolicy(flat).choose_candidates(cands, 32)
    dear = DraftLengthPolicy(steep).choose_candidates(cands, 32)
    assert len(cheap) == 4
    assert len(dear) < len(cheap)
    assert DraftLengthPolicy(flat).choose_candidates(cands, 5) == [[1, 2, 3, 4], [1, 2, 9]]


def test_tree_lookup_in_the_v1_loop(model_and_plain):  # noqa: F811
    make, prompts, plain = model_and_plain
    draft = DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2, mode="longest", max_candidates=3)
    got = generate(make(), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow="v1",
                   draft_length_policy="full")
    assert [r.output_ids for r in got] == plain
