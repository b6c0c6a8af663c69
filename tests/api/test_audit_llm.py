"""The LLM API, audited as TensorRT-LLM's and vLLM's users call it: prompt dicts, prompts that do
not fit the engine named by the API's own parameters (``prompts[i]``, ``max_tokens``, never a
command-line flag), and arguments of the wrong type refused in one line before anything runs."""
from __future__ import annotations

import pytest

from promptlookup.api import LLM, NGramDecodingConfig, SamplingParams
from promptlookup.errors import UserError

SP = SamplingParams(max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(tiny_engine_dir, speculative_config=NGramDecodingConfig(max_draft_len=4)) as model:
        yield model


def test_prompt_dicts_equal_their_text_and_token_ids(llm):
    text = llm.generate("the cat the cat", SP)
    assert llm.generate({"prompt": "the cat the cat"}, SP).outputs[0].token_ids == text.outputs[0].token_ids
    outs = llm.generate([{"prompt_token_ids": text.prompt_token_ids}, {"prompt": "the cat the cat"}], SP)
    assert [o.prompt for o in outs] == [None, "the cat the cat"]
    assert all(o.outputs[0].token_ids == text.outputs[0].token_ids for o in outs)


@pytest.mark.parametrize("prompt, kind, message", [
    ({"prompt": "hi", "multi_modal_data": {}}, ValueError, "got keys multi_modal_data, prompt"),
    ({"prompt_token_ids": "hi"}, TypeError, r"prompts\['prompt_token_ids'\] must be a non-empty list of token ids"),
])
def test_bad_prompt_dicts_are_refused(llm, prompt, kind, message):
    with pytest.raises(kind, match=message):
        llm.generate(prompt, SP)


@pytest.mark.parametrize("prompts, params, message", [
    (["a", ""], SP, r"^prompts\[1\] has no tokens"),
    (["a", [1, 10**6]], SP, r"^prompts\[1\] has token id 1000000, outside the engine's vocabulary"),
    ("hello " * 2000, SP, r"^prompt has 2001 tokens, more than the engine's max_input_len 1024"),
    (["a", "b"], SamplingParams(max_tokens=1536), r"^prompts\[0\] \(1 token\) plus max_tokens=1536 exceeds .*"
                                                  r"pass max_tokens <= 1535$"),
])
def test_prompts_that_do_not_fit_name_the_prompt_and_max_tokens(llm, prompts, params, message):
    with pytest.raises(ValueError, match=message) as exc:
        llm.generate(prompts, params)
    assert isinstance(exc.value, UserError) and "--" not in str(exc.value)


def test_chat_names_the_conversation_that_does_not_fit(llm):
    with pytest.raises(ValueError, match=r"^messages\[1\] has \d+ tokens"):
        llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "x " * 2000}]], SP)


def test_generate_async_refuses_a_streaming_flag_that_is_not_a_bool(llm):
    with pytest.raises(TypeError, match="streaming must be True or False, got 'yes'"):
        llm.generate_async("a", SP, streaming="yes")


def test_a_missing_value_is_named_once():
    with pytest.raises(TypeError, match=r"max_tokens must be an integer >= 1, got None$"):
        SamplingParams(max_tokens=None)


def test_an_n_gram_cache_that_is_not_a_path_is_refused_by_the_config():
    with pytest.raises(UserError, match="static_cache must be a path to an n-gram cache file .*got int 5"):
        NGramDecodingConfig(static_cache=5)


def test_a_missing_tokenizer_folder_names_the_tokenizer_argument(tiny_engine_dir):
    with pytest.raises(UserError, match=r"^tokenizer='/nonexistent' is not a directory") as exc:
        LLM(tiny_engine_dir, tokenizer="/nonexistent")
    assert "--" not in str(exc.value)


def test_a_bad_device_is_named_by_the_argument_not_a_flag(tiny_engine_dir):
    from promptlookup.api import RuntimeConfig

    with pytest.raises(UserError, match=r"^device 'tpu' is not a device; use auto, cpu, cuda or cuda:N$"):
        LLM(tiny_engine_dir, device="tpu")
    with pytest.raises(UserError, match=r"^runtime_config.device 'npu' is not a device"):
        LLM(tiny_engine_dir, runtime_config=RuntimeConfig(device="npu"))
