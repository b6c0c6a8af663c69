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

from .implementations import require
from .reference import TrtPoolReference, covered


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
    k = draw(st.integers(1, 6))
    n = draw(st.integers(1, 4))
    keep_all, oldest, public = draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    g = draw(st.integers(1, 5))
    ask = draw(st.lists(st.integers(1, g), min_size=1, max_size=3))
    alphabet = draw(st.integers(1, 4))
    token = st.integers(0, alphabet - 1)
    nreq = draw(st.integers(1, 3))
    prompts = draw(st.lists(st.lists(token, max_size=12), min_size=nreq, max_size=nreq))
    limits = draw(st.lists(st.integers(2, 60), min_size=nreq, max_size=nreq))
    actions = draw(st.lists(st.tuples(st.integers(0, nreq - 1), st.lists(token, max_size=8),
                                      st.integers(0, 12), st.booleans()), max_size=40))
    return k, n, keep_all, oldest, public, g, ask, prompts, limits, actions


def _replay_pool(scenario, implementation: str) -> None:
    k, n, keep_all, oldest, public, g, ask, prompts, limits, actions = scenario
    ref = TrtPoolReference(k, n, keep_all, oldest, public)
    drafter = make_drafter(
        DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, mode="pool", is_keep_all=keep_all,
                    is_use_oldest=oldest, is_public_pool=public, max_candidates=g),
        implementation=implementation,
    )
    texts = [list(p) for p in prompts]
    reqs = [drafter.new_request(p, m) for p, m in zip(prompts, limits)]
    ids = list(range(len(prompts)))
    next_id = len(prompts)
    for step, (i, chunk, restart, call) in enumerate(actions):
        expected = ref.get_draft_tokens(list(texts[i]), ids[i], limits[i])
        draft = reqs[i].propose()
        assert draft == expected  # candidates() calls never change a later draft
        if call:
            for want in ask:
                cands = reqs[i].candidates(want)
                found = ref.candidates(list(texts[i]), ids[i], limits[i], g, want)
                assert cands == _expected(draft, found, want), (texts[i], want)
                _check_invariants(cands, draft, len(texts[i]), k, limits[i], want)
        reqs[i].extend(chunk)
        texts[i].extend(chunk)
        if restart == 0:
            reqs[i].finish()
            ref.finish(ids[i])
            ids[i], next_id = next_id, next_id + 1
            texts[i] = list(chunk)
            reqs[i] = drafter.new_request(chunk, limits[i])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=pool_scenarios())
def test_pool_candidates_match_tensorrt_llm_reference(scenario):
    _replay_pool(scenario, "python")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=pool_scenarios())
def test_c_pool_candidates_match_tensorrt_llm_reference(scenario):
    require("c")
    _replay_pool(scenario, "c")


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
        while len(py.tokens) < 3000:
            assert c.propose() == py.propose()
            if rnd.random() < 0.5:
                assert c.candidates(4) == py.candidates(4)
            if rnd.random() < 0.3:  # copy a span, as generated text does
                start = rnd.randrange(len(py.tokens) - 40)
                new = py.tokens[start:start + rnd.randint(1, 12)]
            else:
                new = [rnd.randrange(alphabet) for _ in range(rnd.randint(1, 4))]
            py.extend(new)
            c.extend(new)


def test_pool_candidates_example(implementation):
    # (1,) occurred three times, followed by 5 6 / 7 8 / 5 9; the 2-gram (4, 1) once
    prompt = [1, 5, 6, 1, 7, 8, 1, 5, 9, 4, 1]
    for oldest, first in ((True, [5, 6]), (False, [5, 9])):
        cfg = DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=2, is_use_oldest=oldest, max_candidates=4)
        req = make_drafter(cfg, implementation=implementation).new_request(prompt, 100)
        assert req.propose() == first
        got = req.candidates(4)
        assert got == ([[5, 6], [7, 8], [5, 9]] if oldest else [[5, 9], [7, 8], [5, 6]])
        assert req.candidates(1) == [first] and req.candidates(2) == got[:2]


def test_g1_is_todays_chain_and_bad_sizes_are_refused(implementation):
    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=3), implementation=implementation).new_request([1, 2, 3, 1, 2], 100)
    assert req.propose() == [3, 1, 2]
    assert req.candidates(1) == [[3, 1, 2]]
    with pytest.raises(ValueError, match="max_candidates"):
        req.candidates(2)
    with pytest.raises(ValueError, match="max_candidates"):
        req.candidates(0)
