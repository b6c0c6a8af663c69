"""free_gpu_memory_fraction reaches the PyTorch runner from the LLM API's KvCacheConfig and
from serve.py's --kv_cache_free_gpu_memory_fraction (issue 23, "Memory"), and the pool it
sizes is what /metrics reports; run.py's and quickstart's flags are tested beside their CLIs
(tests/cli) and the sizing itself in tests/runtime/test_kv_fraction.py."""
from __future__ import annotations

import pytest

from promptlookup import LLM
from promptlookup.api import KvCacheConfig
from promptlookup.errors import UserError
from promptlookup.runtime import kv_cache

FREE = 10_000_000
BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # the tiny engine: 2 layers x K,V x 2 KV heads x head_dim 16, fp32; 16 a block


@pytest.fixture
def free(monkeypatch):
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: FREE)


def test_llm_api_kv_cache_config(tiny_engine_dir, free):
    with LLM(str(tiny_engine_dir)) as plain:
        want = plain.generate("one two one two one two").outputs[0].token_ids
        default_tokens = plain.runner.pool.tokens
    with LLM(str(tiny_engine_dir), kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=0.25)) as llm:
        assert llm.runner.pool.num_blocks == int(0.25 * FREE) // BLOCK_BYTES != default_tokens // 16 + 1
        assert llm.generate("one two one two one two").outputs[0].token_ids == want
    with LLM(str(tiny_engine_dir), kv_cache_config=KvCacheConfig(max_tokens=1600, free_gpu_memory_fraction=0.25)) as llm:
        assert llm.runner.pool.tokens == 1600


def test_llm_api_refuses_a_fraction_out_of_range():
    with pytest.raises(UserError, match=r"free_gpu_memory_fraction must be a number in \(0, 1\], got 0"):
        KvCacheConfig(free_gpu_memory_fraction=0)


def test_serve_flag_sizes_the_pool_and_metrics_show_it(tiny_engine_dir, free):
    from promptlookup.cli.serve import build_llm, parse_args

    llm = build_llm(parse_args(["--engine_dir", str(tiny_engine_dir), "--kv_cache_free_gpu_memory_fraction", "0.5"]))
    try:
        pool = llm.runner.pool
        assert pool.num_blocks == int(0.5 * FREE) // BLOCK_BYTES and pool.nbytes <= 0.5 * FREE
        from promptlookup.serving.metrics import prometheus_text

        text = prometheus_text(llm, weights=0)
        assert f'promptlookup_memory_bytes{{holder="kv_pool"}} {pool.nbytes}' in text
        assert f"promptlookup_kv_blocks_total {pool.num_blocks - 1}" in text
    finally:
        llm.shutdown()


def test_serve_refuses_a_fraction_out_of_range(tiny_engine_dir):
    from promptlookup.cli.serve import build_llm, parse_args

    with pytest.raises(UserError, match=r"--kv_cache_free_gpu_memory_fraction must be a number in \(0, 1\], got 2"):
        build_llm(parse_args(["--engine_dir", str(tiny_engine_dir), "--kv_cache_free_gpu_memory_fraction", "2"]))
