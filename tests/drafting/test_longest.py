"""The longest-match mode drafts after the most recent occurrence of the longest earlier match."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting import suffix_automaton as python_impl

from .implementations import NAMES, require_native
from .reference import longest_earlier_match, longest_match_in

@pytest.fixture(scope="module", params=NAMES)
def impl(request):
    """Each implementation of SuffixAutomaton/Matcher: the pure-Python one and the C one."""
    return python_impl if request.param == "python" else require_native("suffix_automaton")


@pytest.fixture(scope="module")
def native():
    return require_native("suffix_automaton")


def _check_stream(impl, tokens: list[int], max_len: int) -> None:
    sam = impl.SuffixAutomaton(max_len)
    for i, t in enumerate(tokens):
        sam.append(t)
        length, end = longest_earlier_match(tokens[: i + 1], max_len)
        assert (sam.match_len, sam.match_end) == (length, end), tokens[: i + 1]
        assert sam.continuation(4) == (tokens[end + 1:min(end + 5, i + 1)] if length else [])


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.integers(1, 4).flatmap(lambda a: st.lists(st.integers(0, a - 1), max_size=60)),
    max_len=st.integers(1, 10),
)
def test_random_streams_match_brute_force(impl, tokens, max_len):
    _check_stream(impl, tokens, max_len)


def test_adversarial_streams(impl):
    for max_len in (1, 3, 8, 64):
        _check_stream(impl, [5] * 90, max_len)  # a run of one token
        _check_stream(impl, ([1, 2, 3] * 40)[:100], max_len)  # periodic
        _check_stream(impl, ([0, 0, 1] * 30 + [0] * 10 + [0, 0, 1] * 5), max_len)
        fib = [0, 1]
        while len(fib) < 90:  # Fibonacci word: many repeated factors of every length
            fib = fib + fib[: len(fib) // 2 + 1]
        _check_stream(impl, fib[:90], max_len)


def test_matcher_against_a_finished_text(impl):
    rnd = random.Random(3)
    for trial in range(200):
        alphabet = rnd.randint(1, 4)
        corpus = [rnd.randrange(alphabet) for _ in range(rnd.randint(1, 40))]
        max_len = rnd.randint(1, 8)
        sam = impl.SuffixAutomaton(max_len)
        sam.extend(corpus)
        matcher = impl.Matcher(sam)
        query: list[int] = []
        for _ in range(30):
            chunk = [rnd.randrange(alphabet) for _ in range(rnd.randint(1, 3))]
            matcher.feed(chunk)
            query += chunk
            length, end = longest_match_in(corpus, query, max_len)
            got_len, cont = matcher.continuation(5)
            assert got_len == length
            assert cont == (corpus[end + 1:end + 6] if length else [])


def test_matcher_survives_the_automaton_growing(impl):
    # states split when text is appended; the matcher re-points itself
    rnd = random.Random(11)
    for _ in range(100):
        sam = impl.SuffixAutomaton(6)
        corpus = [rnd.randrange(3) for _ in range(20)]
        sam.extend(corpus)
        matcher = impl.Matcher(sam)
        query = [rnd.randrange(3) for _ in range(8)]
        matcher.feed(query)
        more = [rnd.randrange(3) for _ in range(20)]
        sam.extend(more)
        corpus += more
        length, cont = matcher.continuation(3)
        # the match found when the query arrived still occurs, and the continuation is
        # what follows its most recent occurrence in the grown text
        ref_len, end = longest_match_in(corpus, query, 6)
        assert length <= ref_len
        if length:
            suffix = query[len(query) - length:]
            ends = [e for e in range(length - 1, len(corpus)) if corpus[e - length + 1:e + 1] == suffix]
            assert cont == corpus[ends[-1] + 1:ends[-1] + 4]


def _state(sam) -> tuple:
    return sam.match_len, sam.match_end, sam.continuation(10), len(sam)


@pytest.mark.parametrize("alphabet", [2, 50])
@pytest.mark.parametrize("max_len", [1, 8, 64])
def test_c_matches_python_on_long_streams(native, alphabet, max_len):
    rnd = random.Random(alphabet * 1000 + max_len)
    tokens = [rnd.randrange(alphabet) for _ in range(5000)]
    fast, slow = native.SuffixAutomaton(max_len), python_impl.SuffixAutomaton(max_len)
    for i, t in enumerate(tokens):
        fast.append(t)
        slow.append(t)
        assert _state(fast) == _state(slow), i
    assert fast.num_states == slow.num_states
    assert fast.tokens == slow.tokens == tokens
    for k in (-10**30, -6000, -3, 0, 1, 10**30):  # continuation(k) slices like Python
        assert fast.continuation(k) == slow.continuation(k), k


@pytest.mark.parametrize("alphabet", [2, 50])
@pytest.mark.parametrize("max_len", [1, 8, 64])
def test_c_matcher_matches_python_while_the_automaton_grows(native, alphabet, max_len):
    rnd = random.Random(alphabet * 7 + max_len)
    initial = [rnd.randrange(alphabet) for _ in range(50)]
    sams = [module.SuffixAutomaton(max_len) for module in (native, python_impl)]
    for sam in sams:
        sam.extend(initial)
    fast, slow = native.Matcher(sams[0]), python_impl.Matcher(sams[1])
    separators = 0
    for step in range(600):
        chunk = [rnd.randrange(alphabet) for _ in range(rnd.randint(0, 6))]
        fast.feed(chunk)
        slow.feed(chunk)
        assert fast.continuation(10) == slow.continuation(10), step
        assert fast.continuation(-2) == slow.continuation(-2), step
        more = [rnd.randrange(alphabet) for _ in range(rnd.randint(0, 12))]
        if rnd.random() < 0.2:  # another text finished: its tokens, then a separator
            separators += 1
            more.append(-separators)
        for sam in sams:
            sam.extend(more)
    assert sams[0].num_states == sams[1].num_states

def test_c_errors(native):
    for bad in (0, -1):
        with pytest.raises(ValueError):
            native.SuffixAutomaton(bad)
    with pytest.raises(TypeError):
        native.SuffixAutomaton("8")
    sam = native.SuffixAutomaton(4)
    for bad in ("a", 1.5, None, [1]):
        with pytest.raises(TypeError):
            sam.append(bad)
    for big in (2**63, -(2**63) - 1):
        with pytest.raises(OverflowError):
            sam.append(big)
    sam.append(2**63 - 1)
    sam.append(-(2**63))
    with pytest.raises(TypeError):
        sam.extend(5)
    with pytest.raises(TypeError):
        sam.extend([1, 2, "x", 3])  # like the Python loop: the tokens before the bad one are in
    assert sam.tokens == [2**63 - 1, -(2**63), 1, 2]
    with pytest.raises(TypeError):
        sam.continuation("3")
    with pytest.raises(AttributeError):
        sam.match_len = 3
    sam.extend(iter([1, 2]))
    assert (len(sam), sam.match_len, sam.continuation(5)) == (6, 2, [1, 2])
    for bad in (object(), None, python_impl.SuffixAutomaton(4), [1, 2]):
        with pytest.raises(TypeError):
            native.Matcher(bad)
    matcher = native.Matcher(sam)
    assert matcher.sam is sam
    matcher.feed([1])
    with pytest.raises(TypeError):
        matcher.feed([2, "x"])  # nothing of a bad chunk is fed
    assert matcher.continuation(5) == (1, [2])
    with pytest.raises(TypeError):
        matcher.feed(7)
    del sam
    matcher.feed((2,))  # the matcher keeps its automaton alive
    assert matcher.continuation(5) == (2, [])


def test_drafter_longest_mode_prefers_long_matches(implementation):
    # the 1-gram pool would follow the most recent "a" (-> x); the longest match "q a"
    # occurred earlier and was followed by "b c d"
    q, a, b, c, d, x = 1, 2, 3, 4, 5, 6
    prompt = [q, a, b, c, d, 9, a, x, 9, q, a]
    longest = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, mode="longest"), implementation=implementation).new_request(prompt, 100)
    assert longest.propose() == [b, c, d]
    assert longest.last_match_len == 2
    pool = make_drafter(
        DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=1, is_use_oldest=False)
    , implementation=implementation).new_request(prompt[:-1], 100)
    pool.extend(prompt[-1:])  # V2 pool rules draft from the first generated token on
    assert pool.propose() == [x, 9, q]


def test_longest_mode_respects_k_and_max_seq_len(implementation):
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest"), implementation=implementation).new_request(prompt, 100)
    assert req.propose() == [3, 4, 5, 6]
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest"), implementation=implementation).new_request(prompt, len(prompt) + 3)
    assert req.propose() == [3, 4]
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=4, mode="longest"), implementation=implementation).new_request(prompt, len(prompt) + 1)
    assert req.propose() == []


def test_longest_mode_public_pool_uses_finished_requests(implementation):
    cfg = DraftConfig(prompt_lookup_num_tokens=3, mode="longest", is_public_pool=True)
    drafter = make_drafter(cfg, implementation=implementation)
    first = drafter.new_request([10, 11, 12, 13, 14], 100)
    first.extend([15])
    first.finish()
    second = drafter.new_request([7, 11, 12], 100)
    assert second.propose() == [13, 14, 15]
    assert second.last_source == "public"
    second.extend([13, 14, 15])
    assert second.propose() == []  # the separator after the first request ends its text
    private = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, mode="longest", is_public_pool=False), implementation=implementation)
    private.new_request([10, 11, 12, 13], 100).finish()
    assert private.new_request([7, 11, 12], 100).propose() == []


def test_longest_mode_public_pool_sees_requests_that_finish_while_it_runs(implementation):
    cfg = DraftConfig(prompt_lookup_num_tokens=3, mode="longest", is_public_pool=True, max_match_len=4)
    drafter = make_drafter(cfg, implementation=implementation)
    running = drafter.new_request([7, 11, 12], 100)
    assert running.propose() == []  # nothing finished yet
    other = drafter.new_request([10, 11, 12, 13, 14], 100)
    other.extend([15])
    other.finish()  # finishes while `running` is in flight
    assert running.propose() == [13, 14, 15]
    assert running.last_source == "public"
    running.extend([13])
    late = drafter.new_request([20, 11, 12, 13, 30, 31], 100)
    late.finish()
    # the newest occurrence of the longest match (11 12 13, capped at 4 tokens) now wins
    assert running.propose() == [30, 31]
