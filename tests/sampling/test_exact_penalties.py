"""Speculative sampling stays exact with penalties and bad words.

The machinery of :mod:`tests.sampling.test_exact_distribution` (tiny model over 16 tokens,
two prompts per batch, three new tokens, mixed drafts), with repetition, presence and
frequency penalties and bad words. The exact law is enumerated from the HF model's logits
processed by an independent float64 reference of the documented rules (TensorRT-LLM's:
the prefix is the whole sequence so far, prompt included; additive penalties apply after
the temperature), so a wrong prefix per verified position would show as a misfit.
"""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from promptlookup.runtime.base import SamplingConfig
from tests.sampling import test_exact_distribution as base
from tests.sampling.exact import describe, exact_tree, goodness_of_fit

SAMPLERS = {
    "t0.5-rep1.5-freq0.5-bad": SamplingConfig(temperature=0.5, repetition_penalty=1.5, frequency_penalty=0.5,
                                              bad_words=((11,), (5, 9))),
    "t0.6-k6-pres1.5-rep0.8": SamplingConfig(temperature=0.6, top_k=6, presence_penalty=1.5, repetition_penalty=0.8),
    "t0.5-pres3.0": SamplingConfig(temperature=0.5, presence_penalty=3.0),
}


def reference_process(sampling: SamplingConfig):
    def process(row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        x = row.double().clone() / sampling.temperature  # temperature first, then the penalties
        for t in set(prefix):
            if sampling.repetition_penalty != 1.0:
                x[t] = x[t] * sampling.repetition_penalty if x[t] < 0 else x[t] / sampling.repetition_penalty
            x[t] -= sampling.presence_penalty + sampling.frequency_penalty * prefix.count(t)
        for w in sampling.bad_words:
            if len(w) == 1 or tuple(prefix[-(len(w) - 1):]) == tuple(w[:-1]):
                x[w[-1]] = float("-inf")
        return x * sampling.temperature  # reference_probs divides by the temperature again

    return process


@lru_cache(maxsize=None)
def trees(name: str):
    s = SAMPLERS[name]
    return [exact_tree(base.model(), p, s, base.NEW_TOKENS, base.END_ID, process=reference_process(s))
            for p in base.PROMPTS]


@pytest.fixture
def samplers(monkeypatch):
    monkeypatch.setattr(base, "SAMPLERS", SAMPLERS)
    monkeypatch.setattr(base, "trees", trees)
    monkeypatch.setattr(base, "BATCHES", {"v2": 6, "v1": 4})


def test_penalties_change_the_law(samplers):
    plain = exact_tree(base.model(), base.PROMPTS[0], SamplingConfig(temperature=0.5), base.NEW_TOKENS, base.END_ID)
    law = trees("t0.5-rep1.5-freq0.5-bad")[0].joint
    assert max(abs(law.get(o, 0.0) - p) for o, p in plain.joint.items()) > 0.02
    assert not any(11 in o for o in law)  # the bad word has probability 0


@pytest.mark.parametrize("workflow", ["v2", "v1"])
@pytest.mark.parametrize("name", SAMPLERS)
def test_speculative_samples_with_penalties_follow_the_exact_law(samplers, name, workflow):
    counts, (drafted, accepted) = base.draw(name, workflow, speculative=True, seed0=2000)
    fit = goodness_of_fit(counts, [t.joint for t in trees(name)])
    assert fit.outside_support == 0, describe(fit)
    assert fit.p_value > base.ALPHA, describe(fit)
    assert 0 < accepted < drafted


def test_a_shared_prefix_for_every_position_is_detected(samplers, monkeypatch):
    """Power: penalising every verified position with the sequence's prefix *before* the
    draft (the classic mistake) no longer samples the exact law."""
    from promptlookup.runtime import logits_processors, torch_runner

    def wrong(sequences, drafts):
        return [list(s) for s, d in zip(sequences, drafts) for _ in range(len(d) + 1)]

    monkeypatch.setattr(torch_runner, "row_prefixes", wrong)
    name = "t0.5-pres3.0"  # a strong presence penalty makes the mistake visible (p ~ 1e-32 here)
    counts, _ = base.draw(name, "v2", speculative=True, seed0=2000)
    fit = goodness_of_fit(counts, [t.joint for t in trees(name)])
    assert fit.p_value < 1e-6 or fit.outside_support > 0, describe(fit)
    assert logits_processors.row_prefixes is not wrong
