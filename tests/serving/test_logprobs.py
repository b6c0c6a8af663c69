"""``logprobs`` / ``top_logprobs`` through the server (issue 23, finding 10), driven by the
official openai client on 127.0.0.1: completions' legacy shape and chat's shape, streamed
and not, the values equal to plain decoding's (decoding.generate without drafts, as run.py
decodes) while the server runs prompt lookup, cut with a stop string, and out-of-range
values refused with a param.

Values are compared with a tight tolerance (TOL): on the CPU the attention of a
verification pass is not bitwise row-invariant (tests/decoding/test_logprobs.py); token ids
and the order of alternatives are compared exactly.
"""
from __future__ import annotations

import math

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from promptlookup.decoding import generate  # noqa: E402
from promptlookup.engine.load import load_runner  # noqa: E402
from promptlookup.runtime.base import SamplingConfig  # noqa: E402
from promptlookup.serving.logprob_format import TokenTexts  # noqa: E402

MODEL = "tiny"
PROMPT = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3"
MAX_TOKENS = 24
TOL = 1e-5


@pytest.fixture(scope="module")
def reference(tiny_engine_dir, llm):
    """Plain decoding's tokens and log-probabilities (top 20) for a prompt's ids."""
    runner = load_runner(tiny_engine_dir)

    def plain(ids: list[int], max_tokens: int = MAX_TOKENS):
        r = generate(runner, [ids], max_new_tokens=max_tokens, end_id=llm.default_end_id,
                     sampling=SamplingConfig(logprobs=20))[0]
        return r.output_ids, r.token_logprobs

    return plain


def test_completions_legacy_shape_equals_plain_decoding(client, llm, reference):
    ids = llm.encode(PROMPT)[1]
    want_ids, want = reference(ids)
    texts = TokenTexts(llm.tokenizer)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.usage.completion_tokens == len(want_ids) == len(lp.tokens) == len(lp.token_logprobs)
    assert r.usage.prompt_lookup["accepted"] > 0  # the server really speculated
    assert lp.tokens == [texts.get(t)[1] for t in want_ids]
    for j, e in enumerate(want):
        assert lp.token_logprobs[j] == pytest.approx(e.logprob, abs=TOL)
        top = lp.top_logprobs[j]
        expected = {texts.get(t)[1]: v for t, v in e.top[:3]}
        expected.setdefault(texts.get(e.token)[1], e.logprob)
        assert list(top) == list(expected) and list(top.values()) == pytest.approx(list(expected.values()), abs=TOL)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= len(r.choices[0].text)


def test_completions_streamed_chunks_concatenate_to_the_whole(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                      logprobs=2).choices[0].logprobs
    tokens, values, tops, offsets = [], [], [], []
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                           logprobs=2, stream=True):
        lp = chunk.choices[0].logprobs if chunk.choices else None
        if lp is not None:
            tokens += lp.tokens
            values += lp.token_logprobs
            tops += lp.top_logprobs
            offsets += lp.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset
    assert values == pytest.approx(whole.token_logprobs, abs=TOL)
    assert [list(t) for t in tops] == [list(t) for t in whole.top_logprobs]


def test_logprobs_zero_gives_the_chosen_token_only(client):
    lp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                   logprobs=0).choices[0].logprobs
    assert all(list(top) == [tok] for top, tok in zip(lp.top_logprobs, lp.tokens))
    assert all(v <= 0 and math.isfinite(v) for v in lp.token_logprobs)


def test_without_logprobs_the_field_is_null(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_chat_shape_equals_plain_decoding(client, llm, reference, stream):
    from promptlookup.text import chat_ids

    messages = [{"role": "user", "content": PROMPT}]
    want_ids, want = reference(chat_ids(llm.tokenizer, messages))
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                       logprobs=True, top_logprobs=2, stream=stream)
    if stream:
        content = [e for c in r if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    else:
        content = r.choices[0].logprobs.content
    texts = TokenTexts(llm.tokenizer)
    assert len(content) == len(want_ids)
    for got, e in zip(content, want):
        raw, text = texts.get(e.token)
        assert got.token == text and bytes(got.bytes) == raw
        assert got.logprob == pytest.approx(e.logprob, abs=TOL)
        assert [t.token for t in got.top_logprobs] == [texts.get(t)[1] for t, _ in e.top[:2]]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([v for _, v in e.top[:2]], abs=TOL)


def test_chat_logprobs_without_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, logprobs=True)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(e.top_logprobs == [] for e in content)


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(client, llm):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
    text = full.choices[0].text
    stop = text[len(text) // 2:][:3]
    assert stop.strip()
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=1,
                                      stop=[stop], stream=stream,
                                      stream_options={"include_usage": True} if stream else None)
        if stream:
            chunks = list(r)
            tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
            used = chunks[-1].usage.completion_tokens
        else:
            tokens, used = r.choices[0].logprobs.tokens, r.usage.completion_tokens
        assert len(tokens) == used < full.usage.completion_tokens
        assert tokens == full.choices[0].logprobs.tokens[:used]


def test_the_llm_api_reports_vllms_shape(llm, reference):
    from promptlookup import SamplingParams

    ids = llm.encode(PROMPT)[1]
    want_ids, want = reference(ids)
    c = llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, logprobs=2)).outputs[0]
    assert c.token_ids == want_ids and len(c.logprobs) == len(want_ids)
    for got, e in zip(c.logprobs, want):
        expected = {e.token: e.logprob, **dict(e.top[:2])}
        assert list(got) == list(expected)
        assert [v.logprob for v in got.values()] == pytest.approx(list(expected.values()), abs=TOL)
    assert llm.generate(PROMPT, SamplingParams(max_tokens=4)).outputs[0].logprobs is None
