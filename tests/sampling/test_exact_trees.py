"""Sampling through token trees stays exact: Lookahead and multi-candidate prompt lookup.

Each node's token is chosen with the noise of (seed, request, position), so along whichever
path the target accepts, every choice is the one plain sampling makes there. The samples
must follow the exact law of the filtered, tempered model (chi-square, as for chains).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from promptlookup.decoding import generate
from promptlookup.decoding.lookahead import LookaheadConfig
from promptlookup.drafting import make_drafter
from promptlookup.drafting.base import DraftConfig
from tests.sampling.exact import describe, goodness_of_fit
from tests.sampling.test_exact_distribution import (
    ALPHA, BATCH, END_ID, K, NEW_TOKENS, PROMPTS, SAMPLERS, new_runner, trees,
)

DRAWS = 10  # batches of BATCH samples


def draw_tree_mode(name: str, *, lookahead: LookaheadConfig | None, candidates: int, seed0: int):
    runner = new_runner()
    counts = [Counter() for _ in PROMPTS]
    drafted = accepted = 0
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(BATCH)]
    for b in range(DRAWS):
        sampling = replace(SAMPLERS[name], random_seed=seed0 + b)
        draft = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, max_candidates=candidates)
        results = generate(runner, prompts, max_new_tokens=NEW_TOKENS, end_id=END_ID, sampling=sampling,
                           drafter=make_drafter(draft) if candidates else None, lookahead=lookahead,
                           draft_length_policy="full")
        for i, r in enumerate(results):
            counts[i % len(PROMPTS)][tuple(r.output_ids)] += 1
            drafted += r.drafted
            accepted += r.accepted
    return counts, (drafted, accepted)


@pytest.mark.parametrize("mode", ["lookahead", "lookahead+lookup", "candidates"])
def test_tree_samples_follow_the_exact_law(mode):
    assert K >= 4
    name = "t1.0"
    lookahead = {"lookahead": LookaheadConfig(2, 2, 2), "lookahead+lookup": LookaheadConfig(1, 2, 1)}.get(mode)
    candidates = 0 if mode == "lookahead" else (1 if mode == "lookahead+lookup" else 2)
    counts, (drafted, accepted) = draw_tree_mode(name, lookahead=lookahead, candidates=candidates, seed0=7000)
    fit = goodness_of_fit(counts, [t.joint for t in trees(name)])
    assert fit.outside_support == 0, describe(fit)
    assert fit.p_value > ALPHA, describe(fit)
    assert accepted > 0  # the trees did real work
