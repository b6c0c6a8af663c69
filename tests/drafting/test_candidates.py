"""RequestDrafter.candidates(): several distinct drafts per step, the first being propose()'s.

Pool mode is checked against TensorRT-LLM's pool rules (the reference keeps every match of
every pattern), longest mode against a brute-force scan of the text for earlier
occurrences; both implementations (pure Python and C) must agree with them exactly.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.errors import UserError

from promptlookup.drafting import suffix_automaton as python_sam

from .implementations import NAMES, require, require_native
from .test_pool import _replay, scenarios
from .reference import TrtPoolReference, corpus_occurrence_candidates, covered, earlier_occurrence_candidates


def started(drafter, prompt, limit):
    """A request in the generation phase: TensorRT-LLM V2 drafts only after the first
    generated token, so the prompt's last token arrives through extend()."""
    prompt = list(prompt)
    req = drafter.new_request(prompt[:-1], limit)
    if prompt:
        req.extend(prompt[-1:])
    return req


def _expected(draft: list[int], found: list[list[int]], max_candidates: int) -> list[list[int]]:
    out = [draft] if draft else []
    for candidate in found if draft else []:
        if len(out) < max_candidates and not covered(candidate, out):
            out.append(candidate)
    return out


def _check_invariants(cands: list[list[int]], draft: list[int], text_len: int, k: int, max_seq_len: int, g: int):
    assert len(cands) <= g
    assert (cands[0] == draft) if draft else cands == []
    for i, c in enumerate(cands):
        assert c and len(c) <= k and text_len + len(c) + 1 <= max_seq_len
        assert not covered(c, cands[:i])


@st.composite
def pool_scenarios(draw):
    """test_pool.py's scenarios, plus G and the sizes asked of candidates() at each step."""
    g = draw(st.integers(1, 5))
    return draw(scenarios()), g, draw(st.lists(st.integers(1, g), min_size=1, max_size=3))


def _replay_pool(scenario, implementation: str) -> None:
    base, g, ask = scenario
    k = base[0]

    def check(req, ref, text, request_id, limit, draft):
        for want in ask:
            cands = req.candidates(want)
            found = ref.candidates(list(text), request_id, limit, g, want)
            assert cands == _expected(draft, found, want), (text, want)
            _check_invariants(cands, draft, len(text), k, limit, want)

    _replay(base, implementation, g, check)  # also: candidates() calls never change a later draft


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=pool_scenarios())
def test_pool_candidates_match_tensorrt_llm_reference(scenario):
    _replay_pool(scenario, "python")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=pool_scenarios())
def test_c_pool_candidates_match_tensorrt_llm_reference(scenario):
    require("c")
    _replay_pool(scenario, "c")


def _run_side_by_side(rnd: random.Random, py, c, alphabet: int, until: int) -> None:
    """Grow two requests' texts alike (random tokens, or a copied span as generated text
    does) until ``until`` tokens, checking propose() and candidates(4) agree at each step."""
    while len(py.tokens) < until:
        assert c.propose() == py.propose()
        assert c.candidates(4) == py.candidates(4)
        if rnd.random() < 0.3:
            start = rnd.randrange(len(py.tokens) - 40)
            new = py.tokens[start:start + rnd.randint(1, 12)]
        else:
            new = [rnd.randrange(alphabet) for _ in range(rnd.randint(1, 4))]
        py.extend(new)
        c.extend(new)


@pytest.mark.parametrize("keep_all,oldest", [(True, True), (True, False), (False, True), (False, False)])
def test_pool_candidates_c_equals_python_on_long_texts(keep_all, oldest):
    require("c")
    rnd = random.Random(11)
    for alphabet in (3, 30, 3000):
        cfg = DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=3, is_keep_all=keep_all,
                          is_use_oldest=oldest, max_candidates=4)
        py = make_drafter(cfg, implementation="python").new_request([], 10**6)
        c = make_drafter(cfg, implementation="c").new_request([], 10**6)
        text = [rnd.randrange(alphabet) for _ in range(200)]
        py.extend(text)
        c.extend(text)
        _run_side_by_side(rnd, py, c, alphabet, 3000)


def test_pool_candidates_example(implementation):
    # (1,) occurred three times, followed by 5 6 / 7 8 / 5 9; the 2-gram (4, 1) once
    prompt = [1, 5, 6, 1, 7, 8, 1, 5, 9, 4, 1]
    for oldest, first in ((True, [5, 6]), (False, [5, 9])):
        cfg = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=2, is_use_oldest=oldest, max_candidates=4)
        req = started(make_drafter(cfg, implementation=implementation), prompt, 100)
        assert req.propose() == first
        got = req.candidates(4)
        assert got == ([[5, 6], [7, 8], [5, 9]] if oldest else [[5, 9], [7, 8], [5, 6]])
        assert req.candidates(1) == [first] and req.candidates(2) == got[:2]


def test_g1_is_todays_chain_and_bad_sizes_are_refused(implementation):
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=3), implementation=implementation)
    req = started(drafter, [1, 2, 3, 1, 2], 100)
    assert req.propose() == [3, 1, 2]
    assert req.candidates(1) == [[3, 1, 2]]
    with pytest.raises(ValueError, match="max_candidates"):
        req.candidates(2)
    with pytest.raises(ValueError, match="max_candidates"):
        req.candidates(0)


# ---------------------------------------------------------------- longest mode


@pytest.fixture(scope="module", params=NAMES)
def sam_impl(request):
    """Each implementation of SuffixAutomaton/Matcher: the pure-Python one and the C one."""
    return python_sam if request.param == "python" else require_native("suffix_automaton")


def _check_sam_stream(impl, tokens: list[int], max_len: int, budget: int, g: int, scan: int) -> None:
    sam = impl.SuffixAutomaton(max_len, True)
    for i, t in enumerate(tokens):
        sam.append(t)
        got = sam.candidates(budget, g, scan)
        text = tokens[: i + 1]
        assert got == earlier_occurrence_candidates(text, max_len, budget, g, scan), (text, max_len, budget, g, scan)
        if got:  # the first is the single draft's
            assert got[0] == (sam.match_len, sam.continuation(budget))
        else:
            assert sam.match_len == 0 or scan == 0 or g == 0


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.integers(1, 4).flatmap(lambda a: st.lists(st.integers(0, a - 1), max_size=50)),
    max_len=st.integers(1, 8),
    budget=st.integers(1, 5),
    g=st.integers(1, 5),
    scan=st.integers(1, 20),
)
def test_longest_candidates_match_brute_force(sam_impl, tokens, max_len, budget, g, scan):
    _check_sam_stream(sam_impl, tokens, max_len, budget, g, scan)


def test_longest_candidates_adversarial_streams(sam_impl):
    fib = [0, 1]
    while len(fib) < 80:
        fib = fib + fib[: len(fib) // 2 + 1]
    for max_len in (1, 3, 64):
        for stream in ([5] * 60, ([1, 2, 3] * 30)[:70], [0, 0, 1] * 20 + [0] * 8, fib[:80]):
            _check_sam_stream(sam_impl, stream, max_len, 4, 4, 32)


def test_matcher_candidates_match_brute_force(sam_impl):
    rnd = random.Random(5)
    for trial in range(150):
        alphabet = rnd.randint(1, 4)
        max_len = rnd.choice([1, 2, 4, 64])
        shared = sam_impl.SuffixAutomaton(max_len, True)
        corpus: list[int] = []
        for sep in range(1, rnd.randint(1, 3) + 1):  # finished texts, each followed by a separator
            text = [rnd.randrange(alphabet) for _ in range(rnd.randint(0, 25))]
            shared.extend(text + [-sep])
            corpus += text + [-sep]
        matcher = sam_impl.Matcher(shared)
        query: list[int] = []
        for _ in range(rnd.randint(1, 30)):
            chunk = [rnd.randrange(alphabet) for _ in range(rnd.randint(1, 3))]
            matcher.feed(chunk)
            query += chunk
            budget, g, scan = rnd.randint(1, 5), rnd.randint(1, 5), rnd.randint(1, 20)
            got = matcher.candidates(budget, g, scan)
            assert got == corpus_occurrence_candidates(corpus, query, matcher.matched, budget, g, scan)
            length, first = matcher.continuation(budget)
            if got and first:
                assert got[0] == (length, first)


def test_candidates_need_occurrence_records(sam_impl):
    sam = sam_impl.SuffixAutomaton(4)
    sam.extend([1, 2, 1, 2])
    with pytest.raises(ValueError, match="occurrences"):
        sam.candidates(3, 2, 8)
    with pytest.raises(ValueError, match="occurrences"):
        sam_impl.Matcher(sam).candidates(3, 2, 8)


def test_longest_candidates_example(implementation):
    a, b, x, y, z, w, q = range(1, 8)
    prompt = [a, b, x, y, a, b, z, w, b, q, a, b, x, y, a, b]
    cfg = DraftConfig(prompt_lookup_num_tokens=2, mode="longest", max_candidates=4)
    req = started(make_drafter(cfg, implementation=implementation), prompt, 100)
    assert req.propose() == [z, w]  # the longest earlier match, "a b x y a b", ended at 5
    # "a b" also ended at 11 (then x y) and 1 (x y again: skipped); "b" also at 8 (then q a)
    assert req.candidates(4) == [[z, w], [x, y], [q, a]]
    assert req.candidates(2) == [[z, w], [x, y]]


@st.composite
def request_scenarios(draw):
    mode = draw(st.sampled_from(["pool", "longest"]))
    k = draw(st.integers(1, 6))
    max_len = draw(st.integers(1, 6))  # n in pool mode
    public, adaptive = draw(st.booleans()), draw(st.booleans())
    g = draw(st.integers(2, 5))
    alphabet = draw(st.integers(1, 4))
    token = st.integers(0, alphabet - 1)
    prompts = draw(st.lists(st.lists(token, max_size=15), min_size=1, max_size=3))
    limit = draw(st.integers(2, 60))
    chunks = draw(st.lists(st.lists(token, min_size=1, max_size=4), max_size=25))
    return mode, k, max_len, public, adaptive, g, prompts, limit, chunks


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=request_scenarios())
def test_request_candidates_invariants_and_implementations_agree(scenario):
    """Both modes, with the public pool and adaptive lengths: the invariants hold and C == Python."""
    mode, k, max_len, public, adaptive, g, prompts, limit, chunks = scenario
    cfg = DraftConfig(prompt_lookup_num_tokens=k, mode=mode, max_match_len=max_len, max_matching_ngram_size=max_len,
                      is_public_pool=public, adaptive=adaptive, max_candidates=g)
    names = [name for name in NAMES if name == "python" or require_native_or_none()]
    drafters = [make_drafter(cfg, implementation=name) for name in names]
    for prompt in prompts[:-1]:  # finished requests fill the public pool
        for drafter in drafters:
            req = started(drafter, prompt, limit)
            req.propose()
            req.finish()
    reqs = [started(drafter, prompts[-1], limit) for drafter in drafters]
    text = list(prompts[-1])
    for chunk in chunks:
        drafts = [req.propose() for req in reqs]
        cands = [req.candidates(g) for req in reqs]
        assert all(d == drafts[0] for d in drafts) and all(c == cands[0] for c in cands)
        _check_invariants(cands[0], drafts[0], len(text), k, limit, g)
        for req in reqs:
            req.record(len(drafts[0]), 0)
            req.extend(chunk)
        text += chunk


def require_native_or_none() -> bool:
    from promptlookup.drafting.native import load

    return load("pool") is not None and load("suffix_automaton") is not None


def test_caches_give_the_draft_alone():
    from promptlookup.drafting.cache_file import NgramCache

    cache = NgramCache(4)
    cache.update([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4])
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, max_candidates=3), implementation="python")
    drafter.static_cache = cache  # a cache as loaded from a file; the request's own text has no match
    req = started(drafter, [9, 1, 2], 100)
    req.has_caches = True
    draft = req.propose()
    assert draft and req.last_source == "static"
    assert req.candidates(3) == [draft]


@pytest.mark.parametrize("max_len", [4, 64])
def test_longest_candidates_c_equals_python_on_long_texts(max_len):
    require("c")
    rnd = random.Random(max_len)
    for alphabet in (3, 300):
        cfg = DraftConfig(prompt_lookup_num_tokens=8, mode="longest", max_match_len=max_len, max_candidates=4)
        pair = [make_drafter(cfg, implementation=name) for name in ("python", "c")]
        finished = [rnd.randrange(alphabet) for _ in range(400)]
        for drafter in pair:  # one finished request in the public pool
            drafter.new_request(finished, 10**6).finish()
        py, c = (drafter.new_request([], 10**6) for drafter in pair)
        text = [rnd.randrange(alphabet) for _ in range(200)]
        py.extend(text)
        c.extend(text)
        _run_side_by_side(rnd, py, c, alphabet, 2500)


def test_low_level_candidates_reject_bad_use(implementation):
    from promptlookup.drafting.native import drafting_classes

    classes = drafting_classes(implementation)
    with pytest.raises(ValueError, match="max_candidates"):
        classes.NGramPool(3, 2, True, True, 0)
    with pytest.raises(ValueError, match="max_candidates"):
        classes.NGramPool(3, 2, True, True, 65)
    cursor = classes.PoolCursor(classes.NGramPool(3, 2, True, True, 2))
    with pytest.raises(ValueError, match="propose"):
        cursor.candidates([1, 2, 1, 2], 100, 2)  # propose() has not seen this text
    assert cursor.propose([1, 2, 1, 2], 100) == ([1, 2], 2)
    assert cursor.candidates([1, 2, 1, 2], 100, 2) == [([1, 2], 2)]
    with pytest.raises(ValueError, match="max_candidates"):
        cursor.candidates([1, 2, 1, 2], 100, 65)
    assert cursor.candidates([1, 2, 1, 2], 5, 2) == []  # no room left: nothing, like propose()
    sam = classes.SuffixAutomaton(4, True)
    sam.extend([1, 2, 1, 2])
    with pytest.raises(ValueError, match="max_candidates"):
        sam.candidates(3, 65, 8)
    assert sam.candidates(3, 2, 0) == [] and sam.candidates(0, 2, 8) == []
    with pytest.raises(UserError, match="max_candidates"):
        make_drafter(DraftConfig(max_candidates=0))
    req = started(make_drafter(DraftConfig(max_candidates=2), implementation=implementation), [1, 2, 1], 100)
    req.propose()
    req.extend([2])
    with pytest.raises(RuntimeError, match="follow propose"):
        req.candidates(2)


def test_simulate_verifies_the_candidate_tree(implementation):
    from promptlookup.drafting import simulate

    a, x, y, p, q, z = 1, 2, 3, 4, 5, 6
    prompt = [a, x, y, z, a, p, q, z, a]
    tokens = prompt + [p, q, z, a, p, q]
    chain_cfg = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1)
    tree_cfg = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1, max_candidates=2)
    chain = simulate(tokens, len(prompt), chain_cfg, drafter=make_drafter(chain_cfg, implementation=implementation))
    tree = simulate(tokens, len(prompt), tree_cfg, drafter=make_drafter(tree_cfg, implementation=implementation))
    # after "a" the chain drafts its oldest match "x y" (rejected); the tree also holds "p q"
    assert tree.label.endswith("G=2") and tree.generated == chain.generated == 6
    assert tree.accepted > chain.accepted and tree.steps < chain.steps
    assert tree.accepted <= tree.drafted
