"""KvCacheConfig.free_gpu_memory_fraction on PyTorch engines (issue 23, finding 14 and
"Memory"): the KV pool takes that fraction of the memory free once the weights are loaded,
in whole blocks, the smaller of it and max_tokens when both are given; a fraction out of
range, or one too small for a max_seq_len sequence, is refused in one line."""
from __future__ import annotations

import math

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime import kv_cache as kv_mod
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.kv_cache import KVPool, free_memory_bytes, pool_blocks
from promptlookup.runtime.options import KvCacheConfig, with_options
from promptlookup.runtime.torch_runner import TorchRunner
from tests.tiny import tiny_llama

BLOCK = 8
LIMITS = EngineLimits(max_batch_size=4, max_input_len=96, max_seq_len=128, max_draft_len=8, vocab_size=512)
# the tiny Llama in fp32: 2 layers x 2 KV heads x head_dim 16, K and V
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4
FREE = 5_000_000  # bytes the patched reader reports


@pytest.fixture
def free(monkeypatch):
    """The free-memory reader patched to ``FREE`` bytes; records the devices it was asked about."""
    asked: list[torch.device] = []

    def fake(device: torch.device) -> int:
        asked.append(device)
        return FREE

    monkeypatch.setattr(kv_mod, "free_memory_bytes", fake)
    return asked


def runner(kv: KvCacheConfig) -> TorchRunner:
    return TorchRunner(tiny_llama(), LIMITS, kv_cache=kv, tokens_per_block=BLOCK)


def expected_blocks(fraction: float, free: int = FREE) -> int:
    return math.floor(fraction * free) // (BYTES_PER_TOKEN * BLOCK)


def test_bytes_per_token_of_the_tiny_llama():
    assert KVPool.bytes_per_token(2, 2, 16, torch.float32) == BYTES_PER_TOKEN


@pytest.mark.parametrize("fraction", [0.5, 0.123, 1.0])
def test_the_fraction_sizes_the_pool(free, fraction):
    r = runner(KvCacheConfig(free_gpu_memory_fraction=fraction))
    blocks = expected_blocks(fraction)
    assert r.pool.num_blocks == blocks and r.pool.tokens == (blocks - 1) * BLOCK
    assert r.pool.nbytes <= fraction * FREE < r.pool.nbytes + BYTES_PER_TOKEN * BLOCK  # whole blocks, rounded down
    assert free == [r.model.device]  # read once, for the model's device


def test_default_is_twice_a_full_batch_and_reads_no_memory(free):
    r = runner(KvCacheConfig())
    assert r.pool.tokens == 2 * LIMITS.max_batch_size * LIMITS.max_seq_len and free == []
    assert runner(KvCacheConfig(max_tokens=300)).pool.tokens == 304 and free == []


def test_the_smaller_of_fraction_and_max_tokens_wins(free):
    big = expected_blocks(0.5)
    assert runner(KvCacheConfig(max_tokens=200, free_gpu_memory_fraction=0.5)).pool.num_blocks == 1 + 25
    assert runner(KvCacheConfig(max_tokens=10**7, free_gpu_memory_fraction=0.5)).pool.num_blocks == big


def test_a_fraction_too_small_for_one_sequence_is_refused(free):
    need = 1 + LIMITS.max_seq_len // BLOCK  # blocks: scratch + one max_seq_len sequence
    least = need * BYTES_PER_TOKEN * BLOCK / FREE
    with pytest.raises(UserError) as exc:
        runner(KvCacheConfig(free_gpu_memory_fraction=least * 0.99))
    msg = str(exc.value)
    assert "\n" not in msg and "--kv_cache_free_gpu_memory_fraction" in msg and "--kv_cache_fraction" in msg
    assert f"{LIMITS.max_seq_len} tokens" in msg
    shown = float(msg.rsplit("at least ", 1)[1])
    assert shown >= least
    assert runner(KvCacheConfig(free_gpu_memory_fraction=shown)).pool.num_blocks >= need  # the named minimum works


def test_too_little_free_memory_for_any_fraction(monkeypatch):
    monkeypatch.setattr(kv_mod, "free_memory_bytes", lambda device: 1000)
    with pytest.raises(UserError, match="even 1 is too little"):
        runner(KvCacheConfig(free_gpu_memory_fraction=1.0))


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, 2, float("nan"), float("inf"), True, "0.5"])
def test_out_of_range_fractions_are_refused(bad):
    with pytest.raises(UserError, match=r"^free_gpu_memory_fraction must be a number in \(0, 1\]"):
        KvCacheConfig(free_gpu_memory_fraction=bad)


def test_with_options_folds_the_flag_in():
    _, kv = with_options(None, KvCacheConfig(max_tokens=64), kv_cache_free_gpu_memory_fraction=0.25)
    assert (kv.max_tokens, kv.free_gpu_memory_fraction) == (64, 0.25)


def test_greedy_output_is_unchanged(free):
    """Plain and prompt-lookup greedy decoding give the same tokens in a pool sized by a
    fraction as in the default one."""
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9]]
    draft = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2)
    outs = {}
    for name, kv in (("default", KvCacheConfig()), ("fraction", KvCacheConfig(free_gpu_memory_fraction=0.3))):
        r = runner(kv)
        for d in (None, draft):
            outs[name, d is None] = [o.output_ids for o in generate(r, prompts, max_new_tokens=24, end_id=-1, draft=d)]
    assert outs["default", True] == outs["fraction", True] == outs["default", False] == outs["fraction", False]
    assert all(len(o) == 24 for o in outs["default", True])


def test_free_memory_on_the_cpu_is_memavailable(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    7654321 kB\n")
    monkeypatch.setattr(kv_mod, "MEMINFO", str(meminfo))
    assert free_memory_bytes(torch.device("cpu")) == 7654321 * 1024
    meminfo.write_text("MemTotal:       16000000 kB\n")
    with pytest.raises(UserError, match="MemAvailable"):
        free_memory_bytes(torch.device("cpu"))
    monkeypatch.setattr(kv_mod, "MEMINFO", str(tmp_path / "absent"))
    with pytest.raises(UserError, match="--max_tokens_in_paged_kv_cache"):
        free_memory_bytes(torch.device("cpu"))


def test_free_memory_elsewhere_is_refused():
    with pytest.raises(UserError, match="free memory of a meta device cannot be read"):
        free_memory_bytes(torch.device("meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_free_memory_on_a_gpu_is_mem_get_info():
    free = free_memory_bytes(torch.device("cuda:0"))
    assert 0 < free <= torch.cuda.mem_get_info(0)[1]


def test_pool_blocks_without_a_runner(free):
    kv = KvCacheConfig(free_gpu_memory_fraction=0.5)
    assert pool_blocks(kv, 4, 128, BLOCK, BYTES_PER_TOKEN, torch.device("cpu")) == expected_blocks(0.5)
