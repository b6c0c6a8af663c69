"""The pool mode with V2 rules reproduces TensorRT-LLM's NGramPoolManager draft for draft.

Both implementations (``pool.py`` and its C twin) are held to the specification
``promptlookup.drafting.pool_spec.NGramPoolManagerSpec``.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting import pool as python_pool
from promptlookup.drafting.pool import NGramPool
from promptlookup.drafting.pool_spec import NGramPoolManagerSpec

from .implementations import require, require_native
from .reference import TrtPoolReference
from .scenarios import scenarios


def first_draft(drafter, text, max_seq_len=100):
    """The request's first draft when its text is ``text``: the last token counts as the first
    generated one (V2 drafts only from the first generated token on)."""
    req = drafter.new_request(text[:-1], max_seq_len)
    req.extend(text[-1:])
    return req.propose()


def _replay(scenario, implementation: str = "python", max_candidates: int = 1, on_step=None):
    """Replay ``scenario``; ``on_step(request, reference, text, request_id, limit, draft)``
    runs after each checked proposal (test_candidates.py checks candidates() there)."""
    k, n, keep_all, oldest, public, prompts, limits, actions = scenario
    ref = TrtPoolReference(k, n, keep_all, oldest, public)  # the spec, plus candidates()
    drafter = make_drafter(
        DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, mode="pool",
                    is_keep_all=keep_all, is_use_oldest=oldest, is_public_pool=public,
                    max_candidates=max_candidates),
        implementation=implementation,
    )
    texts = [list(p) for p in prompts]
    prompt_lens = [len(p) for p in prompts]
    reqs = [drafter.new_request(p, m) for p, m in zip(prompts, limits)]
    ids = list(range(len(prompts)))
    next_id = len(prompts)
    for i, chunk, restart in actions:
        if len(texts[i]) == prompt_lens[i]:  # still in the context phase: TensorRT-LLM V2 does not call the pool
            expected = []
        else:
            expected = ref.get_draft_tokens(list(texts[i]), ids[i], limits[i])
        got = reqs[i].propose()
        assert got == expected, (texts[i], ids[i])
        assert len(got) <= k and len(texts[i]) + len(got) + 1 <= limits[i] or not got
        if on_step is not None:
            on_step(reqs[i], ref, texts[i], ids[i], limits[i], got)
        reqs[i].record(len(got), 0)
        reqs[i].extend(chunk)
        texts[i].extend(chunk)
        if restart == 0:  # the request ends; a new one takes its slot
            reqs[i].finish()
            ref.finish(ids[i])
            ids[i] = next_id
            next_id += 1
            texts[i] = list(chunk)
            prompt_lens[i] = len(chunk)
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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_c_pool_matches_tensorrt_llm_reference(scenario):
    require("c")
    _replay(scenario, "c")


@pytest.mark.parametrize("alphabet", [2, 3, 40])
def test_long_random_stream_with_growth_in_chunks(implementation, alphabet):
    import random

    rnd = random.Random(7 + alphabet)
    pool_mod = python_pool if implementation == "python" else require_native("pool")
    for keep_all in (True, False):
        for oldest in (True, False):
            ref = NGramPoolManagerSpec(5, 3, keep_all, oldest, True)
            cur = pool_mod.PoolCursor(pool_mod.NGramPool(5, 3, keep_all, oldest))
            text = [rnd.randrange(alphabet) for _ in range(50)]
            for _ in range(150):
                assert cur.propose(text, 10_000)[0] == ref.get_draft_tokens(list(text), 0, 10_000)
                text.extend(rnd.randrange(alphabet) for _ in range(rnd.choice([1, 1, 2, 3, 6])))


def test_c_pool_equals_python_pool_on_long_texts():
    """Thousands of steps over texts long enough to grow every table several times."""
    import random

    native = require_native("pool")
    rnd = random.Random(5)
    for k, n, keep_all, oldest in [(10, 2, True, True), (10, 2, True, False), (4, 4, False, True), (7, 1, False, False)]:
        for alphabet in (3, 30, 3000):
            py_cur = python_pool.PoolCursor(python_pool.NGramPool(k, n, keep_all, oldest))
            c_cur = native.PoolCursor(native.NGramPool(k, n, keep_all, oldest))
            text = [rnd.randrange(alphabet) for _ in range(300)]
            while len(text) < 4000:
                assert c_cur.propose(text, 10**6) == py_cur.propose(text, 10**6)
                if rnd.random() < 0.3 and len(text) > 50:  # copy a span, as generated text does
                    start = rnd.randrange(len(text) - 40)
                    text.extend(text[start:start + rnd.randint(1, 12)])
                else:
                    text.extend(rnd.randrange(alphabet) for _ in range(rnd.randint(1, 4)))


def test_c_pool_rejects_bad_input():
    native = require_native("pool")
    with pytest.raises(ValueError, match="k and n must be >= 1"):
        native.NGramPool(0, 2, True, True)
    with pytest.raises(TypeError):
        native.PoolCursor("not a pool")
    cur = native.PoolCursor(native.NGramPool(3, 2, True, True))
    with pytest.raises(TypeError):
        cur.propose([1, "x", 3], 100)
    with pytest.raises(OverflowError):
        cur.propose([1, 2**70], 100)
    assert cur.propose([1, 2, 1], 100) == ([2, 1], 1)  # the failed calls left no state behind
    with pytest.raises(ValueError, match="shrank"):
        cur.propose([1], 100)
    assert cur.pool.k == 3 and cur.prev_len == 3


def test_first_hit_uses_the_largest_ngram(implementation):
    # pattern (1, 2) occurred at 0 followed by 3 1 2; the 1-gram (2,) would give 3 as well,
    # but (9, 2) -> 7 checks that the 2-gram is tried first
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2), implementation=implementation)
    assert first_draft(drafter, [5, 2, 8, 9, 2, 7, 4, 9, 2]) == [7, 4, 9]


def test_oldest_versus_newest_match(implementation):
    prompt = [1, 5, 6, 1, 7, 8, 1]
    oldest = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1), implementation=implementation)
    newest = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_use_oldest=False), implementation=implementation)
    assert first_draft(oldest, prompt) == [5, 6]
    assert first_draft(newest, prompt) == [7, 8]


def test_skip_while_removing_quirk_is_reproduced(implementation):
    # TensorRT-LLM removes shorter matches while iterating the same list, so the element
    # right after each removed one survives. k=2, n=1, keep all, newest match:
    # after "1 0 1 1 0 1 1" the matches of (1,) are [(0,1), (1,0), (0,), (1,)]. At the next
    # call, inserting (1,1) removes (0,) and skips (1,), so the following insertion of (1,)
    # finds it present and does nothing: the newest match stays (1,1). Without the skip,
    # (1,) would be removed and appended again, and the draft would be [1].
    texts = [[1], [1, 0], [1, 0, 1, 1, 0], [1, 0, 1, 1, 0, 1, 1], [1, 0, 1, 1, 0, 1, 1, 1]]
    expected = [[], [], [1, 1], [1], [1, 1]]
    ref = NGramPoolManagerSpec(2, 1, True, False, False)
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_use_oldest=False), implementation=implementation).new_request(texts[0], 100)
    got = []
    for prev, text in zip([[]] + texts, texts):
        req.extend(text[len(prev):] if prev else [])
        assert ref.get_draft_tokens(list(text), 0, 100) == (draft := req.propose())
        got.append(draft)
    assert got == expected


def test_max_seq_len_caps_the_draft_and_stops_updates(implementation):
    cfg = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=1)
    text = [1, 2, 3, 4, 5, 6, 1]
    assert first_draft(make_drafter(cfg, implementation=implementation), text, 100) == [2, 3, 4, 5, 6]
    assert first_draft(make_drafter(cfg, implementation=implementation), text, len(text) + 3) == [2, 3]
    assert first_draft(make_drafter(cfg, implementation=implementation), text, len(text) + 1) == []
    assert first_draft(make_drafter(cfg, implementation=implementation), text, len(text)) == []


def test_private_pool_is_per_request_and_public_pool_is_shared(implementation):
    private = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_public_pool=False), implementation=implementation)
    public = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_public_pool=True), implementation=implementation)
    for drafter, expected in ((private, []), (public, [8, 9])):
        first = drafter.new_request([7, 8, 9], 100)
        first.extend([3])
        first.propose()  # indexes the first request's text
        assert first_draft(drafter, [4, 7]) == expected


def test_first_draft_waits_for_the_first_generated_token(implementation):
    """TensorRT-LLM V2 drafts only for requests in the generation phase, so its first call
    sees the prompt plus one generated token. k=2, n=1, keep all, newest match, prompt
    0 1 0 1, then 0: TensorRT-LLM drafts [1, 0]. Indexing the prompt alone first would leave
    the truncated match (1,) newest and draft [1]."""
    cfg = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, is_use_oldest=False)
    req = make_drafter(cfg, implementation=implementation).new_request([0, 1, 0, 1], 100)
    assert req.propose() == []  # context phase: the pool is not called
    req.extend([0])
    assert req.propose() == [1, 0]
    spec = NGramPoolManagerSpec(2, 1, True, False, True)
    assert spec.get_draft_tokens([0, 1, 0, 1, 0], 0, 100) == [1, 0]
    early = NGramPoolManagerSpec(2, 1, True, False, True)
    early.get_draft_tokens([0, 1, 0, 1], 0, 100)
    assert early.get_draft_tokens([0, 1, 0, 1, 0], 0, 100) == [1]  # what drafting from the prompt gave


def test_pool_rules_auto_follow_the_workflow():
    from promptlookup.drafting.pool_v1 import PLDPool

    cfg = DraftConfig()
    assert make_drafter(cfg).pool_rules == "v2"
    assert make_drafter(cfg, workflow="v1").pool_rules == "v1"
    assert make_drafter(cfg, workflow="v1").classes.NGramPool is PLDPool
    assert make_drafter(replace_rules(cfg, "v2"), workflow="v1").pool_rules == "v2"
    assert make_drafter(replace_rules(cfg, "v1")).pool_rules == "v1"


def replace_rules(cfg, rules):
    from dataclasses import replace

    return replace(cfg, pool_rules=rules)
