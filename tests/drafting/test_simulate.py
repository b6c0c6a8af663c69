"""Offline statistics: the simulation is greedy verification against the recorded stream."""
from __future__ import annotations

import random

from promptlookup.drafting import DraftConfig, config_grid, make_drafter, simulate, simulate_corpus


def _by_hand(tokens, prompt_len, config):
    """The same protocol written out with the public API, to compare the counts."""
    req = make_drafter(config).new_request(tokens[:prompt_len], len(tokens))
    pos = prompt_len
    steps = drafted = accepted = 0
    while pos < len(tokens):
        draft = req.propose()
        a = 0
        while a < len(draft) and draft[a] == tokens[pos + a]:
            a += 1
        req.record(len(draft), a)
        req.extend(tokens[pos:pos + a + 1])
        pos += a + 1
        steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + a
    return steps, drafted, accepted


def test_known_example():
    # prompt "1 2 3 4", output "1 2 3 4", so max_seq_len is 8. Step 1: the tail "4" never
    # occurred before: no draft, the target emits 1. Step 2: tail "1" -> "2 3 4 1", cut to
    # 8 - 1 - 5 = 2 tokens "2 3"; both accepted, then the target's own token 4. Done.
    tokens = [1, 2, 3, 4, 1, 2, 3, 4]
    st = simulate(tokens, 4, DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=1))
    assert (st.steps, st.generated, st.drafted, st.accepted, st.proposals) == (2, 4, 2, 2, 1)
    assert st.tokens_per_step == 2.0
    assert st.acceptance_rate == 1.0


def test_counts_match_the_protocol_on_random_streams():
    rnd = random.Random(5)
    for cfg in config_grid(DraftConfig(), [2, 5], [1, 3], ["pool", "longest"], [False, True]):
        tokens = [rnd.randrange(4) for _ in range(120)]
        st = simulate(tokens, 30, cfg)
        assert (st.steps, st.drafted, st.accepted) == _by_hand(tokens, 30, cfg)
        assert st.generated == 90 and st.accepted <= st.drafted
        assert st.steps + st.accepted == st.generated  # each step: accepted + 1 tokens


def test_repetitive_text_beats_random_text():
    rnd = random.Random(1)
    noise = [rnd.randrange(50) for _ in range(400)]
    copy = noise[:200] + noise[:200]
    cfg = DraftConfig(prompt_lookup_num_tokens=8, mode="longest")
    assert simulate(copy, 200, cfg).tokens_per_step > 4 > simulate(noise, 200, cfg).tokens_per_step


def test_corpus_shares_the_public_pool():
    rnd = random.Random(2)
    doc = [rnd.randrange(100) for _ in range(100)]
    seqs = [([500], 1), ([500] + doc, 1), ([501] + doc, 1)]
    shared = simulate_corpus(seqs, DraftConfig(mode="longest", is_public_pool=True))
    alone = simulate_corpus(seqs, DraftConfig(mode="longest", is_public_pool=False))
    assert shared.sequences == 3 and shared.generated == 200
    assert shared.accepted > alone.accepted


def test_grid_varies_n_only_for_the_pool_mode():
    grid = config_grid(DraftConfig(), [4, 10], [1, 2, 3], ["pool", "longest"], [False])
    assert len(grid) == 6 + 2
