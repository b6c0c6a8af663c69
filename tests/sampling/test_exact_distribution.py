"""Speculative sampling with prompt-lookup drafts samples exactly the model's distribution.

Setting: a tiny random Llama over a 16-token vocabulary (its output layer scaled up so the
distributions are concentrated), two prompts of different lengths in every batch, three
new tokens per request. The exact joint law of those three tokens is enumerated from the
Hugging Face model's own logits (:mod:`tests.sampling.exact`) and compared with thousands
of speculative samples by Pearson's chi-square test (cells expecting fewer than 5 counts
are pooled), at several temperatures and top-k / top-p values, in V1 and V2.

Drafts are a per-request mix (round robin) of three kinds: the model's argmax chain with
30% random corruption (often right), uniformly random tokens (rarely right) and the real
n-gram drafter. Each batch uses its own ``random_seed``; requests in a batch are
independent because the sampling noise is keyed by the request too.

Significance level: ALPHA = 1e-3 per test. Seeds are fixed, so the outcome is
deterministic; the level only says how unlucky a fixed seed would have to be to fail a
correct implementation. ``test_greedy_acceptance_is_detected`` shows the same test has
power: accepting a draft when it equals the argmax (a classic mistake) gives p-values
below 1e-12 on the same sample sizes.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting import make_drafter
from promptlookup.drafting.base import DraftConfig
from promptlookup.runtime import torch_runner
from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.sampling import target_distribution
from promptlookup.runtime.torch_runner import DecodeBatch, TorchRunner
from tests.sampling.drafters import ArgmaxChainDrafter, RandomDrafter, RoundRobinDrafter
from tests.sampling.exact import chi2_sf, describe, exact_tree, goodness_of_fit, homogeneity, reference_probs
from tests.tiny import tiny_llama

ALPHA = 1e-3
VOCAB = 16
END_ID = 2
NEW_TOKENS = 3
BATCH = 250
BATCHES = {"v2": 12, "v1": 6}  # samples: BATCH * BATCHES (3000 / 1500), split over the two prompts
PROMPTS = ([5, 9, 3, 7, 5, 9], [1, 4, 4, 8, 12, 4, 4, 8])  # repeats, so n-gram drafts exist
K = 4

SAMPLERS = {
    "t1.0": SamplingConfig(temperature=1.0),
    "t0.7-k4": SamplingConfig(temperature=0.7, top_k=4),
    "t1.5-p0.8": SamplingConfig(temperature=1.5, top_p=0.8),
    "t1.0-k6-p0.9": SamplingConfig(temperature=1.0, top_k=6, top_p=0.9),
}


@lru_cache(maxsize=None)
def model():
    m = tiny_llama(seed=0, vocab_size=VOCAB)
    with torch.no_grad():
        m.lm_head.weight.mul_(3.0)  # concentrate the distributions (entropy ~1.5-2 nats)
    return m


@lru_cache(maxsize=None)
def trees(name: str):
    return [exact_tree(model(), p, SAMPLERS[name], NEW_TOKENS, END_ID) for p in PROMPTS]


def new_runner() -> TorchRunner:
    limits = EngineLimits(max_batch_size=BATCH, max_input_len=32, max_seq_len=32, max_draft_len=K, vocab_size=VOCAB)
    return TorchRunner(model(), limits, tokens_per_block=4)


def mixed_drafter(name: str, seed: int) -> RoundRobinDrafter:
    chains = {tuple(p): t.argmax for p, t in zip(PROMPTS, trees(name))}
    return RoundRobinDrafter([
        ArgmaxChainDrafter(chains, K, VOCAB, wrong=0.3, seed=seed),
        RandomDrafter(K, VOCAB, seed=seed),
        make_drafter(DraftConfig(prompt_lookup_num_tokens=K, max_matching_ngram_size=2)),
    ])


def draw(name: str, workflow: str, speculative: bool, seed0: int):
    """``BATCH * BATCHES[workflow]`` samples; returns per-prompt Counters and (drafted, accepted)."""
    runner = new_runner()
    counts = [Counter() for _ in PROMPTS]
    drafted = accepted = 0
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(BATCH)]
    for b in range(BATCHES[workflow]):
        sampling = replace(SAMPLERS[name], random_seed=seed0 + b)
        drafter = mixed_drafter(name, seed0 + b) if speculative else None
        results = generate(runner, prompts, max_new_tokens=NEW_TOKENS, end_id=END_ID, sampling=sampling,
                           draft=drafter.config if drafter else None, drafter=drafter, workflow=workflow,
                           draft_length_policy="full")  # measured step costs would make the draws vary
        for i, r in enumerate(results):
            counts[i % len(PROMPTS)][tuple(r.output_ids)] += 1
            drafted += r.drafted
            accepted += r.accepted
    return counts, (drafted, accepted)


@lru_cache(maxsize=None)
def speculative_samples(name: str, workflow: str):
    return draw(name, workflow, speculative=True, seed0=1000)


def test_chi2_tail_is_right():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(0.0, 5) == 1.0


def test_the_statistics_accept_direct_draws_and_reject_a_shifted_law():
    """Calibration of the test itself, without the runtime: multinomial draws from the exact
    law pass; draws from a law with 10% of the mass moved to its likeliest outcome fail."""
    gen = torch.Generator().manual_seed(3)
    exact = [t.joint for t in trees("t1.0")]
    good, shifted = [], []
    for law in exact:
        outcomes = list(law)
        probs = torch.tensor([law[o] for o in outcomes], dtype=torch.float64)
        moved = 0.9 * probs
        moved[probs.argmax()] += 0.1
        for target, p in ((good, probs), (shifted, moved)):
            draws = torch.multinomial(p, 1500, replacement=True, generator=gen).tolist()
            target.append(Counter(outcomes[i] for i in draws))
    assert goodness_of_fit(good, exact).p_value > ALPHA
    assert goodness_of_fit(shifted, exact).p_value < 1e-6
    assert homogeneity(good, shifted, exact).p_value < 1e-3


@pytest.mark.parametrize("name", SAMPLERS)
def test_reference_filter_matches_the_runtime_filter(name):
    """The independent float64 filter used for the exact law equals ``target_distribution``."""
    sampling = SAMPLERS[name]
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(20, VOCAB, generator=gen) * 2
    for row in logits:
        ref = reference_probs(row, sampling)
        got = target_distribution(row[None], sampling)[0].double()
        assert torch.equal(ref > 0, got > 0)
        assert torch.allclose(ref, got, atol=1e-6)


def test_exact_laws_are_proper_and_concentrated():
    for name in SAMPLERS:
        for tree in trees(name):
            assert sum(tree.joint.values()) == pytest.approx(1.0, abs=1e-9)
            assert max(tree.joint.values()) > 0.02  # concentrated enough for a chi-square test


@pytest.mark.parametrize("workflow", ["v2", "v1"])
@pytest.mark.parametrize("name", SAMPLERS)
def test_speculative_samples_follow_the_exact_law(name, workflow):
    counts, (drafted, accepted) = speculative_samples(name, workflow)
    fit = goodness_of_fit(counts, [t.joint for t in trees(name)])
    assert fit.outside_support == 0, describe(fit)  # never a token the filter removed
    assert fit.p_value > ALPHA, describe(fit)
    assert 0 < accepted < drafted  # drafts were sometimes right and sometimes wrong
    assert accepted > 0.05 * drafted


@pytest.mark.parametrize("name", SAMPLERS)
def test_speculative_and_plain_samples_agree(name):
    """Two independent samples (different seeds): speculative V2 and plain decoding."""
    spec, _ = speculative_samples(name, "v2")
    plain, _ = draw(name, "v2", speculative=False, seed0=5000)
    exact = [t.joint for t in trees(name)]
    assert goodness_of_fit(plain, exact).p_value > ALPHA
    fit = homogeneity(spec, plain, exact)
    assert fit.p_value > ALPHA, describe(fit)


def install_greedy_acceptance(monkeypatch) -> None:
    """The classic mistake: a draft token is kept when it equals the *argmax* of the
    target's logits (or, by chance, the sampled token), instead of only the sampled one."""
    real_step, real_select = DecodeBatch.step_trees, torch_runner.select_tokens
    pending: list[list[int]] = []

    def step(self, indices, trees, end_id, sampling):
        assert all(t.is_chain for t in trees)
        pending[:] = [list(t.tokens) for t in trees]
        return real_step(self, indices, trees, end_id, sampling)

    def select(logits, sampling, requests, positions):
        chosen = real_select(logits, sampling, requests, positions)
        best = logits.argmax(-1).tolist()
        row = 0
        for draft in pending:
            for j, t in enumerate(draft):
                if t == best[row + j]:
                    chosen[row + j] = t
            row += len(draft) + 1
        return chosen

    monkeypatch.setattr(DecodeBatch, "step_trees", step)
    monkeypatch.setattr(torch_runner, "select_tokens", select)


@pytest.mark.parametrize("workflow", ["v2", "v1"])
def test_greedy_acceptance_is_detected(monkeypatch, workflow):
    name = "t1.0"
    exact = [t.joint for t in trees(name)]
    real = goodness_of_fit(speculative_samples(name, workflow)[0], exact)
    install_greedy_acceptance(monkeypatch)
    broken_counts, (drafted, accepted) = draw(name, workflow, speculative=True, seed0=1000)
    broken = goodness_of_fit(broken_counts, exact)
    assert real.p_value > ALPHA, describe(real)
    assert broken.p_value < 1e-12, describe(broken)
    assert broken.stat > 3 * real.stat, (describe(real), describe(broken))
