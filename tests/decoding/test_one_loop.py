"""One loop: the LLM API, serve.py's app, run.py and decoding.generate give the same tokens
and the same drafted/accepted counts for the same prompt and settings, with each entry
point's default options (greedy and seeded sampling), on the tiny engine."""
from __future__ import annotations

import asyncio
import json

import pytest

from promptlookup import LLM, NGramDecodingConfig, SamplingParams
from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.engine.load import load_runner
from promptlookup.runtime.base import SamplingConfig

PROMPT = "one two three four one two three four one two three four one"
K, N, MAX_TOKENS = 6, 2, 24
SETTINGS = [dict(temperature=0.0, top_k=0, seed=0), dict(temperature=0.7, top_k=2, seed=7)]


def via_generate(engine, ids, end_id, s):
    runner = load_runner(engine)
    r = generate(runner, [ids], max_new_tokens=MAX_TOKENS, end_id=end_id,
                 sampling=SamplingConfig(s["temperature"], s["top_k"], 1.0, s["seed"]),
                 draft=DraftConfig(prompt_lookup_num_tokens=K, max_matching_ngram_size=N))[0]
    return r.output_ids, r.drafted, r.accepted


def via_llm(engine, s):
    with LLM(str(engine), speculative_config=NGramDecodingConfig(max_draft_len=K, max_matching_ngram_size=N)) as llm:
        c = llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, **s)).outputs[0]
        return (c.token_ids, c.drafted, c.accepted), c.text, llm.encode(PROMPT)[1], llm.default_end_id


def via_run(engine, s, tmp_path):
    from promptlookup.cli.run import main

    out = tmp_path / "run.json"
    sampled = ["--top_k", str(s["top_k"]), "--random_seed", str(s["seed"])] if s["temperature"] > 0 else []
    assert main(["--engine_dir", str(engine), "--input_text", PROMPT, "--max_output_len", str(MAX_TOKENS),
                 "--prompt_lookup_config", f"[{K},{N},[0]]", "--temperature", str(s["temperature"]),
                 *sampled, "--output_json", str(out)]) == 0  # greedy refuses a seed (it would ignore it)
    seq = json.loads(out.read_text())["sequences"][0]
    return seq["output_ids"], seq["drafted"], seq["accepted"]


async def _post(app, path: str, body: dict) -> dict:
    """One request through the ASGI app, in process (no socket)."""
    sent = {"done": False}
    chunks: list[bytes] = []

    async def receive():
        if not sent["done"]:
            sent["done"] = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return json.loads(b"".join(chunks))


def via_serve(engine, s, ids):
    pytest.importorskip("starlette")
    from promptlookup.cli.serve import build_llm, parse_args
    from promptlookup.serving.openai_server import OpenAIServer

    llm = build_llm(parse_args(["--engine_dir", str(engine), "--prompt_lookup_config", f"[{K},{N},[0]]"]))
    try:
        body = {"model": "tiny", "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": s["temperature"],
                "top_k": s["top_k"], "seed": s["seed"]}
        reply = asyncio.run(_post(OpenAIServer(llm, "tiny").app, "/v1/completions", body))
        text = reply["choices"][0]["text"]
        usage = reply["usage"]["prompt_lookup"]
        # the server answers text: its tokens are the LLM's, whose text it is
        return text, usage["drafted"], usage["accepted"]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "seeded-sampling"])
def test_every_entry_point_runs_the_same_loop(tiny_engine_dir, tmp_path, settings):
    api, text, ids, end_id = via_llm(tiny_engine_dir, settings)
    want = via_generate(tiny_engine_dir, ids, end_id, settings)
    assert api == want
    assert via_run(tiny_engine_dir, settings, tmp_path) == want
    assert via_serve(tiny_engine_dir, settings, ids) == (text, want[1], want[2])
    assert want[1] > 0  # drafts were made, so the counts compare something
