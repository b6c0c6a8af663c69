"""The server's ``n`` (issue 23): the choices of one prompt share its cached prefix, so
``/metrics`` shows the prompt's whole blocks computed once; greedy choices are all the
plain single request's text. Driven by the official openai client on 127.0.0.1."""
from __future__ import annotations

import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from promptlookup import LLM, NGramDecodingConfig  # noqa: E402
from promptlookup.serving.openai_server import OpenAIServer  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

PROMPTS = {False: "The quick brown fox jumps over the lazy dog. " * 6, True: "Pack my box with five dozen jugs. " * 7}


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=6)) as model:
        yield model


@pytest.fixture(scope="module")
def server(llm):
    srv = ServerThread(OpenAIServer(llm, ["tiny"]).app)
    yield srv
    srv.stop()


def prompt_tokens(server) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "# TYPE promptlookup_prompt_tokens_total counter" in text
    return {line.split("{")[1].split("}")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("promptlookup_prompt_tokens_total{")}


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_share_the_prompt_blocks(server, llm, stream):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = PROMPTS[stream]  # not cached yet: the first choice computes it
    n, length = 4, len(llm.encode(prompt)[1])
    block = llm.runner.pool.block_size
    assert length > 2 * block
    before = prompt_tokens(server)
    texts: dict[int, str] = {}
    if stream:
        for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, n=n,
                                               stream=True):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
    else:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, n=n)
        texts = {c.index: c.text for c in r.choices}
    after = prompt_tokens(server)
    computed = after['source="computed"'] - before['source="computed"']
    reused = after['source="reused"'] - before['source="reused"']
    assert computed + reused == n * length
    # the prompt's whole blocks are computed once; each later choice at most its last block
    assert reused >= (n - 1) * ((length - 1) // block * block) and computed <= length + (n - 1) * block
    single = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
    assert [texts[i] for i in range(n)] == [single] * n
    assert llm.scheduler.wait_idle(60) and llm.runner.blocks.num_in_use == 0
