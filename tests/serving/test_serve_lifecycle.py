"""serve.py's life cycle (issue 23, finding 8 and "Server under faults and load"): a busy
port is one line and exit 2 before it says it serves; SIGTERM and SIGINT drain alike,
end what is left with an error event, save the dynamic n-gram cache and exit 0 within a
bound; a second signal ends things at once; a draining server answers 503. Everything on
127.0.0.1; the only time limits are generous bounds."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from promptlookup import LLM  # noqa: E402
from promptlookup.serving.openai_server import OpenAIServer  # noqa: E402
from tests.serving.server_thread import ServerThread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BOUND = 120  # seconds: any single wait below


def start(args: list[str]) -> tuple[subprocess.Popen, int]:
    """serve.py on a free port of 127.0.0.1; returns the process and the port it printed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--host", "127.0.0.1", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(BOUND)
    assert lines and lines[0].startswith("serving "), (lines, proc.poll())
    return proc, int(lines[0].rsplit(":", 1)[1].split("/")[0])


def open_stream(port: int, max_tokens: int = 1400) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
    body = json.dumps({"prompt": "a b a b a b", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def events(resp: http.client.HTTPResponse) -> list[dict | str]:
    out: list[dict | str] = []
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data: "):
            out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def first_event(resp: http.client.HTTPResponse) -> dict:
    while True:
        line = resp.readline().decode().strip()
        if line.startswith("data: "):
            return json.loads(line[6:])


@pytest.mark.slow  # a serve.py process (imports torch afresh)
def test_busy_port_is_one_line_exit_2_before_serving(tiny_engine_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run([sys.executable, str(ROOT / "serve.py"), "--engine_dir", str(tiny_engine_dir),
                            "--host", "127.0.0.1", "--port", str(port)],
                           capture_output=True, text=True, env=env, timeout=BOUND)
    assert r.returncode == 2 and "serving" not in r.stdout
    assert r.stderr.count("\n") == 1 and "already in use" in r.stderr and "--port" in r.stderr


@pytest.mark.slow  # serve.py processes, ~15 s each here
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_in_flight_streams_with_an_error_saves_the_cache_and_exits_0(tiny_engine_dir, tmp_path, sig):
    cache = tmp_path / "dynamic.bin"
    proc, port = start(["--engine_dir", str(tiny_engine_dir), "--prompt_lookup_config", "[4,2]",
                        "--ngram_dynamic_cache", str(cache), "--shutdown_timeout", "0"])
    try:
        conn, resp = open_stream(port)
        first_event(resp)
        began = time.monotonic()
        proc.send_signal(sig)
        rest = events(resp)
        conn.close()
        assert proc.wait(BOUND) == 0
        assert time.monotonic() - began < BOUND
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [e for e in rest if isinstance(e, dict) and "error" in e]
    assert errors and errors[0]["error"]["code"] == "service_unavailable", rest[-3:]
    assert cache.is_file() and cache.stat().st_size > 0


@pytest.mark.slow
def test_second_signal_ends_requests_at_once(tiny_engine_dir):
    proc, port = start(["--engine_dir", str(tiny_engine_dir), "--shutdown_timeout", "600"])
    try:
        conn, resp = open_stream(port)
        first_event(resp)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:  # draining: /health says so
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
            c.request("GET", "/health")
            status = c.getresponse().status
            c.close()
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=BOUND)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2}),
                  {"Content-Type": "application/json"})
        refused = c.getresponse()
        assert refused.status == 503 and refused.getheader("Retry-After")
        c.close()
        proc.send_signal(signal.SIGINT)
        rest = events(resp)
        conn.close()
        assert proc.wait(BOUND) == 0  # far below the 600 s the first signal allowed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any(isinstance(e, dict) and e.get("error", {}).get("code") == "service_unavailable" for e in rest)


@pytest.fixture(scope="module")
def llm(tiny_engine_dir):
    with LLM(str(tiny_engine_dir)) as model:
        yield model


def test_draining_refuses_and_abort_ends_streamed_and_non_streamed_requests(llm):
    api = OpenAIServer(llm, "tiny")
    srv = ServerThread(api.app)
    try:
        conn, resp = open_stream(srv.port)
        first_event(resp)
        result: list = []

        def non_streamed() -> None:
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=BOUND)
            c.request("POST", "/v1/completions", json.dumps({"prompt": "a b", "max_tokens": 1400, "ignore_eos": True}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            result.append((r.status, json.loads(r.read())))

        t = threading.Thread(target=non_streamed)
        t.start()
        with llm.scheduler._lock:  # both requests are in the scheduler (bounded wait)
            assert llm.scheduler._lock.wait_for(lambda: llm.scheduler.stats.live == 2, BOUND)
        api.begin_drain()
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=BOUND)
        c.request("POST", "/v1/completions", json.dumps({"prompt": "x"}), {"Content-Type": "application/json"})
        assert c.getresponse().status == 503
        assert api.abort_inflight() == 2
        rest = events(resp)
        t.join(BOUND)
        assert result and result[0][0] == 503 and result[0][1]["error"]["code"] == "service_unavailable"
        assert any(isinstance(e, dict) and "error" in e for e in rest) and rest[-1] == "[DONE]"
        assert llm.scheduler.wait_idle(BOUND) and llm.runner.blocks.num_in_use == 0
    finally:
        srv.stop()
