"""Every OpenAI request field the server takes is honoured or refused (issue 23, findings
2-7 and 9), driven by the official openai client on 127.0.0.1: the penalties, logit_bias
and min_tokens equal run.py's decoding (decoding.generate) token for token under prompt
lookup, seed-less sampling differs per request, n choices, echo, content parts, refusals
with a param, 404 model_not_found, invalid Unicode as 400, stop strings counted as
finished, no cut multi-byte character, API field names in errors, the API key, the queue
limit and the body limit."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from promptlookup import SamplingParams  # noqa: E402
from promptlookup.decoding import generate  # noqa: E402
from promptlookup.engine.load import load_runner  # noqa: E402
from promptlookup.runtime.base import SamplingConfig  # noqa: E402
from promptlookup.serving.openai_server import OpenAIServer  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

MODEL = "tiny"
PROMPT = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3"
SERVED_NAMES = [MODEL, "tiny-alias"]


@pytest.fixture(scope="module")
def runner(tiny_engine_dir):
    return load_runner(tiny_engine_dir)


def plain(runner, llm, ids: list[int], max_tokens: int, **sampling) -> list[int]:
    """run.py's decoding (plain, no drafts) of one prompt: request id 0."""
    return generate(runner, [ids], max_new_tokens=max_tokens, end_id=llm.default_end_id,
                    sampling=SamplingConfig(**sampling))[0].output_ids


def raw_post(server, path: str, data: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    req = urllib.request.Request(server.url + path, data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), dict(exc.headers)


def idle_without_leaks(llm) -> bool:
    assert llm.scheduler.wait_idle(60)
    return llm.runner.blocks.num_in_use == 0


# ----------------------------------------------------------------------------- penalties, logit_bias
@pytest.mark.parametrize("field,value,config", [
    ("presence_penalty", 2.0, {"presence_penalty": 2.0}),
    ("frequency_penalty", 1.5, {"frequency_penalty": 1.5}),
    ("repetition_penalty", 1.8, {"repetition_penalty": 1.8}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_penalties_equal_run_py(client, llm, runner, field, value, config, stream):
    ids = llm.encode(PROMPT)[1]
    unpenalised = llm.decode(plain(runner, llm, ids, 16, temperature=0.0))
    expected = llm.decode(plain(runner, llm, ids, 16, temperature=0.0, **config))
    assert expected != unpenalised  # the penalty matters for this prompt
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=stream,
                                  **({field: value} if field != "repetition_penalty" else {"extra_body": {field: value}}))
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert text == expected


def test_seeded_sampling_with_penalty_and_logit_bias_equals_run_py(client, llm, runner):
    ids = llm.encode(PROMPT)[1]
    bias = {ids[0]: -100.0, ids[1]: 5.0}
    expected = llm.decode(plain(runner, llm, ids, 16, temperature=0.8, random_seed=11, presence_penalty=0.5,
                                logit_bias=tuple(sorted(bias.items()))))
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=11,
                                  presence_penalty=0.5, logit_bias={str(t): b for t, b in bias.items()})
    assert r.choices[0].text == expected
    api = llm.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0.8, seed=11, presence_penalty=0.5,
                                              logit_bias=bias))
    assert api.outputs[0].text == expected


def test_logit_bias_forces_and_bans(client, llm, runner):
    ids = llm.encode(PROMPT)[1]
    forced = ids[2]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0,
                                  logit_bias={str(forced): 100})
    assert r.choices[0].text == llm.decode([forced] * 6)
    first = plain(runner, llm, ids, 1, temperature=0.0)[0]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, logit_bias={str(first): -100})
    assert r.choices[0].text != llm.decode([first])


@pytest.mark.parametrize("kwargs,param", [
    (dict(presence_penalty=5), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(extra_body={"repetition_penalty": 0}), "repetition_penalty"),
    (dict(logit_bias={"abc": 1}), "logit_bias"),
    (dict(logit_bias={"5": 101}), "logit_bias"),
    (dict(logit_bias={"99999999": 1}), "logit_bias"),
    (dict(extra_body={"min_tokens": 99}), "min_tokens"),
    (dict(logprobs=21), "logprobs"),
    (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=2, echo=True), "logprobs"),
    (dict(extra_body={"top_logprobs": 2}), "top_logprobs"),
    (dict(suffix="x"), "suffix"),
    (dict(best_of=3), "best_of"),
    (dict(n=1000), "n"),
    (dict(seed=-1), "seed"),
    (dict(top_p=0), "top_p"),
    (dict(extra_body={"tools": [{"type": "function", "function": {"name": "f"}}]}), "tools"),
    (dict(extra_body={"response_format": {"type": "json_object"}}), "response_format"),
    (dict(extra_body={"store": True}), "store"),
    (dict(extra_body={"service_tier": 123}), "service_tier"),
    (dict(extra_body={"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
    (dict(extra_body={"max_completion_tokens": 4}), "max_completion_tokens"),  # a chat field
])
def test_out_of_range_and_unsupported_fields_are_400(client, llm, kwargs, param):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(**{"model": MODEL, "prompt": PROMPT, "max_tokens": 8, **kwargs})
    err = exc.value.response.json()["error"]
    assert exc.value.status_code == 400 and err["param"] == param and err["message"]
    assert idle_without_leaks(llm)


@pytest.mark.parametrize("kwargs,param", [
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    (dict(logprobs=True, top_logprobs=-1), "top_logprobs"),
    (dict(top_logprobs=3), "top_logprobs"),
    (dict(extra_body={"logprobs": 3}), "logprobs"),
    (dict(extra_body={"echo": True}), "echo"),
    # accepted and ignored before
    (dict(extra_body={"max_completion_tokens": 2}), "max_completion_tokens"),  # beside max_tokens=4
    (dict(stream_options={"include_usage": True}), "stream_options"),  # without stream
])
def test_unsupported_chat_fields_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       **kwargs)
    assert exc.value.response.json()["error"]["param"] == param


def test_response_format_text_is_the_default(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("stop", "length")


# ----------------------------------------------------------------------------- min_tokens
def test_min_tokens_holds_off_the_end_token(client, llm):
    ids = llm.encode(PROMPT)[1]
    eos = str(llm.default_end_id)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, logit_bias={eos: 100})
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, logit_bias={eos: 100},
                                      stream=stream, stream_options={"include_usage": True} if stream else None,
                                      extra_body={"min_tokens": 5})
        chunks = list(r) if stream else [r]
        usage = chunks[-1].usage
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert usage.completion_tokens == 6 and finishes == ["stop"]  # 5 tokens, then the end token


def test_min_tokens_holds_off_stop_strings(client, llm, runner):
    ids = llm.encode(PROMPT)[1]
    out = plain(runner, llm, ids, 16, temperature=0.0)
    stop = llm.decode(out[:1]).strip() or llm.decode(out[:2]).strip()
    early = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0, stop=[stop])
    assert early.usage.completion_tokens <= 2
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0, stop=[stop],
                                  extra_body={"min_tokens": 6})
    assert r.usage.completion_tokens >= 6
    assert llm.decode(out).startswith(r.choices[0].text) and len(r.choices[0].text) > len(early.choices[0].text)


# ----------------------------------------------------------------------------- seeds and n
def test_unseeded_sampling_differs_per_request(client):
    for seed in ({}, {"seed": None}):
        texts = {client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=1.0,
                                           **seed).choices[0].text for _ in range(3)}
        assert len(texts) > 1


def test_unseeded_repeated_prompts_in_one_request_are_sampled_independently(client):
    """The same prompt listed several times without a seed: each is sampled as its own
    request would be (they all drew prompt 0's request ids: identical texts)."""
    r = client.completions.create(model=MODEL, prompt=[PROMPT] * 3, max_tokens=24, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1


def test_seeded_sampling_is_reproducible_and_equals_run_py(client, llm, runner):
    ids = llm.encode(PROMPT)[1]
    expected = llm.decode(plain(runner, llm, ids, 20, temperature=1.0, random_seed=5))
    texts = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=1.0,
                                       seed=5).choices[0].text for _ in range(2)]
    assert texts == [expected, expected]


def test_n_choices_each_reproducible(client, llm):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=3, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    assert len(set(texts)) > 1
    total = 0
    for i, text in enumerate(texts):  # choice i is request id i with the request's seed
        out = llm.generate_async(PROMPT, SamplingParams(max_tokens=16, temperature=1.0, seed=3), request_id=i).result()
        assert out.outputs[0].text == text
        total += len(out.outputs[0].token_ids)
    assert r.usage.completion_tokens == total and r.usage.prompt_tokens == len(llm.encode(PROMPT)[1])
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=3, n=3,
                                           stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == texts
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], n=2,
                                          max_tokens=8, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content == chat.choices[1].message.content
    assert idle_without_leaks(llm)


@pytest.mark.parametrize("stream", [False, True])
def test_several_prompts_in_one_request(client, llm, server, stream):
    """A list of prompts (vLLM's batch form): n choices of each, choice j of prompt i at
    index i * n + j, each what the prompt alone gives; usage counts each prompt once."""
    other = "a b c a b c a b"
    prompts = [PROMPT, llm.encode(other)[1]]  # a string and token ids
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=1.0, seed=4, n=2)
               for p in (PROMPT, other)]
    alone = [[c.text for c in single.choices] for single in singles]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=12, temperature=1.0, seed=4, n=2,
                                  stream=stream, echo=True, **({"stream_options": {"include_usage": True}} if stream else {}))
    texts: dict[int, str] = {}
    usage = None
    for chunk in (r if stream else [r]):
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {0: PROMPT + alone[0][0], 1: PROMPT + alone[0][1], 2: other + alone[1][0], 3: other + alone[1][1]}
    assert usage.prompt_tokens == len(llm.encode(PROMPT)[1]) + len(prompts[1])
    assert usage.completion_tokens == sum(single.usage.completion_tokens for single in singles)
    status, body, _ = raw_post(server, "/v1/completions", json.dumps(
        {"prompt": [PROMPT] * 40, "n": 3, "max_tokens": 2}).encode())  # 120 choices: more than an idle server holds
    assert status == 400 and body["error"]["param"] == "prompt" and "120 choices" in body["error"]["message"]
    assert idle_without_leaks(llm)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_token_ids_end_a_choice(client, llm, server, stream):
    """vLLM's stop_token_ids: the choice ends after the first one, as SamplingParams(stop_token_ids)."""
    free = llm.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True)).outputs[0].token_ids
    stop = free[4]
    want = llm.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[stop])).outputs[0]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=stream,
                                  extra_body={"stop_token_ids": [stop], "ignore_eos": True})
    chunks = list(r) if stream else [r]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert [c.choices[0].stop_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [stop]  # vLLM's
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[want.text[-2:]],
                                        extra_body={"ignore_eos": True}) if want.text[-2:].strip() else None
    assert stopped is None or stopped.choices[0].stop_reason == want.text[-2:]
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0).choices[0].stop_reason is None
    for bad in ([-1], [10**7], "5", [True]):
        status, body, _ = raw_post(server, "/v1/completions", json.dumps(
            {"prompt": PROMPT, "stop_token_ids": bad}).encode())
        assert status == 400 and body["error"]["param"] == "stop_token_ids", bad


# ----------------------------------------------------------------------------- echo, content parts
@pytest.mark.parametrize("stream", [False, True])
def test_echo_prepends_the_prompt(client, stream):
    plain_r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, echo=True, stream=stream)
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert text == PROMPT + plain_r.choices[0].text


def test_content_parts_and_null_assistant_content(client):
    def ask(messages):
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                              temperature=0).choices[0].message.content

    as_string = ask([{"role": "user", "content": "hello\nthere"}])  # parts join with newlines, as vLLM's
    assert ask([{"role": "user", "content": [{"type": "text", "text": "hello"},
                                             {"type": "text", "text": "there"}]}]) == as_string
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
               {"role": "user", "content": "again"}]
    assert isinstance(ask(history), str)
    with pytest.raises(openai.BadRequestError) as exc:
        ask([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    assert exc.value.response.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError):
        ask([{"role": "user", "content": None}])


# ----------------------------------------------------------------------------- model, unicode, errors
def test_unknown_model_is_404_and_aliases_are_accepted(client, server):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert exc.value.response.json()["error"]["code"] == "model_not_found"
    assert client.completions.create(model="tiny-alias", prompt=PROMPT, max_tokens=2).model == MODEL
    status, body, _ = raw_post(server, "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode())
    assert status == 200 and body["model"] == MODEL  # an absent model is the served one (as trtllm-serve)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", '{"prompt": "a \\ud800 b", "max_tokens": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}'),
    ("/v1/completions", '{"prompt": "a", "stop": ["\\ud800"], "max_tokens": 2}'),
])
def test_lone_surrogates_are_400(server, path, body):
    status, payload, _ = raw_post(server, path, body.encode())
    assert status == 400 and payload["error"]["code"] == "invalid_unicode"


def test_lone_surrogate_in_an_echoed_value_is_no_500(server):
    status, payload, _ = raw_post(server, "/v1/completions", b'{"model": "\\udc80", "prompt": "a"}')
    assert status == 404 and payload["error"]["code"] == "model_not_found"


def test_context_errors_speak_api_field_names(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="the cat sat on the mat " * 10, max_tokens=1500)
    err = exc.value.response.json()["error"]
    assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert "max_tokens" in err["message"] and "--" not in err["message"]


def test_stop_string_finish_counts_as_finished(client, llm, runner):
    ids = llm.encode(PROMPT)[1]
    text = llm.decode(plain(runner, llm, ids, 12, temperature=0.0))
    stop = text.strip()[:2]
    stats = llm.scheduler.stats
    assert idle_without_leaks(llm)
    finished, cancelled = stats.requests_finished, stats.requests_cancelled
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 12
    assert idle_without_leaks(llm)
    assert (stats.requests_finished, stats.requests_cancelled) == (finished + 1, cancelled)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_never_cuts_a_character(client, llm, stream):
    pieces = llm.encode("🌐")[1]
    assert len(pieces) > 1 and "\ufffd" in llm.decode(pieces[:1])  # an emoji of several byte tokens
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, stream=stream,
                                  logit_bias={str(pieces[0]): 100}, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
    assert "\ufffd" not in text


# ----------------------------------------------------------------------------- key, queue, body
def test_api_key(llm):
    srv = ServerThread(OpenAIServer(llm, MODEL, api_key="s3cret").app)
    try:
        wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
        assert right.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices
        with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:  # health and metrics stay open
            assert r.status == 200
    finally:
        srv.stop()


def test_queue_limit_is_429_when_busy_and_n_beyond_an_idle_server_is_400(llm, monkeypatch):
    """429 (retry later) only where waiting requests fill the queue; a request whose own ``n``
    exceeds what an idle server holds (max_batch_size running + the queue) is a 400 naming n."""
    from promptlookup.decoding.scheduler import SchedulerStats

    srv = ServerThread(OpenAIServer(llm, MODEL, max_waiting_requests=1).app)
    batch = llm.limits.max_batch_size
    try:
        def post(n: int) -> tuple[int, dict, dict]:
            return raw_post(srv, "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2, "n": n}).encode())

        status, body, _ = post(batch + 2)  # idle, and still one more than the queue takes
        assert status == 400 and body["error"]["param"] == "n" and body["error"]["code"] == "invalid_value"
        assert f"at most {batch + 1}" in body["error"]["message"]
        status, _, _ = post(batch + 1)  # one waits: fits the queue
        assert status == 200
        assert idle_without_leaks(llm)
        monkeypatch.setattr(llm.scheduler, "stats", SchedulerStats(live=batch, waiting=1))  # a full batch, one waiting
        status, body, headers = post(1)
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and headers.get("retry-after")
        monkeypatch.undo()
        assert post(1)[0] == 200
    finally:
        srv.stop()
    assert idle_without_leaks(llm)


def test_chat_without_max_tokens_may_use_the_rest_of_the_context(llm):
    """vLLM's default for chat: max_tokens is the rest of the context (16 stays the completions'
    default); the reply ends at the end token or the context, not after 16 tokens."""
    server = OpenAIServer(llm, MODEL)
    body = {"messages": [{"role": "user", "content": "1, 2, 3"}]}
    prepared = server._prepare(json.dumps(body).encode(), chat=True)
    (ids,) = prepared.prompt_ids
    room = min(llm.limits.max_seq_len - len(ids), llm.scheduler.kv_room(len(ids)))
    assert prepared.sampling.params.max_tokens == room > 16
    prepared = server._prepare(json.dumps({"prompt": PROMPT}).encode(), chat=False)
    assert prepared.sampling.params.max_tokens == 16


@pytest.mark.parametrize("value", ["no", 1, None, {}])
def test_include_usage_must_be_a_boolean(client, value):
    if value is None:  # null: the default (no usage chunk)
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
                                                stream_options={"include_usage": value}))
        assert all(c.usage is None for c in chunks)
        return
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, stream=True,
                                  stream_options={"include_usage": value})
    assert exc.value.response.json()["error"]["code"] == "invalid_type"


def test_oversized_body_is_413_before_parsing(llm):
    srv = ServerThread(OpenAIServer(llm, MODEL, max_request_bytes=2000).app)
    try:
        status, body, _ = raw_post(srv, "/v1/completions", json.dumps({"prompt": "x" * 5000}).encode())
        assert status == 413 and body["error"]["code"] == "request_too_large"
        status, _, _ = raw_post(srv, "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode())
        assert status == 200
    finally:
        srv.stop()


def test_tokenizing_does_not_stall_other_requests(llm, monkeypatch):
    """A stream runs to its end while another request is held inside tokenization (on the
    worker thread, not the event loop)."""
    server = OpenAIServer(llm, MODEL)
    entered, release = threading.Event(), threading.Event()
    prepare = server._prepare

    def slow_prepare(raw: bytes, chat: bool):
        if b"HOLD" in raw:
            entered.set()
            assert release.wait(120)
        return prepare(raw, chat)

    monkeypatch.setattr(server, "_prepare", slow_prepare)
    srv = ServerThread(server.app)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
        stream = iter(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}))
        next(stream)
        held: list = []
        t = threading.Thread(target=lambda: held.append(raw_post(srv, "/v1/completions", json.dumps(
            {"prompt": "HOLD " + PROMPT, "max_tokens": 2}).encode())))
        t.start()
        assert entered.wait(60)
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "length"  # streamed to the end while the other is held
        assert not held
        release.set()
        t.join(60)
        assert held and held[0][0] == 200
    finally:
        release.set()
        srv.stop()


# ----------------------------------------------------------------------------- unknown fields
@pytest.mark.parametrize("chat,extra,param", [
    (False, {"temprature": 0.5}, "temprature"),
    (False, {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    (True, {"prompt": "hi"}, "prompt"),
    (True, {"add_generation_prompt": False}, "add_generation_prompt"),
])
def test_unknown_fields_are_400_naming_them(client, llm, chat, extra, param):
    with pytest.raises(openai.BadRequestError) as exc:
        if chat:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           extra_body=extra)
        else:
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body=extra)
    err = exc.value.response.json()["error"]
    assert err["param"] == param and err["code"] == "unknown_field" and param in err["message"]
    assert idle_without_leaks(llm)


def test_ignore_unknown_fields_accepts_them_and_logs_each_once(llm, capfd):
    from promptlookup.serving.openai_server import OpenAIServer
    from tests.serving.server_thread import ServerThread

    srv = ServerThread(OpenAIServer(llm, MODEL, ignore_unknown_fields=True).app)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        for _ in range(2):
            r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                     extra_body={"temprature": 0.5})
            assert r.choices[0].text is not None
    finally:
        srv.stop()
    assert capfd.readouterr().err.count("'temprature'") == 1


def test_a_message_keeps_its_name_and_refuses_keys_nothing_reads(client):
    said = [{"role": "user", "content": "hi", "name": "zed"}]
    r = client.chat.completions.create(model=MODEL, messages=said, max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    for extra, why in (({"foo": "bar"}, "unknown key 'foo'"), ({"tool_call_id": "x"}, "tool calling is not supported")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi", **extra}],
                                           max_tokens=2)
        assert why in exc.value.response.json()["error"]["message"]
