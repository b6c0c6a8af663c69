"""promptlookup.hf.generate: the model's own weights through this runtime, greedy output
token for token model.generate's, padded batches accepted."""
from __future__ import annotations

import pytest
import torch

from promptlookup import hf
from promptlookup.errors import UserError
from tests.tiny import tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=11, vocab_size=64)


def repetitive(seed: int, length: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 64, (max(2, length // 3),), generator=g).tolist()
    return (base * 4)[:length]


@pytest.mark.parametrize("k,n", [(10, 2), (4, 3)])
def test_greedy_equals_model_generate(model, k, n):
    ids = torch.tensor([repetitive(1, 24)])
    theirs = model.generate(ids, max_new_tokens=30, do_sample=False)
    theirs_pld = model.generate(ids, max_new_tokens=30, do_sample=False, prompt_lookup_num_tokens=k,
                                max_matching_ngram_size=n)
    ours = hf.generate(model, ids, prompt_lookup_num_tokens=k, max_matching_ngram_size=n, max_new_tokens=30,
                       do_sample=False)
    assert ours.tolist() == theirs.tolist() == theirs_pld.tolist()
    assert ours.dtype == ids.dtype


def test_default_length_comes_from_generation_config(model):
    ids = torch.tensor([repetitive(2, 9)])
    assert hf.generate(model, ids).tolist() == model.generate(ids, do_sample=False).tolist()


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_rows_equal_single_row_runs(model, side):
    prompts = [repetitive(3, 20), repetitive(4, 11), repetitive(5, 15)]
    width = max(map(len, prompts))
    pad = 0
    rows, mask = [], []
    for p in prompts:
        fill = [pad] * (width - len(p))
        rows.append(fill + p if side == "left" else p + fill)
        mask.append([0] * len(fill) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * len(fill))
    ids, attn = torch.tensor(rows), torch.tensor(mask)
    out = hf.generate(model, ids, attention_mask=attn, max_new_tokens=12, pad_token_id=pad, eos_token_id=2)
    assert out.shape[0] == 3 and out[:, :width].tolist() == rows
    for i, p in enumerate(prompts):
        single = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=2,
                                pad_token_id=pad)[0, len(p):].tolist()
        mine = out[i, width:].tolist()
        assert mine[: len(single)] == single
        assert all(t == pad for t in mine[len(single):])


def test_sampling_is_seeded_and_within_limits(model):
    ids = torch.tensor([repetitive(6, 12)])
    a = hf.generate(model, ids, do_sample=True, temperature=0.9, top_k=10, max_new_tokens=10, seed=3)
    b = hf.generate(model, ids, do_sample=True, temperature=0.9, top_k=10, max_new_tokens=10, seed=3)
    assert a.tolist() == b.tolist() and a.shape[1] <= 22


def test_bad_arguments(model):
    with pytest.raises(UserError, match="2-D"):
        hf.generate(model, torch.tensor([1, 2, 3]))
    with pytest.raises(UserError, match="max_new_tokens"):
        hf.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=0)
    with pytest.raises(UserError, match="no unmasked"):
        hf.generate(model, torch.tensor([[1, 2]]), attention_mask=torch.tensor([[0, 0]]), max_new_tokens=2)


def test_runner_is_cached_on_the_model_and_not_copied(model):
    import copy

    ids = torch.tensor([repetitive(7, 10)])
    hf.generate(model, ids, max_new_tokens=4)
    runner = model.__dict__["_promptlookup_runner"].runner
    hf.generate(model, ids, max_new_tokens=4)
    assert model.__dict__["_promptlookup_runner"].runner is runner  # reused
    clone = copy.deepcopy(model)
    assert clone.__dict__["_promptlookup_runner"].runner is None
    assert hf.generate(clone, ids, max_new_tokens=6).tolist() == hf.generate(model, ids, max_new_tokens=6).tolist()


def test_a_non_model_is_refused_naming_what_is_expected():
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match=r"loaded Llama model .*got str 'gpt2'.*from_pretrained\('gpt2'\)") as exc:
        hf.generate("gpt2", ids)
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="model_type None; only Llama"):
        hf.generate(torch.nn.Linear(2, 2), ids)


@pytest.mark.parametrize("kwargs, named", [
    ({"num_beams": 4}, "num_beams=4 (only num_beams=1)"),
    ({"return_dict_in_generate": True}, "return_dict_in_generate=True"),
    ({"num_return_sequences": 2}, "num_return_sequences=2"),
    ({"output_scores": True}, "output_scores=True"),
    ({"not_a_keyword": 1}, "keyword 'not_a_keyword'"),
    ({"min_new_tokens": 3}, "min_new_tokens=3 (only min_new_tokens=None or 0)"),
    ({"min_p": 0.1}, "min_p=0.1 (only min_p=None or 0.0)"),
])
def test_unsupported_keywords_are_named_with_what_is_supported(model, kwargs, named):
    with pytest.raises(ValueError) as exc:
        hf.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, **kwargs)
    text = str(exc.value)
    assert named in text and "supported keywords: " in text and "repetition_penalty" in text and "\n" not in text


def test_neutral_keywords_are_accepted(model):
    ids = torch.tensor([repetitive(8, 12)])
    plain = hf.generate(model, ids, max_new_tokens=6)
    same = hf.generate(model, ids, max_new_tokens=6, num_beams=1, return_dict_in_generate=False, use_cache=True)
    assert same.tolist() == plain.tolist()
    off = hf.generate(model, ids, max_new_tokens=6, min_new_tokens=0, min_p=0.0, penalty_alpha=0.0)  # "off" values
    assert off.tolist() == plain.tolist()


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 5.0}, {"max_new_tokens": True}, {"max_length": "9"}])
def test_lengths_of_the_wrong_type_are_one_line(model, kwargs):
    with pytest.raises(ValueError) as exc:
        hf.generate(model, torch.tensor([[1, 2, 3]]), **kwargs)
    name = next(iter(kwargs))
    assert f"{name} must be an integer" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("k", [1, 6])
def test_repetition_penalty_equals_model_generate(model, k):
    ids = torch.tensor([repetitive(9, 24)])
    theirs = model.generate(ids, max_new_tokens=20, do_sample=False, repetition_penalty=1.5)
    ours = hf.generate(model, ids, max_new_tokens=20, do_sample=False, repetition_penalty=1.5,
                       prompt_lookup_num_tokens=k)
    assert ours.tolist() == theirs.tolist()
    assert ours.tolist() != hf.generate(model, ids, max_new_tokens=20, prompt_lookup_num_tokens=k).tolist()
    with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0"):
        hf.generate(model, ids, repetition_penalty=0.0)


class Recorder:
    """Hugging Face's streamer protocol: put(tensor) ... end()."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1


def test_streamer_gets_the_prompt_then_every_new_token_then_end(model):
    ids = torch.tensor([repetitive(10, 24)])
    rec = Recorder()
    out = hf.generate(model, ids, max_new_tokens=16, prompt_lookup_num_tokens=6, streamer=rec)
    assert rec.puts[0] == ids[0].tolist() and rec.ended == 1
    assert sum(rec.puts[1:], []) == out[0, ids.shape[1]:].tolist()
    assert len(rec.puts) - 1 <= 16  # one put per verification step (several tokens when drafts are accepted)


def test_streamer_works_with_transformers_text_streamer(model):
    from transformers import TextIteratorStreamer

    class Tok:  # a tokenizer for the tiny vocabulary: token t is the text "<t>"
        def decode(self, ids, **_):
            return "".join(f"<{t}>" for t in ids)

    streamer = TextIteratorStreamer(Tok(), skip_prompt=True)
    out = hf.generate(model, torch.tensor([repetitive(11, 12)]), max_new_tokens=8, streamer=streamer)
    assert "".join(streamer) == Tok().decode(out[0, 12:].tolist())


def test_streamer_refuses_batches_and_non_streamers(model):
    with pytest.raises(ValueError, match="batch size 1"):
        hf.generate(model, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=2, streamer=Recorder())
    with pytest.raises(TypeError, match="put\\(\\) and end\\(\\)"):
        hf.generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, streamer=object())


def test_sampling_keywords_are_checked_and_warned_about_without_do_sample(model):
    ids = torch.tensor([repetitive(3, 12)])
    greedy = hf.generate(model, ids, max_new_tokens=6, do_sample=False).tolist()
    with pytest.warns(UserWarning, match="do_sample is False, so temperature=5.0, top_k=1 have no effect"):
        assert hf.generate(model, ids, max_new_tokens=6, temperature=5.0, top_k=1).tolist() == greedy
    for kwargs, message in ((dict(do_sample=True, temperature=0.0), "strictly positive float with do_sample=True"),
                            (dict(do_sample=True, top_p=5.0), r"top_p must be in \(0, 1\], got 5.0"),
                            (dict(do_sample=True, top_k=-3), "top_k must be an integer >= 0"),
                            (dict(temperature=-1.0), "temperature must be a finite number >= 0")):
        with pytest.raises(hf.HFValueError, match=message):
            hf.generate(model, ids, max_new_tokens=6, **kwargs)


def test_a_max_length_within_the_input_names_max_length(model):
    ids = torch.tensor([repetitive(4, 12)])
    with pytest.raises(hf.HFValueError, match="max_length 8 leaves no room after the 12-token input"):
        hf.generate(model, ids, max_length=8)
