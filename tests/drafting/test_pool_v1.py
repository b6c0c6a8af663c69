"""The pool mode with V1 rules reproduces TensorRT-LLM V1's PLDPool (run_dtm_pld.py).

The implementation (``pool_v1.py``, through the drafter) is held to the specification
``promptlookup.drafting.pool_spec.PLDPoolSpec``.
"""
from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings

from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.drafting.pool_spec import NGramPoolManagerSpec, PLDPoolSpec
from promptlookup.drafting.pool_v1 import PLDCursor, PLDPool

from .scenarios import scenarios

END = 99


def v1_drafter(k, n, keep_all=True, oldest=True, public=False, end_id=END):
    cfg = DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, is_keep_all=keep_all,
                      is_use_oldest=oldest, is_public_pool=public, pool_rules="v1")
    return make_drafter(cfg, end_id=end_id)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_v1_pool_matches_the_specification(scenario):
    k, n, keep_all, oldest, public, prompts, limits, actions = scenario
    spec = PLDPoolSpec(k, n, keep_all, oldest, END, public)
    drafter = v1_drafter(k, n, keep_all, oldest, public)
    texts = [list(p) for p in prompts]
    reqs = [drafter.new_request(p, m) for p, m in zip(prompts, limits)]
    ids = list(range(len(prompts)))
    next_id = len(prompts)
    for i, chunk, restart in actions:
        room = limits[i] - 1 - len(texts[i])
        expected = spec.get_draft_tokens(list(texts[i]), ids[i], limits[i])
        # V1 sends [end_id] at the length limit and leaves the cut to the engine; the drafter
        # keeps len(text) + len(draft) + 1 <= max_seq_len, so it sends nothing there
        expected = expected[:room] if room > 0 else []
        assert reqs[i].propose() == expected, (texts[i], ids[i])
        reqs[i].extend(chunk)
        texts[i].extend(chunk)
        if restart == 0:
            reqs[i].finish()
            spec.finish(ids[i])
            ids[i] = next_id
            next_id += 1
            texts[i] = list(chunk)
            reqs[i] = drafter.new_request(chunk, limits[i])


def test_the_issue_example_v1_drafts_one_token_where_v2_drafts_two():
    """k=4, n=2, the text grown one token at a time to 0 0 0 0: V1 replaces the pattern's whole
    set whenever its first match is shorter than k, so (0, 0) keeps only the newest match (0,)."""
    req = v1_drafter(4, 2).new_request([0], 100)
    drafts = [req.propose()]
    for _ in range(3):
        req.extend([0])
        drafts.append(req.propose())
    assert drafts == [[END], [0], [0], [0]]
    spec = PLDPoolSpec(4, 2, True, True, END)
    assert [spec.get_draft_tokens([0] * L, 0, 100) for L in range(1, 5)] == [[END], [0], [0], [0]]
    v2 = NGramPoolManagerSpec(4, 2, True, True, False)
    assert [v2.get_draft_tokens([0] * L, 0, 100) for L in range(1, 5)][-1] == [0, 0]


def test_no_match_drafts_end_id_and_without_end_id_nothing():
    assert v1_drafter(3, 2).new_request([5, 6, 7], 100).propose() == [END]
    assert v1_drafter(3, 2, end_id=None).new_request([5, 6, 7], 100).propose() == []
    # at the length limit nothing is drafted (V1's [end_id] there could not be verified)
    assert v1_drafter(3, 2).new_request([5, 6, 7], 4).propose() == []


def test_pool_v1_cursor_against_spec_on_long_random_streams():
    rnd = random.Random(11)
    for keep_all in (True, False):
        for oldest in (True, False):
            for alphabet in (2, 3, 40):
                spec = PLDPoolSpec(5, 3, keep_all, oldest, -1, public=True)
                cur = PLDCursor(PLDPool(5, 3, keep_all, oldest))
                text = [rnd.randrange(alphabet) for _ in range(40)]
                for _ in range(120):
                    got, size = cur.propose(text, 10_000)
                    want = spec.get_draft_tokens(list(text), 0, 10_000)
                    assert (got if size else [-1]) == want
                    text.extend(rnd.randrange(alphabet) for _ in range(rnd.choice([1, 1, 2, 3, 6])))


def test_v1_workflow_is_token_identical_and_drafts_every_step():
    """End to end on a tiny model: V1 verifies [end_id] drafts like any draft (the output is
    plain greedy decoding's), and, as in TensorRT-LLM V1, every step but the last drafts."""
    import torch

    from promptlookup.decoding import generate
    from promptlookup.runtime.base import EngineLimits
    from promptlookup.runtime.torch_runner import TorchRunner
    from tests.tiny import tiny_llama

    model = tiny_llama(seed=3)
    limits = EngineLimits(max_batch_size=2, max_input_len=64, max_seq_len=128, max_draft_len=4, vocab_size=512)
    prompts = [[5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6], [40, 41, 42, 43]]
    with torch.inference_mode():
        plain = generate(TorchRunner(model, limits, tokens_per_block=4), prompts, max_new_tokens=24, end_id=2)
        v1 = generate(TorchRunner(model, limits, tokens_per_block=4), prompts, max_new_tokens=24, end_id=2,
                      draft=DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2), workflow="v1",
                      draft_length_policy="full")
    assert [r.output_ids for r in v1] == [r.output_ids for r in plain]
    for r in v1:
        assert r.drafted >= r.steps - 1


def test_pool_rules_flag_and_a_drafter_made_for_the_other_workflow():
    import pytest

    from promptlookup.cli.args import draft_from_args
    from promptlookup.cli.run import parse_args
    from promptlookup.decoding import generate
    from promptlookup.errors import UserError

    for flags, rules in (([], "auto"), (["--pool_rules", "v2"], "v2"), (["--pool_rules", "v1"], "v1")):
        assert draft_from_args(parse_args(["--prompt_lookup_config", "[4,2,[0]]", *flags])).pool_rules == rules
    with pytest.raises(UserError, match="unknown pool rules"):
        make_drafter(DraftConfig(pool_rules="v3"))

    from promptlookup.runtime.base import EngineLimits, RunnerCapabilities

    class NoRunner:  # the check comes before the runner is used
        limits = EngineLimits(max_batch_size=1, max_input_len=8, max_seq_len=16, max_draft_len=16, vocab_size=16)
        capabilities = RunnerCapabilities()
        step_cost_table = None

    with pytest.raises(UserError, match="made for workflow v2 but generation uses v1"):
        generate(NoRunner(), [[1, 2]], max_new_tokens=1, end_id=2, drafter=make_drafter(DraftConfig()), workflow="v1")
