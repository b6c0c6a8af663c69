"""What holds memory (issue 23, "Resident memory is not what start-up shows"): the KV pool
is resident once committed, and /metrics names the bytes of the weights and the KV pool."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from promptlookup.serving.metrics import resident_bytes, weight_bytes


_COMMIT_CHECK = """
from promptlookup.runtime.kv_cache import KVPool
from promptlookup.serving.metrics import resident_bytes
pool = KVPool(num_layers=2, num_kv_heads=4, head_dim=64, block_size=32, num_blocks=1024)  # 128 MiB, untouched
assert pool.nbytes == 2 * 2 * 4 * 1024 * 32 * 64 * 4
before = resident_bytes()
pool.commit()
grown = resident_bytes() - before
assert grown >= 0.9 * pool.nbytes, (grown, pool.nbytes)
assert all(bool((t == 0).all()) for t in (*pool.k, *pool.v))
"""


@pytest.mark.skipif(resident_bytes() == 0, reason="needs /proc/self/statm (Linux)")
def test_commit_makes_the_kv_pool_resident():
    # A fresh interpreter: in a long test process the allocator may hand back pages that an
    # earlier test already made resident, and the growth would be smaller than the pool.
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _COMMIT_CHECK], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_weight_bytes_counts_each_storage_once():
    lin = torch.nn.Linear(16, 8)
    lin.alias = lin.weight.data  # the same storage again, as a plain attribute
    lin.extra = [torch.zeros(10, dtype=torch.float16)]
    assert weight_bytes(lin) == (16 * 8 + 8) * 4 + 10 * 2


def test_metrics_export_memory_by_holder(tiny_engine_dir):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from promptlookup import LLM, NGramDecodingConfig
    from promptlookup.serving.openai_server import OpenAIServer
    from tests.serving.server_thread import ServerThread

    with LLM(str(tiny_engine_dir), speculative_config=NGramDecodingConfig(max_draft_len=4)) as llm:
        srv = ServerThread(OpenAIServer(llm, "tiny").app)
        try:
            llm.generate("one two one two one two")
            with urllib.request.urlopen(srv.url + "/metrics", timeout=60) as r:
                text = r.read().decode()
        finally:
            srv.stop()
        values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if not line.startswith("#")}
        assert values['promptlookup_memory_bytes{holder="kv_pool"}'] == llm.runner.pool.nbytes
        assert values['promptlookup_memory_bytes{holder="weights"}'] == weight_bytes(llm.runner.model) > 0
        assert values['promptlookup_memory_bytes{holder="resident"}'] > 0
        assert values["promptlookup_ngram_pool_patterns"] > 0
        assert values["promptlookup_kv_blocks_in_use"] == 0
