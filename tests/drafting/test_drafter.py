"""Protocol invariants shared by every mode (see promptlookup/drafting/base.py)."""
from __future__ import annotations

import random

import pytest

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.errors import UserError

CONFIGS = [
    DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, mode=mode, adaptive=adaptive,
                is_public_pool=public, is_keep_all=keep or mode != "pool", is_use_oldest=oldest or mode != "pool",
                max_match_len=6)  # (the longest mode refuses the pool's own settings)
    for k, n in ((1, 1), (4, 2), (7, 3))
    for mode in ("pool", "longest")
    for adaptive in (False, True)
    for public, keep, oldest in ((True, True, True), (False, False, False))
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.mode}-k{c.prompt_lookup_num_tokens}-n{c.max_matching_ngram_size}-a{int(c.adaptive)}-p{int(c.is_public_pool)}")
def test_invariants_on_random_streams(config):
    rnd = random.Random(hash(config) & 0xFFFF)
    drafter = make_drafter(config)
    for _ in range(4):
        text = [rnd.randrange(3) for _ in range(rnd.randint(0, 10))]
        limit = len(text) + rnd.randint(1, 40)
        req = drafter.new_request(text, limit)
        while len(text) < limit:
            draft = req.propose()
            assert len(draft) <= config.prompt_lookup_num_tokens
            assert not draft or len(text) + len(draft) + 1 <= limit
            assert all(isinstance(t, int) for t in draft)
            n_acc = rnd.randint(0, len(draft))
            req.record(len(draft), n_acc)
            new = draft[:n_acc] + [rnd.randrange(3)]
            req.extend(new)
            text += new
        assert req.propose() == []
        req.finish()
        req.finish()  # idempotent


def test_drafts_come_from_the_token_stream_only():
    cfg = DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2)
    a = make_drafter(cfg).new_request([4, 5, 6, 7], 50)
    a.extend([4, 5])
    b = make_drafter(cfg).new_request([4, 5, 6, 7, 4], 50)
    b.extend([5])
    assert a.propose() == b.propose() == [6, 7, 4]


def test_token_like_inputs_are_converted():
    class Tok:
        def __init__(self, v):
            self.v = v

        def __int__(self):
            return self.v

    req = make_drafter(DraftConfig(prompt_lookup_num_tokens=2, max_matching_ngram_size=1)).new_request(
        [Tok(1), Tok(2), Tok(3)], 50
    )
    req.extend([Tok(1)])
    assert req.propose() == [2, 3]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(mode="suffix"), "unknown drafting mode"),
        (dict(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens"),
        (dict(max_matching_ngram_size=0), "max_matching_ngram_size"),
        (dict(max_match_len=0), "max_match_len"),
    ],
)
def test_bad_options_are_user_errors(kwargs, words):
    with pytest.raises(UserError, match=words):
        make_drafter(DraftConfig(**kwargs))


def test_misuse_is_reported():
    req = make_drafter(DraftConfig()).new_request([1, 2], 10)
    with pytest.raises(ValueError):
        req.record(2, 3)
    req.finish()
    with pytest.raises(RuntimeError):
        req.propose()
    with pytest.raises(RuntimeError):
        req.extend([1])


@pytest.mark.parametrize("config, message", [
    (DraftConfig(mode="longest", is_keep_all=False), "is_keep_all=False: the longest mode does not read it"),
    (DraftConfig(mode="llamacpp", is_use_oldest=False, pool_rules="v1"),
     "is_use_oldest=False, pool_rules='v1': the llamacpp mode does not read them"),
    (DraftConfig(mode="llamacpp", is_public_pool=False), "is_public_pool=False: the llamacpp mode"),
])
def test_the_pools_own_settings_are_refused_in_other_modes(config, message):
    from promptlookup.drafting.drafter import validate_config
    from promptlookup.errors import UserError

    with pytest.raises(UserError, match=message):
        validate_config(config)
    validate_config(DraftConfig(mode="longest", is_public_pool=False))  # the longest mode's public text: read
