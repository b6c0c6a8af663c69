"""Log-probabilities of emitted tokens (promptlookup.runtime.logprobs).

They come from the target's raw logits at the position that chose each token, so prompt
lookup reports what plain decoding reports for the same prefix: the same computation, with
one difference of route. On the CPU in float32 the projections are row-invariant (the C
kernels, up to 96 rows), but PyTorch's ``scaled_dot_product_attention`` is not: a query row
computed among the rows of a verification pass differs from the same row computed alone by
float32 rounding (measured here: under 1e-6 on the logits). So the tests compare with a
tight tolerance (:data:`TOL`, absolute, on log-probabilities of magnitude ~1-10), and
demand exact equality of everything discrete: the tokens, their count, and the order of
the top alternatives. Against a Hugging Face forward pass (another kernel path) the same.
"""
from __future__ import annotations

import random

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.torch_runner import TorchRunner
from tests.tiny import tiny_llama

END_ID = 2
MAX_NEW = 40
TOL = 1e-5


def assert_same(got, want) -> None:
    """Equal tokens and top-alternative ids; log-probabilities within :data:`TOL`."""
    assert got is not None and want is not None and len(got) == len(want)
    for g, w in zip(got, want):
        assert g.token == w.token and [t for t, _ in g.top] == [t for t, _ in w.top]
        assert g.logprob == pytest.approx(w.logprob, abs=TOL)
        assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=TOL)


def prompts(seed: int = 0, count: int = 3) -> list[list[int]]:
    """Repetitive prompts over a small alphabet, so prompt lookup drafts and accepts."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        phrases = [[rng.randrange(3, 60) for _ in range(rng.randrange(2, 6))] for _ in range(3)]
        p: list[int] = []
        while len(p) < rng.randrange(20, 90):
            p.extend(rng.choice(phrases))
        out.append(p)
    return out


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1)


def runner(model) -> TorchRunner:
    limits = EngineLimits(max_batch_size=8, max_input_len=512, max_seq_len=768, max_draft_len=16, vocab_size=512)
    return TorchRunner(model, limits, tokens_per_block=8)


def run(model, sampling: SamplingConfig, draft: DraftConfig | None, ps=None):
    return generate(runner(model), ps or prompts(), max_new_tokens=MAX_NEW, end_id=END_ID, sampling=sampling,
                    draft=draft)


@pytest.mark.parametrize("top", [0, 3])
@pytest.mark.parametrize("k", [2, 8])
def test_greedy_lookup_logprobs_equal_plain_decodings(model, top, k):
    sampling = SamplingConfig(logprobs=top)
    plain = run(model, sampling, None)
    spec = run(model, sampling, DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=2))
    assert sum(r.accepted for r in spec) > 10  # the speculative path really was taken
    for p, s in zip(plain, spec):
        assert s.output_ids == p.output_ids
        assert_same(s.token_logprobs, p.token_logprobs)
        assert len(s.token_logprobs) == len(s.output_ids)
        assert [e.token for e in s.token_logprobs] == s.output_ids
        assert all(len(e.top) == top for e in s.token_logprobs)


def test_lookup_trees_logprobs_equal_plain_decodings(model):
    sampling = SamplingConfig(logprobs=2)
    plain = run(model, sampling, None)
    trees = run(model, sampling, DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=1, max_candidates=3))
    assert sum(r.accepted for r in trees) > 10
    for t, p in zip(trees, plain):
        assert t.output_ids == p.output_ids
        assert_same(t.token_logprobs, p.token_logprobs)


def test_sampled_lookup_logprobs_equal_plain_decodings(model):
    sampling = SamplingConfig(temperature=0.8, top_k=20, random_seed=5, logprobs=1, presence_penalty=0.5)
    plain = run(model, sampling, None)
    spec = run(model, sampling, DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2))
    for p, s in zip(plain, spec):
        assert s.output_ids == p.output_ids
        assert_same(s.token_logprobs, p.token_logprobs)


def test_values_are_the_raw_models_log_softmax(model):
    """Raw logits: neither temperature nor penalties nor logit_bias change the values."""
    p = prompts()[0]
    sampling = SamplingConfig(logprobs=4, repetition_penalty=1.3, logit_bias=((7, 5.0),))
    r = run(model, sampling, DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2), [p])[0]
    with torch.inference_mode():
        logits = model(torch.tensor([p + r.output_ids])).logits[0, len(p) - 1 : -1].float()
    ref = torch.log_softmax(logits, dim=-1)
    for j, e in enumerate(r.token_logprobs):
        assert e.logprob == pytest.approx(ref[j, e.token].item(), abs=1e-4)
        values, ids = torch.topk(ref[j], 4)
        assert [t for t, _ in e.top] == ids.tolist()
        assert [v for _, v in e.top] == pytest.approx(values.tolist(), abs=1e-4)
        assert e.rank == int((ref[j] > ref[j, e.token]).sum()) + 1  # vLLM's rank: 1 + the tokens more likely
    assert any(e.rank > 1 for e in r.token_logprobs)  # logit_bias / the penalty chose a less likely token


def test_no_logprobs_unless_asked_and_a_mixed_batch_shares_the_pass(model):
    ps = prompts()
    plain = run(model, SamplingConfig(), DraftConfig(prompt_lookup_num_tokens=4), ps)
    assert all(r.token_logprobs is None for r in plain)
    asked = run(model, SamplingConfig(logprobs=0), DraftConfig(prompt_lookup_num_tokens=4), ps)
    assert [r.output_ids for r in asked] == [r.output_ids for r in plain]
    assert all(e.top == () for r in asked for e in r.token_logprobs)


def test_max_new_tokens_and_stop_words_cut_the_logprobs_with_the_tokens(model):
    p = prompts()[0]
    full = run(model, SamplingConfig(logprobs=1), None, [p])[0]
    stop = tuple(full.output_ids[5:7])
    cut = run(model, SamplingConfig(logprobs=1, stop_words=(stop,)),
              DraftConfig(prompt_lookup_num_tokens=8, max_matching_ngram_size=1), [p])[0]
    assert cut.output_ids == full.output_ids[: len(cut.output_ids)] and len(cut.output_ids) < len(full.output_ids)
    assert_same(cut.token_logprobs, full.token_logprobs[: len(cut.output_ids)])


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_out_of_range_is_refused(model, bad):
    with pytest.raises(UserError, match="logprobs must be an integer in"):
        run(model, SamplingConfig(logprobs=bad), None)


def test_the_v1_orchestrator_refuses_rather_than_ignores(model):
    with pytest.raises(UserError, match="log-probabilities"):
        generate(runner(model), prompts(), max_new_tokens=4, end_id=END_ID, sampling=SamplingConfig(logprobs=0),
                 draft=DraftConfig(prompt_lookup_num_tokens=4), workflow="v1")


def test_requests_that_ask_and_requests_that_do_not_share_one_forward_pass(model):
    from promptlookup.decoding.request import RequestState, make_proposer
    from promptlookup.decoding.step import sampling_groups, step

    r = runner(model)
    ps = prompts()[:2]
    batch = r.open(ps)
    states = [RequestState(i, p, make_proposer(p, None, 768), max_new_tokens=8, end_id=END_ID, max_seq_len=768,
                           sampling=SamplingConfig(logprobs=want), slot=i)
              for i, (p, want) in enumerate(zip(ps, [None, 2]))]
    assert len(sampling_groups(states)) == 1
    step(batch, states)  # the prompts (one pass or two, by padding)
    before = r.stats.forward_calls
    events = step(batch, states)
    assert r.stats.forward_calls == before + 1
    assert events[0].token_logprobs is None and states[0].result.token_logprobs is None
    (entry,) = events[1].token_logprobs
    assert entry.token == events[1].tokens[0] and len(entry.top) == 2
    assert len(states[1].result.token_logprobs) == len(states[1].result.output_ids) == 2
    batch.close()
