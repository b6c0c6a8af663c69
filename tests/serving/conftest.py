"""The served model of the OpenAI-client tests: one LLM with prompt lookup (k=6) on the tiny
engine, its app on 127.0.0.1 and an ``openai`` client, each once per test module.

A module names what the server answers to with ``SERVED_NAMES`` (default ``"tiny"``)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    from promptlookup import LLM, NGramDecodingConfig

    with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=6)) as model:
        yield model


@pytest.fixture(scope="module")
def server(request, llm):
    from promptlookup.serving.openai_server import OpenAIServer
    from tests.serving.server_thread import ServerThread

    srv = ServerThread(OpenAIServer(llm, getattr(request.module, "SERVED_NAMES", "tiny")).app)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
