"""min_matching_ngram_size (MLX's ngram_min): drafts behind too short a match are dropped,
identically in the C and pure-Python drafters, and nothing else changes."""
from __future__ import annotations

import random

import pytest

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.errors import UserError

from .implementations import NAMES, require


def _drafts(config: DraftConfig, implementation: str, streams: list[list[int]], seed: int):
    """Drafts (and the match length behind each) along fixed streams, requests one after another."""
    rnd = random.Random(seed)
    drafter = make_drafter(config, implementation=implementation)
    out = []
    for stream in streams:
        text = stream[:5]
        req = drafter.new_request(text, len(stream) + 1)
        pos = len(text)
        while pos < len(stream):
            draft = req.propose()
            out.append((draft, req.last_match_len))
            step = stream[pos:pos + rnd.randint(1, 3)]
            accepted = 0
            while accepted < min(len(draft), len(step) - 1) and draft[accepted] == step[accepted]:
                accepted += 1
            req.record(len(draft), accepted)
            req.extend(step)
            pos += len(step)
        req.finish()
    return out


@pytest.mark.parametrize("implementation", NAMES)
@pytest.mark.parametrize("mode,n", [("pool", 3), ("pool", 1), ("longest", 3)])
@pytest.mark.parametrize("min_n", [1, 2, 3])
def test_min_ngram_drops_exactly_the_short_matches(implementation, mode, n, min_n):
    require(implementation)
    if mode == "pool" and min_n > n:
        pytest.skip("refused by validation (tested below)")
    rnd = random.Random(min_n * 7 + n)
    streams = [[rnd.randrange(4) for _ in range(rnd.randint(8, 60))] for _ in range(5)]
    base = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=n, mode=mode, max_match_len=8)
    with_min = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=n, mode=mode, max_match_len=8,
                           min_matching_ngram_size=min_n)
    plain = _drafts(base, implementation, streams, seed=1)
    filtered = _drafts(with_min, implementation, streams, seed=1)
    assert len(plain) == len(filtered)
    dropped = 0
    for (d1, m1), (d2, _m2) in zip(plain, filtered):
        assert d2 == (d1 if m1 >= min_n else [])
        dropped += bool(d1) and m1 < min_n
    if min_n > 1:
        assert dropped > 0  # the streams exercise the filter


@pytest.mark.parametrize("mode", ["pool", "longest"])
def test_c_and_python_agree_with_min_ngram(mode):
    require("c")
    rnd = random.Random(5)
    streams = [[rnd.randrange(3) for _ in range(rnd.randint(10, 50))] for _ in range(6)]
    config = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=3, mode=mode,
                         min_matching_ngram_size=2)
    assert _drafts(config, "c", streams, 2) == _drafts(config, "python", streams, 2)


def test_pool_min_equal_to_max_uses_only_full_size_ngrams():
    # text ... 7 8 9 | ... 8 9: the 2-gram (8, 9) matches, the 3-gram (x, 8, 9) does not.
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=3,
                                       min_matching_ngram_size=3, is_public_pool=False))
    # (V2 pool rules draft from the first generated token on, so the last token is extended)
    req = drafter.new_request([7, 8, 9, 1, 2, 3, 5, 8], 100)
    req.extend([9])
    assert req.propose() == []
    req2 = drafter.new_request([7, 8, 9, 1, 2, 3, 7, 8], 100)
    req2.extend([9])
    assert req2.propose() == [1, 2, 3]


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_min_ngram_is_a_user_error(bad):
    with pytest.raises(UserError, match="min_matching_ngram_size"):
        make_drafter(DraftConfig(min_matching_ngram_size=bad))


def test_pool_min_above_max_is_a_user_error():
    with pytest.raises(UserError, match="exceeds max_matching_ngram_size"):
        make_drafter(DraftConfig(max_matching_ngram_size=2, min_matching_ngram_size=3))


def test_run_py_flag_sets_the_minimum():
    from promptlookup.cli.args import draft_from_args
    from promptlookup.cli.run import parse_args

    args = parse_args(["--prompt_lookup_config", "[4,2,[0]]", "--prompt_lookup_min_ngram", "2"])
    assert draft_from_args(args).min_matching_ngram_size == 2
    assert draft_from_args(parse_args(["--prompt_lookup_config", "[4,2,[0]]"])).min_matching_ngram_size == 1
