"""serve.py's app on 127.0.0.1, driven by the official openai client: completions and chat,
streaming and not, greedy output equal to decoding.generate's, concurrency, cancellation
without leaked KV blocks, and every bad request answered 400 in OpenAI's error shape."""
from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from promptlookup.decoding import generate  # noqa: E402
from promptlookup.engine.load import load_runner  # noqa: E402

PROMPTS = ["one two three four one two three four one two three", "a b a b a b a b", "hello world",
           "the cat sat on the mat. the cat sat on", "1 2 3 1 2 3 1 2", "x"]
MODEL = "tiny"


@pytest.fixture(scope="module")
def reference(tiny_engine_dir, llm):
    """Plain greedy decoding (decoding.generate, as run.py) of token-id prompts, on its own runner."""
    runner = load_runner(tiny_engine_dir)

    def run(ids: list[int], max_tokens: int) -> list[int]:
        return generate(runner, [ids], max_new_tokens=max_tokens, end_id=llm.default_end_id)[0].output_ids
    return run


def no_leaks(llm) -> bool:
    assert llm.scheduler.wait_idle(60)
    return all(c == 0 for c in llm.runner.blocks.refcount)


def test_models_health_metrics(server, client, llm):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        assert r.status == 200 and json.load(r)["status"] == "ok"
    client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "# TYPE promptlookup_acceptance_rate gauge" in text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if not line.startswith("#")}
    assert values["promptlookup_generated_tokens_total"] >= 8
    assert values['promptlookup_requests_total{state="finished"}'] >= 1
    assert 0 <= values["promptlookup_accepted_draft_tokens_total"] <= values["promptlookup_draft_tokens_total"]


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_completion_equals_plain_greedy(client, llm, reference, prompt):
    ids = llm.encode(prompt)[1]
    expected = reference(ids, 24)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == llm.decode(expected)
    assert r.usage.completion_tokens == len(expected) and r.usage.prompt_tokens == len(ids)
    counters = r.usage.model_extra["prompt_lookup"]  # the vocabulary of every result type
    assert set(counters) == {"drafted", "accepted", "steps"} and 0 <= counters["accepted"] <= counters["drafted"]
    assert r.choices[0].finish_reason == ("stop" if expected[-1] == llm.default_end_id else "length")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0)
    assert by_ids.choices[0].text == r.choices[0].text


def test_streaming_completion_equals_non_streaming(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_streaming_and_not(client, llm, reference):
    messages = [{"role": "user", "content": PROMPTS[3]}]
    ids = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = llm.decode(reference(ids, 20))
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == expected
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[0].choices[0].delta.role == "assistant"


def test_concurrent_requests_each_equal_their_single_run(client, llm, reference):
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            stream = i % 2 == 1
            r = client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=20 + i, temperature=0,
                                          stream=stream)
            results[i] = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(results) == len(PROMPTS)
    for i, p in enumerate(PROMPTS):
        assert results[i] == llm.decode(reference(llm.encode(p)[1], 20 + i)), i
    assert no_leaks(llm)


def test_streaming_disconnect_cancels_and_frees_blocks(client, llm):
    before = llm.scheduler.stats.requests_cancelled
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=1200, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        got += len(chunk.choices[0].text) > 0
        if got >= 2:
            break
    stream.close()
    assert no_leaks(llm)
    assert llm.scheduler.stats.requests_cancelled == before + 1


def test_non_streaming_disconnect_cancels_and_frees_blocks(server, llm):
    before = llm.scheduler.stats.requests_cancelled
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 1200, "ignore_eos": True}).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        with llm.scheduler._lock:  # wait (bounded) until the request is live
            assert llm.scheduler._lock.wait_for(lambda: llm.scheduler.stats.live > 0, 60)
    assert no_leaks(llm)
    assert llm.scheduler.stats.requests_cancelled == before + 1


def raw_post(server, path: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_bad_json_is_400(server, path, data):
    status, body = raw_post(server, path, data)
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


@pytest.mark.parametrize("kwargs,param", [
    (dict(max_tokens="ten"), "max_tokens"),
    (dict(temperature="hot"), "temperature"),
    (dict(extra_body={"top_k": 1.5}), "top_k"),
    (dict(stream="yes"), "stream"),
    (dict(n=0), "n"),
    (dict(max_tokens=100000), "max_tokens"),
    (dict(max_tokens=1500), "max_tokens"),  # fits max_seq_len alone, not with the prompt
    (dict(prompt=[5] * 1100), "prompt"),  # over max_input_len (1024)
    (dict(prompt=["a", ""]), "prompt"),  # one empty prompt of several
    (dict(prompt=[[1, 2], []]), "prompt"),
    (dict(prompt=["a", [5] * 1100]), "prompt"),  # the second over max_input_len
    (dict(prompt=["a", 3]), "prompt"),
    (dict(prompt=3), "prompt"),
    (dict(temperature=5), "temperature"),
])
def test_bad_requests_are_400_in_openai_shape(client, llm, kwargs, param):
    args = dict(model=MODEL, prompt="the cat sat on the mat " * 10, max_tokens=8)
    args.update(kwargs)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(**args)
    assert exc.value.status_code == 400
    err = exc.value.response.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert no_leaks(llm)


@pytest.mark.parametrize("messages", [[], [{"role": "user"}], "hi"])
def test_bad_chat_messages_are_400(client, messages):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert exc.value.response.json()["error"]["param"] == "messages"
