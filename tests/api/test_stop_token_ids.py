"""stop_token_ids (vLLM's and TensorRT-LLM's SamplingParams field, and the server's): more end
tokens. A request ends after the first one it produces, which stays in its token ids; under
prompt lookup the output equals plain decoding's cut at that token (the tokens a step
accepted past it are dropped); min_tokens holds them back as it holds back the end token."""
from __future__ import annotations

import pytest

from promptlookup import LLM, NGramDecodingConfig, SamplingParams
from promptlookup.decoding import generate
from promptlookup.engine.load import load_runner
from promptlookup.runtime.base import SamplingConfig

PROMPT = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3"


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(tiny_engine_dir, speculative_config=NGramDecodingConfig(max_draft_len=4)) as model:
        yield model


def plain_ids(llm, max_tokens=16, **kw):
    return llm.generate(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw)).outputs[0].token_ids


def test_a_stop_token_ends_the_request_and_stays_in_its_output(llm):
    plain = plain_ids(llm)
    stop = plain[5]
    first = plain.index(stop)  # the token may come earlier too
    out = llm.generate(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=[stop])).outputs[0]
    assert out.token_ids == plain[: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_min_tokens_holds_stop_tokens_back(llm):
    plain = plain_ids(llm)
    stop = plain[0]
    out = llm.generate(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=[stop],
                                              min_tokens=4)).outputs[0]
    assert stop not in out.token_ids[:3]
    assert out.finish_reason == "length" or out.token_ids[-1] == stop


def test_runtime_loops_cut_at_a_stop_token_as_plain_decoding(tiny_engine_dir, llm):
    """decoding.generate (run.py's loops): V1 and V2 with drafts equal plain decoding, each
    ended at its first stop token."""
    from promptlookup.drafting.base import DraftConfig

    runner = load_runner(tiny_engine_dir)
    ids = llm.encode(PROMPT)[1]
    free = generate(runner, [ids], max_new_tokens=16, end_id=10**6)[0].output_ids
    stop = free[6]
    sampling = SamplingConfig(stop_token_ids=(stop,))
    want = free[: free.index(stop) + 1]
    for workflow in ("v1", "v2"):
        for draft in (None, DraftConfig(prompt_lookup_num_tokens=4)):
            out = generate(runner, [ids], max_new_tokens=16, end_id=10**6, sampling=sampling, draft=draft,
                           workflow=workflow)[0]
            assert out.output_ids == want and out.finished, (workflow, draft)


@pytest.mark.parametrize("value, kind, message", [
    ("3", TypeError, "stop_token_ids must be a list of token ids, got str"),
    ([True], TypeError, "stop_token_ids must be an integer >= 0"),
    ([-1], ValueError, "stop_token_ids must be an integer >= 0, got -1"),
])
def test_bad_stop_token_ids_are_refused(value, kind, message):
    with pytest.raises(kind, match=message):
        SamplingParams(stop_token_ids=value)


def test_a_stop_token_outside_the_vocabulary_is_refused(llm):
    with pytest.raises(ValueError, match="stop_token_ids has token id 100000, outside the engine's vocabulary"):
        llm.generate(PROMPT, SamplingParams(stop_token_ids=[100000]))


def test_the_stop_tokens_text_is_left_out_of_the_text(llm):
    """vLLM's: the stop token stays in token_ids, but its text is not added to the output's
    text (as the end token's is not; include_stop_str_in_output is refused), streamed or not."""
    plain = plain_ids(llm)
    stop = next(t for t in plain[2:] if llm.decode([t]).strip())  # a token with visible text
    want_ids = plain[: plain.index(stop) + 1]
    params = SamplingParams(max_tokens=16, ignore_eos=True, stop_token_ids=[stop])
    out = llm.generate(PROMPT, params).outputs[0]
    assert out.token_ids == want_ids and out.text == llm.decode(want_ids[:-1])
    streamed = "".join(o.outputs[0].text_diff for o in llm.generate_async(PROMPT, params, streaming=True))
    assert streamed == out.text


def test_a_stop_token_that_is_the_end_token_has_no_stop_reason(llm):
    """vLLM's: the end token ends a request as the end token (stop_reason None) even when
    stop_token_ids lists it; with ignore_eos it is a stop token like any other."""
    plain = plain_ids(llm)
    stop = plain[3]
    for ends, reason in (({"end_id": stop}, None), ({"ignore_eos": True}, stop)):
        out = llm.generate(PROMPT, SamplingParams(max_tokens=16, stop_token_ids=[stop], **ends)).outputs[0]
        assert out.token_ids == plain[: plain.index(stop) + 1]
        assert (out.finish_reason, out.stop_reason) == ("stop", reason), ends
