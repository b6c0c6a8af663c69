"""The Hugging Face baseline: plain vs prompt lookup, step counting, end token, loading."""
from __future__ import annotations

import pytest
import torch

from promptlookup.errors import UserError
from promptlookup.evaluation.hf_baseline import count_forward_calls, hf_generate, is_converted_dir, load_hf_model
from promptlookup.runtime.base import SamplingConfig
from tests.tiny import tiny_llama

PROMPTS = [[5, 6, 7, 8, 9] * 4, [11, 12, 13, 11, 12, 13, 14, 11, 12]]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1)


def test_prompt_lookup_is_lossless_and_takes_fewer_steps(model):
    with count_forward_calls(model) as plain_calls:
        plain = hf_generate(model, PROMPTS, max_new_tokens=24, end_id=-1)
    with count_forward_calls(model) as lookup_calls:
        lookup = hf_generate(model, PROMPTS, max_new_tokens=24, end_id=-1, prompt_lookup_num_tokens=4,
                             max_matching_ngram_size=2)
    assert lookup == plain
    assert [len(o) for o in plain] == [24, 24]
    assert plain_calls.calls == 48  # one forward pass per token, per prompt
    assert lookup_calls.calls <= plain_calls.calls


def test_output_stops_at_end_id(model):
    first = hf_generate(model, PROMPTS[:1], max_new_tokens=12, end_id=-1)[0]
    end = first[3]
    stopped = hf_generate(model, PROMPTS[:1], max_new_tokens=12, end_id=end)[0]
    assert stopped == first[: first.index(end) + 1]


def test_sampling_is_seeded(model):
    cfg = SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, random_seed=7)
    a = hf_generate(model, PROMPTS, max_new_tokens=10, end_id=-1, sampling=cfg)
    b = hf_generate(model, PROMPTS, max_new_tokens=10, end_id=-1, sampling=cfg)
    assert a == b


def test_progress_callback(model):
    seen = []
    hf_generate(model, PROMPTS, max_new_tokens=3, end_id=-1, on_output=lambda i, ids: seen.append((i, len(ids))))
    assert seen == [(0, 3), (1, 3)]


def test_load_hf_dir_and_converted_checkpoint(tmp_path, model):
    from promptlookup.checkpoint.convert import convert_model

    model.save_pretrained(str(tmp_path / "hf"))
    convert_model(model, None, tmp_path / "ckpt", dtype="float32")
    assert not is_converted_dir(tmp_path / "hf") and is_converted_dir(tmp_path / "ckpt")
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        expected = model(ids).logits
        for directory in ("hf", "ckpt"):
            loaded = load_hf_model(str(tmp_path / directory), data_type="float32", device="cpu")
            torch.testing.assert_close(loaded(ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_missing_model_dir(tmp_path):
    with pytest.raises(UserError, match="config.json"):
        load_hf_model(str(tmp_path))
