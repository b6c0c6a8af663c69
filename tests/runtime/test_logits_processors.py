"""Penalties, bad words and stop words: TensorRT-LLM's semantics, and greedy identity.

- :func:`apply_logits_processors` equals an independent per-row float64 reference.
- Greedy prompt lookup with penalties / bad words / stop words is token-identical to plain
  greedy decoding with the same settings (tiny random models, V1 and V2, batched).
- Repetition penalty and bad words equal Hugging Face ``generate`` (same semantics there:
  prompt included, ``l/r`` or ``l*r``; a bad word's last token banned after its head).
- Stop words cut the plain output right after the first completed stop word.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.decoding.request import stop_cut
from promptlookup.drafting.base import DraftConfig
from promptlookup.runtime.base import SamplingConfig
from promptlookup.runtime.logits_processors import apply_logits_processors, row_prefixes
from tests.runtime.test_greedy_equivalence import END_ID, make_prompts, runner_for
from tests.tiny import tiny_llama

MAX_NEW = 40


def reference_row(row: torch.Tensor, prefix: list[int], s: SamplingConfig) -> torch.Tensor:
    """One row, float64, written from the documented rules only."""
    x = row.double().clone()
    scale = s.temperature if s.temperature > 0 else 1.0
    for t in set(prefix):
        n = prefix.count(t)
        if s.repetition_penalty != 1.0:
            x[t] = x[t] * s.repetition_penalty if x[t] < 0 else x[t] / s.repetition_penalty
        x[t] -= s.presence_penalty * scale + s.frequency_penalty * scale * n
    for w in s.bad_words:
        if len(w) == 1 or (len(prefix) >= len(w) - 1 and tuple(prefix[len(prefix) - len(w) + 1:]) == tuple(w[:-1])):
            x[w[-1]] = -math.inf
    return x


@pytest.mark.parametrize("s", [
    SamplingConfig(repetition_penalty=1.7),
    SamplingConfig(repetition_penalty=0.6, presence_penalty=0.4),
    SamplingConfig(temperature=0.8, presence_penalty=-0.3, frequency_penalty=0.25),
    SamplingConfig(frequency_penalty=1.0, bad_words=((5,), (3, 4), (1, 2, 3))),
])
def test_matches_the_reference(s):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 12, generator=gen) * 3
    prefixes = [[], [3], [1, 2], [3, 3, 4, 1, 2], [7, 7, 7, 3], [0, 11, 11, 1, 2]]
    got = apply_logits_processors(logits, prefixes, s)
    for row, p, g in zip(logits, prefixes, got):
        ref = reference_row(row, p, s)
        assert torch.equal(torch.isinf(ref), torch.isinf(g.double()))
        fin = ~torch.isinf(ref)
        assert torch.allclose(ref[fin], g.double()[fin], atol=1e-5)


def test_neutral_settings_leave_the_logits_alone():
    logits = torch.randn(3, 8)
    assert apply_logits_processors(logits, [[1], [2], [3]], SamplingConfig(stop_words=((1,),))) is logits


def test_row_prefixes_follow_the_step_layout():
    assert row_prefixes([[1, 2], [9]], [[3, 4], []]) == [[1, 2], [1, 2, 3], [1, 2, 3, 4], [9]]


def test_stop_cut():
    assert stop_cut([5, 6], [7, 8, 9], [[8]]) == 2
    assert stop_cut([5, 6], [7, 8, 9], [[6, 7]]) == 1  # a stop word may begin before the new tokens
    assert stop_cut([5, 6], [7, 8, 9], [[9, 9]]) is None
    assert stop_cut([], [4, 4], [[4, 4], [4]]) == 1  # the earliest completion wins


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1)


SETTINGS = {
    "repetition": SamplingConfig(repetition_penalty=1.2),
    "presence+frequency": SamplingConfig(presence_penalty=0.6, frequency_penalty=0.4),
    "all+bad": SamplingConfig(repetition_penalty=1.3, frequency_penalty=0.2, bad_words=((7,), (12, 13))),
    "encourage": SamplingConfig(repetition_penalty=0.5, presence_penalty=-0.5),
    "logit_bias": SamplingConfig(logit_bias=((5, 4.0), (9, 3.0), (12, -50.0))),
}


@pytest.fixture(scope="module")
def plain_outputs(model):
    prompts = make_prompts(1)
    out = {name: [r.output_ids for r in generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID,
                                                   sampling=s)]
           for name, s in SETTINGS.items()}
    out["none"] = [r.output_ids for r in generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID)]
    return prompts, out


def test_penalties_change_the_output(plain_outputs):
    _, out = plain_outputs
    for name in SETTINGS:
        assert out[name] != out["none"], name


@pytest.mark.parametrize("workflow", ["v1", "v2"])
@pytest.mark.parametrize("name", SETTINGS)
def test_batched_lookup_with_penalties_is_token_identical(model, plain_outputs, workflow, name):
    prompts, out = plain_outputs
    got = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, sampling=SETTINGS[name],
                   draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2), workflow=workflow,
                   draft_length_policy="full")
    assert [r.output_ids for r in got] == out[name]
    assert sum(r.accepted for r in got) > 0


def test_bad_words_are_never_produced(plain_outputs):
    prompts, out = plain_outputs
    for p, o in zip(prompts, out["all+bad"]):
        assert 7 not in o
        seq = p + o
        assert not any(seq[i:i + 2] == [12, 13] for i in range(len(p) - 1, len(seq) - 1))


def hf_greedy(model, prompt, **kwargs):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=END_ID,
                             pad_token_id=0, **kwargs)[0, len(prompt):].tolist()
    return out[: out.index(END_ID) + 1] if END_ID in out else out


@pytest.mark.parametrize("workflow", [None, "v1", "v2"])
def test_repetition_penalty_and_bad_words_equal_hf_generate(model, plain_outputs, workflow):
    prompts, _ = plain_outputs
    s = SamplingConfig(repetition_penalty=1.6, bad_words=((9,), (20, 21)))
    draft = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=2) if workflow else None
    got = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, sampling=s, draft=draft,
                   workflow=workflow or "v2")
    ref = [hf_greedy(model, p, repetition_penalty=1.6, bad_words_ids=[[9], [20, 21]]) for p in prompts]
    assert [r.output_ids for r in got] == ref


@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_stop_words_cut_after_the_first_completion(model, plain_outputs, workflow):
    prompts, out = plain_outputs
    base = out["none"]
    # A 2-token stop word taken from the middle of the first output, and a 1-token one.
    stop = (tuple(base[0][10:12]), (base[1][15],))
    got = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID,
                   sampling=SamplingConfig(stop_words=stop),
                   draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2), workflow=workflow)
    plain = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID,
                     sampling=SamplingConfig(stop_words=stop))
    cut_any = False
    for p, o, g, q in zip(prompts, base, got, plain):
        seq = p + o
        ends = [i + len(w) for w in stop for i in range(len(seq) - len(w) + 1)
                if tuple(seq[i:i + len(w)]) == w and i + len(w) > len(p)]
        keep = min(ends) - len(p) if ends else len(o)
        cut_any |= bool(ends)
        assert g.output_ids == q.output_ids == o[:keep]
        assert g.finished == (bool(ends) or (bool(o) and o[-1] == END_ID))
    assert cut_any


def test_non_torch_runner_refuses_penalties():
    from promptlookup.errors import UserError
    from promptlookup.runtime.base import EngineLimits, RunnerCapabilities

    class Fake:
        limits = EngineLimits(8, 64, 128, 4, 32)
        capabilities = RunnerCapabilities()  # no logits processors
        step_cost_table = None

        def generate(self, *a, **k):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(UserError, match="PyTorch runtime only"):
        generate(Fake(), [[1, 2]], max_new_tokens=4, end_id=2,
                 sampling=replace(SamplingConfig(), repetition_penalty=1.2))


def test_logit_bias_adds_to_the_raw_logits():
    logits = torch.zeros(2, 6)
    out = apply_logits_processors(logits, [[1], [1, 2]], SamplingConfig(temperature=0.5, logit_bias=((3, 2.0), (0, -1.0))))
    assert out[:, 3].tolist() == [2.0, 2.0] and out[:, 0].tolist() == [-1.0, -1.0] and out[:, 1].tolist() == [0.0, 0.0]


def test_min_tokens_bans_the_end_token_per_row():
    logits = torch.zeros(3, 6)
    # prompt of 2 tokens; rows hold 0, 1 and 2 output tokens before their position
    out = apply_logits_processors(logits, [[7, 7], [7, 7, 1], [7, 7, 1, 2]], SamplingConfig(min_tokens=2),
                                  prompt_lens=[2, 2, 2], end_id=4)
    assert out[:, 4].tolist() == [float("-inf"), float("-inf"), 0.0]


def test_min_tokens_with_lookup_is_token_identical(model):
    """The end token forced by a bias and held off by min_tokens: plain decoding and prompt
    lookup (V2, the live batch) stop at the same token."""
    from promptlookup.errors import UserError

    prompts = make_prompts(1)
    s = SamplingConfig(logit_bias=((END_ID, 8.0),), min_tokens=7)
    plain = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, sampling=s)
    lookup = generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, sampling=s,
                      draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2), workflow="v2",
                      draft_length_policy="full")
    assert [r.output_ids for r in lookup] == [r.output_ids for r in plain]
    assert all(len(r.output_ids) >= 7 and r.output_ids[-1] == END_ID for r in plain)
    with pytest.raises(UserError, match="min_tokens"):
        generate(runner_for(model), prompts, max_new_tokens=MAX_NEW, end_id=END_ID, sampling=s,
                 draft=DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2), workflow="v1")
