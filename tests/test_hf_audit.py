"""promptlookup.hf.generate, audited against transformers' model.generate: settings of a
GenerationConfig are honoured or refused (never dropped), and bad values are one-line
ValueErrors/TypeErrors, as Hugging Face raises them."""
from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from promptlookup import hf
from promptlookup.errors import UserError
from tests.tiny import tiny_llama

IDS = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=11, vocab_size=64)


def test_a_passed_generation_config_is_honoured_as_model_generate_does(model):
    config = GenerationConfig(max_new_tokens=3, do_sample=False, prompt_lookup_num_tokens=4)
    ours = hf.generate(model, IDS, generation_config=config)
    assert ours.tolist() == model.generate(IDS, generation_config=config).tolist()
    assert ours.shape[1] == IDS.shape[1] + 3
    # a keyword still wins over the config, as in transformers
    assert hf.generate(model, IDS, generation_config=config, max_new_tokens=5).shape[1] == IDS.shape[1] + 5


@pytest.mark.parametrize("name, value", [("no_repeat_ngram_size", 2), ("num_beams", 3), ("suppress_tokens", [48]),
                                         ("forced_eos_token_id", 3)])
def test_unsupported_settings_of_model_generation_config_are_refused_not_dropped(model, name, value):
    old = getattr(model.generation_config, name)
    setattr(model.generation_config, name, value)
    try:
        with pytest.raises(ValueError) as exc:
            hf.generate(model, IDS, max_new_tokens=4)
    finally:
        setattr(model.generation_config, name, old)
    text = str(exc.value)
    assert f"model.generation_config.{name} is {value!r}" in text and "\n" not in text
    assert isinstance(exc.value, UserError)


def test_a_neutral_keyword_overrides_an_unsupported_config_setting(model):
    model.generation_config.no_repeat_ngram_size = 2
    try:
        ours = hf.generate(model, IDS, max_new_tokens=6, no_repeat_ngram_size=0)
    finally:
        model.generation_config.no_repeat_ngram_size = None
    assert ours.tolist() == model.generate(IDS, max_new_tokens=6, do_sample=False).tolist()


def test_an_unsupported_setting_in_a_passed_generation_config_is_named(model):
    with pytest.raises(ValueError, match=r"^generation_config.num_beams is 4, .*pass num_beams=1"):
        hf.generate(model, IDS, generation_config=GenerationConfig(num_beams=4))
    with pytest.raises(TypeError, match="generation_config must be a transformers GenerationConfig, got dict"):
        hf.generate(model, IDS, generation_config={"max_new_tokens": 3})


@pytest.mark.parametrize("kwargs, message", [
    ({"eos_token_id": [2, "3"]}, "eos_token_id must be a token id"),
    ({"pad_token_id": [2, 3]}, "pad_token_id must be one token id"),
    ({"eos_token_id": -5}, "eos_token_id must be a token id"),
    ({"max_matching_ngram_size": 0}, "max_matching_ngram_size must be an integer >= 1, got 0"),
    ({"prompt_lookup_num_tokens": True}, "prompt_lookup_num_tokens must be an integer >= 1, got True"),
    ({"seed": 1.5, "do_sample": True}, "seed must be an integer >= 0, got 1.5"),
    ({"attention_mask": [[1] * 10]}, r"attention_mask must be a tensor shaped as input_ids \(1, 10\), got list"),
    ({"input_ids": torch.tensor([[5, 6, 100]])}, r"token id 100, outside the model's vocabulary \(0..63\)"),
    ({"input_ids": IDS.float()}, "input_ids must be a 2-D LongTensor"),
])
def test_bad_values_are_one_line_value_errors(model, kwargs, message):
    ids = kwargs.pop("input_ids", IDS)
    with pytest.raises(ValueError, match=message) as exc:
        hf.generate(model, ids, max_new_tokens=3, **kwargs)
    assert isinstance(exc.value, UserError) and "\n" not in str(exc.value)


def test_a_one_element_eos_tensor_is_accepted(model):
    assert hf.generate(model, IDS, max_new_tokens=4, eos_token_id=torch.tensor([2])).tolist() == \
        model.generate(IDS, max_new_tokens=4, do_sample=False, eos_token_id=2).tolist()


def test_several_end_tokens_end_a_row_as_in_model_generate(model):
    """eos_token_id as a list (Llama 3's generation configs hold two): any of them ends a row,
    kept in the output and padded after, as model.generate does; the second one really ends
    a row here (its first greedy token), under prompt lookup and on a padded batch."""
    plain = model.generate(IDS, max_new_tokens=12, do_sample=False, eos_token_id=63, pad_token_id=0)
    stop = int(plain[0, IDS.shape[1] + 3])  # the fourth new token: the row must end there
    for eos in ([63, stop], torch.tensor([63, stop]), [stop, 63]):
        want = model.generate(IDS, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
        got = hf.generate(model, IDS, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
        assert got.tolist() == want.tolist()
        assert got[0, IDS.shape[1]:].tolist().index(stop) <= 3
    config = GenerationConfig(eos_token_id=[63, stop], max_new_tokens=12)
    assert hf.generate(model, IDS, generation_config=config, pad_token_id=0).tolist() == \
        model.generate(IDS, generation_config=config, do_sample=False, pad_token_id=0).tolist()


# A generation_config.json saved whole (transformers 4.x, to_json_file(use_diff=False)): every field
# at its default, token_healing, return_legacy_cache and generation_kwargs among them
SAVED_WHOLE = {
    "max_length": 20, "min_length": 0, "early_stopping": False, "do_sample": False, "num_beams": 1,
    "num_beam_groups": 1, "use_cache": True, "return_legacy_cache": True, "temperature": 1.0, "top_k": 50,
    "top_p": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
    "renormalize_logits": False, "remove_invalid_values": False, "token_healing": False, "num_return_sequences": 1,
    "output_attentions": False, "output_hidden_states": False, "output_scores": False,
    "return_dict_in_generate": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    "encoder_no_repeat_ngram_size": 0, "is_assistant": False, "num_assistant_tokens": 5,
    "num_assistant_tokens_schedule": "heuristic", "assistant_confidence_threshold": 0.4, "generation_kwargs": {},
    "_from_model_config": False, "transformers_version": "4.46.0",
}


def test_a_generation_config_saved_whole_is_honoured_not_refused(model):
    config = GenerationConfig.from_dict(dict(SAVED_WHOLE))
    assert hf.generate(model, IDS, generation_config=config).tolist() == \
        model.generate(IDS, generation_config=config).tolist()


@pytest.mark.parametrize("name, value, neutral", [("token_healing", True, False),
                                                  ("remove_invalid_values", True, False),
                                                  ("generation_kwargs", {"top_k": 3}, None)])
def test_a_config_only_setting_names_a_fix_that_works(model, name, value, neutral):
    """Settings generate takes no keyword for: the message says to set the config's field (a
    keyword would be refused), and doing so is accepted."""
    config = GenerationConfig.from_dict({name: value, "max_new_tokens": 3})
    with pytest.raises(ValueError, match=rf"generation_config.{name} is .*; set generation_config.{name} = "
                                         rf"{neutral!r}$"):
        hf.generate(model, IDS, generation_config=config)
    setattr(config, name, neutral)
    assert hf.generate(model, IDS, generation_config=config).shape[1] == IDS.shape[1] + 3
