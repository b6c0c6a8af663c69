"""The size limits on the drafter's process-wide state (issue 23, "bounded memory"): the
n-gram pools keep at most ``max_patterns`` patterns, least recently used evicted first, the
same in C and Python; the longest mode's public text keeps its most recent tokens; greedy
output is unchanged by either."""
from __future__ import annotations

import random

import pytest

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting import pool as python_pool
from promptlookup.drafting.pool_v1 import PLDCursor, PLDPool
from promptlookup.errors import UserError
from tests.drafting.implementations import NAMES, require, require_native


def pool_module(implementation: str):
    return python_pool if implementation == "python" else require_native("pool")


@pytest.mark.parametrize("implementation", NAMES)
@pytest.mark.parametrize("limit", [1, 7, 60])
def test_pool_never_exceeds_its_limit_over_a_long_random_stream(implementation, limit):
    mod = pool_module(implementation)
    rng = random.Random(limit)
    pool = mod.NGramPool(4, 3, True, True, 1, limit)
    texts = [[rng.randrange(9) for _ in range(5)] for _ in range(3)]
    cursors = [mod.PoolCursor(pool) for _ in texts]
    for _ in range(1500):
        i = rng.randrange(3)
        texts[i].extend(rng.randrange(9) for _ in range(rng.randint(1, 5)))
        cursors[i].propose(texts[i], 10**6)
        assert pool.num_patterns() <= limit
        if rng.random() < 0.02:  # a request finishes, another starts
            texts[i], cursors[i] = [rng.randrange(9)], mod.PoolCursor(pool)
    assert pool.evictions > 0 and pool.max_patterns == limit


def test_v1_pool_never_exceeds_its_limit():
    rng = random.Random(0)
    pool = PLDPool(3, 2, True, True, 1, 10)
    cursor, text = PLDCursor(pool), [1]
    for _ in range(500):
        text.extend(rng.randrange(6) for _ in range(rng.randint(1, 4)))
        cursor.propose(text, 10**6)
        assert pool.num_patterns() <= 10
    assert pool.evictions > 0


def _probe(mod, pool, text):
    """The draft a fresh request with ``text`` gets (its own patterns are inserted first)."""
    return mod.PoolCursor(pool).propose(text, 100)[0]


@pytest.mark.parametrize("implementation", NAMES)
@pytest.mark.parametrize("used", [True, False])
def test_eviction_is_least_recently_used(implementation, used):
    """Limit 3, n = k = 1. Patterns 1, 2, 3 are created in that order; when pattern 1 then
    gives a draft (or, in the control, nothing uses it) and new patterns push two out, the
    survivor is 1 only if it was used: the oldest *unused* pattern goes first."""
    mod = pool_module(implementation)
    pool = mod.NGramPool(1, 1, True, True, 1, 3)
    cursor = mod.PoolCursor(pool)
    text = [1, 2, 3]
    cursor.propose(text, 100)  # patterns 1 -> (2), 2 -> (3); LRU: 1, 2
    text.append(1 if used else 4)
    draft = cursor.propose(text, 100)[0]  # pattern 3 created; LRU: 1, 2, 3
    assert draft == ([2] if used else [])  # used: pattern 1's hit makes it the most recent (2, 3, 1)
    text += [5, 6]  # creates a pattern (1 -> (5) is not new when used), evicting the LRU head
    cursor.propose(text, 100)
    assert pool.num_patterns() == 3
    # a new request ending in 1 (its own pattern 9 -> (1) evicts one more first)
    assert _probe(mod, pool, [9, 1]) == ([2] if used else [])


@pytest.mark.parametrize("seed", range(40))
def test_c_and_python_pools_draft_the_same_under_eviction(seed):
    native = require_native("pool")
    rng = random.Random(seed)
    k, n = rng.randint(1, 6), rng.randint(1, 4)
    keep_all, oldest = rng.random() < 0.5, rng.random() < 0.5
    cand, limit = rng.choice([1, 1, 3]), rng.choice([1, 2, 3, 5, 8, 20, 50])
    pools = [mod.NGramPool(k, n, keep_all, oldest, cand, limit) for mod in (python_pool, native)]
    mods = (python_pool, native)
    texts: list[list[int]] = [[] for _ in range(3)]
    cursors = [[mod.PoolCursor(p) for mod, p in zip(mods, pools)] for _ in texts]
    alphabet = rng.randint(2, 6)
    for step in range(200):
        i = rng.randrange(3)
        texts[i].extend(rng.randrange(alphabet) for _ in range(rng.randint(1, 4)))
        got = [c.propose(texts[i], 400) for c in cursors[i]]
        assert got[0] == got[1], (step, got)
        if cand > 1:
            got = [c.candidates(texts[i], 400, cand) for c in cursors[i]]
            assert got[0] == got[1], (step, got)
        assert pools[0].num_patterns() == pools[1].num_patterns() <= limit
        if rng.random() < 0.03:
            texts[i] = []
            cursors[i] = [mod.PoolCursor(p) for mod, p in zip(mods, pools)]
    assert pools[0].evictions == pools[1].evictions


def test_c_pool_frees_the_texts_of_finished_requests():
    """Finished requests' texts are compacted away: what the pool holds stays bounded by its
    patterns, not by every token it has seen (8 bytes each)."""
    native = require_native("pool")
    rng = random.Random(1)
    pool = native.NGramPool(5, 2, True, True, 1, 100)
    seen = 0
    for _ in range(200):
        text = [rng.randrange(50) for _ in range(20)]
        cursor = native.PoolCursor(pool)
        for _ in range(40):
            text.extend(rng.randrange(50) for _ in range(10))
            cursor.propose(text, 10**6)
        seen += len(text)
        del cursor
    assert seen * 8 > 500_000
    assert pool.nbytes() < 0.5 * seen * 8  # far below the tokens seen; the dead-text slack is about 0.5 MB


@pytest.mark.parametrize("implementation", NAMES)
def test_longest_mode_public_text_keeps_its_most_recent_tokens(implementation):
    require(implementation)
    limit = 120
    drafter = make_drafter(DraftConfig(mode="longest", public_text_max_tokens=limit), implementation=implementation)
    rng = random.Random(2)
    for number in range(30):
        req = drafter.new_request([rng.randrange(40) for _ in range(25)], 10**6)
        req.extend([rng.randrange(40) for _ in range(10)])
        req.finish()
        assert drafter.public_pool_stats()["tokens"] <= limit
    assert drafter.public_pool_stats()["evictions"] > 0
    recent = [7, 8, 9, 10, 11, 12]
    req = drafter.new_request([1, 2] + recent, 10**6)
    req.finish()  # the most recent text is still searched after the rebuilds
    assert drafter.new_request([30, 7, 8, 9], 10**6).propose()[:3] == [10, 11, 12]


def test_longest_mode_drafts_the_same_in_c_and_python_under_rebuilds():
    require("c")
    outs = []
    for implementation in NAMES:
        drafter = make_drafter(DraftConfig(mode="longest", public_text_max_tokens=300), implementation=implementation)
        rng, drafts = random.Random(0), []
        live = [drafter.new_request([rng.randrange(20) for _ in range(30)], 10**6) for _ in range(2)]
        for _ in range(80):
            i = rng.randrange(2)
            drafts.append(live[i].propose())
            live[i].extend([rng.randrange(20) for _ in range(3)])
            if rng.random() < 0.2:
                live[i].finish()
                live[i] = drafter.new_request([rng.randrange(20) for _ in range(30)], 10**6)
        outs.append(drafts)
    assert outs[0] == outs[1]


def test_limits_are_validated_and_refused_for_another_mode():
    with pytest.raises(UserError, match="positive integer"):
        make_drafter(DraftConfig(ngram_pool_max_patterns=0))
    with pytest.raises(UserError, match="pool mode only"):
        make_drafter(DraftConfig(mode="longest", ngram_pool_max_patterns=5))
    with pytest.raises(UserError, match="longest mode only"):
        make_drafter(DraftConfig(public_text_max_tokens=5))
    with pytest.raises(UserError, match="is_public_pool=False"):
        make_drafter(DraftConfig(mode="longest", is_public_pool=False, public_text_max_tokens=5))
    from promptlookup.defaults import DEFAULT_NGRAM_POOL_MAX_PATTERNS

    assert make_drafter(DraftConfig()).mode.public_pool.max_patterns == DEFAULT_NGRAM_POOL_MAX_PATTERNS
    for mod in (python_pool,):
        with pytest.raises(ValueError, match="max_patterns"):
            mod.NGramPool(2, 2, True, True, 1, 0)


def test_greedy_output_is_unchanged_by_a_tiny_limit(tiny_engine_dir):
    """Through the LLM API (the server's engine): a pool of 3 patterns, or a public text of
    20 tokens, evicts all the time, and greedy output still equals plain decoding's."""
    from promptlookup import LLM, NGramDecodingConfig, SamplingParams

    prompts = ["one two three four one two three four one two three", "a b a b a b a b a b",
               "one two three four one two", "hello world hello world hello"]
    params = SamplingParams(max_tokens=12)
    with LLM(str(tiny_engine_dir)) as plain:
        want = [o.outputs[0].token_ids for o in plain.generate(prompts * 2, params)]
    for spec in (NGramDecodingConfig(max_draft_len=4, ngram_pool_max_patterns=3),
                 NGramDecodingConfig(max_draft_len=4, mode="longest", public_text_max_tokens=20)):
        with LLM(str(tiny_engine_dir), speculative_config=spec) as llm:
            got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            got += [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            stats = llm.drafter.public_pool_stats()
        assert got == want
        assert stats["evictions"] > 0
        assert stats["patterns"] <= 3 and stats["tokens"] <= 20
