"""The pool mode reproduces TensorRT-LLM's NGramPoolManager draft for draft."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting.pool import NGramPool, PoolCursor

from .reference import TrtPoolReference


@st.composite
def scenarios(draw):
    k = draw(st.integers(1, 6))
    n = draw(st.integers(1, 4))
    keep_all, oldest, public = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    alphabet = draw(st.integers(1, 4))
    token = st.integers(0, alphabet - 1)
    nreq = draw(st.integers(1, 3))
    prompts = draw(st.lists(st.lists(token, max_size=12), min_size=nreq, max_size=nreq))
    limits = draw(st.lists(st.integers(2, 60), min_size=nreq, max_size=nreq))
    # (request, chunk appended after proposing, restart the request afterwards?)
    actions = draw(
        st.lists(st.tuples(st.integers(0, nreq - 1), st.lists(token, max_size=8), st.integers(0, 12)), max_size=40)
    )
    return k, n, keep_all, oldest, public, prompts, limits, actions


def _replay(scenario):
    k, n, keep_all, oldest, public, prompts, limits, actions = scenario
    ref = TrtPoolReference(k, n, keep_all, oldest, public)
    drafter = make_drafter(
        DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, mode="pool",
                    is_keep_all=keep_all, is_use_oldest=oldest, is_public_pool=public)
    )
    texts = [list(p) for p in prompts]
    reqs = [drafter.new_request(p, m) for p, m in zip(prompts, limits)]
    ids = list(range(len(prompts)))
    next_id = len(prompts)
    for i, chunk, restart in actions:
        expected = ref.get_draft_tokens(list(texts[i]), ids[i], limits[i])
        got = reqs[i].propose()
        assert got == expected, (texts[i], ids[i])
        assert len(got) <= k and len(texts[i]) + len(got) + 1 <= limits[i] or not got
        reqs[i].record(len(got), 0)
        reqs[i].extend(chunk)
        texts[i].extend(chunk)
        if restart == 0:  # the request ends; a new one takes its slot
            reqs[i].finish()
            ref.finish(ids[i])
            ids[i] = next_id
            next_id += 1
            texts[i] = list(chunk)
            reqs[i] = drafter.new_request(chunk, limits[i])


@pytest.mark.parametrize("pending_limit", [NGramPool.PENDING_LIMIT, 0, 2])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_pool_matches_tensorrt_llm_reference(scenario, pending_limit):
    saved = NGramPool.PENDING_LIMIT
    NGramPool.PENDING_LIMIT = pending_limit  # also exercise eager application of deferred matches
    try:
        _replay(scenario)
    finally:
        NGramPool.PENDING_LIMIT = saved


def test_long_random_stream_with_growth_in_chunks():
    import random

    rnd = random.Random(7)
    for keep_all in (True, False):
        for oldest in (True, False):
            ref = TrtPoolReference(5, 3, keep_all, oldest, True)
            cur = PoolCursor(NGramPool(5, 3, keep_all, oldest))
            text = [rnd.randrange(3) for _ in range(50)]
            for _ in range(150):
                assert cur.propose(text, 10_000)[0] == ref.get_draft_tokens(list(text), 0, 10_000)
                text.extend(rnd.randrange(3) for _ in range(rnd.choice([1, 1, 2, 3, 6])))


def test_first_hit_uses_the_largest_ngram():
    # pattern (1, 2) occurred at 0 followed by 3 1 2; the 1-gram (2,) would give 3 as well,
    # but (9, 2) -> 7 checks that the 2-gram is tried first
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2)).new_request(
        [5, 2, 8, 9, 2, 7, 4, 9, 2], 100
    )
    assert req.propose() == [7, 4, 9]


def test_oldest_versus_newest_match():
    prompt = [1, 5, 6, 1, 7, 8, 1]
    oldest = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1))
    newest = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_use_oldest=False))
    assert oldest.new_request(prompt, 100).propose() == [5, 6]
    assert newest.new_request(prompt, 100).propose() == [7, 8]


def test_skip_while_removing_quirk_is_reproduced():
    # TensorRT-LLM removes shorter matches while iterating the same list, so the element
    # right after each removed one survives. k=2, n=1, keep all, newest match:
    # after "1 0 1 1 0 1 1" the matches of (1,) are [(0,1), (1,0), (0,), (1,)]. At the next
    # call, inserting (1,1) removes (0,) and skips (1,), so the following insertion of (1,)
    # finds it present and does nothing: the newest match stays (1,1). Without the skip,
    # (1,) would be removed and appended again, and the draft would be [1].
    texts = [[1], [1, 0], [1, 0, 1, 1, 0], [1, 0, 1, 1, 0, 1, 1], [1, 0, 1, 1, 0, 1, 1, 1]]
    expected = [[], [], [1, 1], [1], [1, 1]]
    ref = TrtPoolReference(2, 1, True, False, False)
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_use_oldest=False)).new_request(texts[0], 100)
    got = []
    for prev, text in zip([[]] + texts, texts):
        req.extend(text[len(prev):] if prev else [])
        assert ref.get_draft_tokens(list(text), 0, 100) == (draft := req.propose())
        got.append(draft)
    assert got == expected


def test_max_seq_len_caps_the_draft_and_stops_updates():
    cfg = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=1)
    text = [1, 2, 3, 4, 5, 6, 1]
    assert make_drafter(cfg).new_request(text, 100).propose() == [2, 3, 4, 5, 6]
    assert make_drafter(cfg).new_request(text, len(text) + 3).propose() == [2, 3]
    assert make_drafter(cfg).new_request(text, len(text) + 1).propose() == []
    assert make_drafter(cfg).new_request(text, len(text)).propose() == []


def test_private_pool_is_per_request_and_public_pool_is_shared():
    private = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_public_pool=False))
    public = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_public_pool=True))
    for drafter, expected in ((private, []), (public, [8, 9])):
        first = drafter.new_request([7, 8, 9, 3], 100)
        first.propose()  # indexes the first request's text
        second = drafter.new_request([4, 7], 100)
        assert second.propose() == expected
