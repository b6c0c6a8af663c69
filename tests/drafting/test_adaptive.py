"""Adaptive drafting: never more than k, shrinks after rejections, grows with long matches."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting.adaptive import AdaptiveLength


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 16),
    events=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 8), st.integers(0, 16), st.integers(0, 16))),
)
def test_length_is_bounded(k, events):
    policy = AdaptiveLength(k)
    for match_len, ref, drafted, accepted in events:
        n = policy.length(match_len, ref)
        assert 0 <= n <= k
        assert (n == 0) == (match_len == 0)
        policy.record(drafted, min(accepted, drafted))
        assert 1 <= policy.cap <= k


def test_rejections_shrink_and_acceptance_regrows():
    policy = AdaptiveLength(10)
    assert policy.length(50, 10) == 10
    policy.record(10, 2)  # rejected at the third token
    after_one = policy.length(50, 10)
    assert after_one < 10
    policy.record(after_one, 0)
    after_two = policy.length(50, 10)
    assert after_two < after_one
    for _ in range(10):
        policy.record(1, 0)
    assert policy.length(50, 10) == 1
    policy.record(1, 1)
    policy.record(3, 3)
    assert policy.length(50, 10) > 1
    for _ in range(10):
        policy.record(policy.length(50, 10), policy.length(50, 10))
    assert policy.length(50, 10) == 10


def test_longer_matches_earn_longer_drafts():
    policy = AdaptiveLength(8)
    lengths = [policy.length(m, 8) for m in range(0, 12)]
    assert lengths == sorted(lengths)
    assert lengths[1] == 1 and lengths[8] == 8 and lengths[11] == 8
    # pool mode: the largest n-gram earns a full draft, a 1-gram hit a fraction
    assert policy.length(2, 2) == 8 and policy.length(1, 2) == 4


def test_adaptive_drafter_cuts_weak_matches():
    # tail "... 9 1": the longest earlier match is "1" (one token), followed by 2 3 4 5
    prompt = [1, 2, 3, 4, 5, 6, 9, 1]
    plain = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest")).new_request(prompt, 100)
    adaptive = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest", adaptive=True)).new_request(prompt, 100)
    assert plain.propose() == [2, 3, 4, 5]
    assert adaptive.propose() == [2]
    # a 4-token match drafts the full k
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]
    adaptive = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest", adaptive=True)).new_request(prompt, 100)
    assert adaptive.propose() == [5, 6, 7, 8]
    adaptive.record(4, 0)
    assert len(adaptive.propose()) < 4


def test_adaptive_pool_mode_keeps_tensorrt_pool_state():
    # adaptive only cuts what the pool returns; the pool itself is updated as without it
    cfg = DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    first = make_drafter(cfg).new_request(prompt[:-1], 100)
    first.extend(prompt[-1:])  # V2 rules draft from the first generated token on
    full = first.propose()
    cut = make_drafter(DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2, adaptive=True))
    req = cut.new_request(prompt[:-1], 100)
    req.extend(prompt[-1:])
    assert req.propose() == full  # 2-gram hit = largest n: full draft
    req.record(6, 0)
    shorter = req.propose()
    assert shorter == full[: len(shorter)] and len(shorter) < len(full)
