"""``KvCacheConfig.dtype`` (``--kv_cache_dtype``) on the runner: the pool's type and size,
greedy identity on the PyTorch route too (the C route's: test_greedy_equivalence's ``f16kv``
params, test_kv_half), and a one-line refusal where a route would not read the type."""
from __future__ import annotations

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.options import KvCacheConfig, RuntimeConfig
from promptlookup.runtime.paged_llama import PagedLlama
from promptlookup.runtime.torch_runner import TorchRunner
from tests.runtime.test_greedy_equivalence import END_ID, MAX_NEW, make_prompts
from tests.tiny import tiny_llama

LIMITS = EngineLimits(max_batch_size=4, max_input_len=256, max_seq_len=320, max_draft_len=12, vocab_size=512)


def test_a_name_it_does_not_store_is_refused_in_one_line():
    for bad in ("fp8", "int8", "half", None):
        with pytest.raises(UserError) as err:
            KvCacheConfig(dtype=bad)
        assert "auto, float32, float16, bfloat16" in str(err.value) and "\n" not in str(err.value)


def test_the_pool_takes_the_type_and_half_the_bytes():
    model = tiny_llama(seed=0)
    pools = {dt: TorchRunner(model, LIMITS, kv_cache=KvCacheConfig(max_tokens=512, dtype=dt)).pool
             for dt in ("auto", "float16")}
    assert pools["auto"].dtype == torch.float32 and pools["float16"].dtype == torch.float16
    assert pools["auto"].tokens == pools["float16"].tokens
    assert pools["float16"].nbytes * 2 == pools["auto"].nbytes


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_the_pytorch_route_rounds_as_it_writes_and_lookup_stays_exact(kv_dtype):
    """The route GPUs take (the C kernels off): K/V cast as written and as read, so V1, V2
    and a tree step give plain decoding's tokens over the same cache."""
    model = PagedLlama.from_hf(tiny_llama(seed=1))
    model.uses_step_ops, model.layer_records = False, None
    runner = TorchRunner(model, LIMITS, kv_cache=KvCacheConfig(dtype=kv_dtype))
    assert runner.pool.dtype == getattr(torch, kv_dtype)
    prompts = make_prompts(1, count=3)
    plain = [r.output_ids for r in generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID)]
    draft = DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2)
    for workflow in ("v1", "v2"):
        got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
        assert [r.output_ids for r in got] == plain
        assert sum(r.accepted for r in got) > 0
    tree = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, workflow="v2",
                    draft=DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2, max_candidates=3))
    assert [r.output_ids for r in tree] == plain


def test_routes_that_would_not_read_the_type_refuse_it_in_one_line():
    model = tiny_llama(seed=0)
    with pytest.raises(UserError) as err:
        TorchRunner(model, LIMITS, runtime=RuntimeConfig(compile_mode="inductor"),
                    kv_cache=KvCacheConfig(dtype="float16"))
    assert "--torch_compile inductor" in str(err.value) and "\n" not in str(err.value)
    c_route = PagedLlama.from_hf(model)
    if c_route.uses_step_ops:  # the C kernels built: they store float32 or float16
        with pytest.raises(UserError, match="choose --kv_cache_dtype float16"):
            TorchRunner(c_route, LIMITS, kv_cache=KvCacheConfig(dtype="bfloat16"))


def test_the_trtllm_path_refuses_a_cache_type_in_one_line():
    """TensorRT-LLM engines fix their KV cache type when built: the LLM API refuses one here."""
    from promptlookup.api.trtllm_llm import refuse_unmapped

    with pytest.raises(UserError) as err:
        refuse_unmapped(draft_length_policy="full", draft_token_budget=None, device=None, cache_dir=None, build=None,
                        kv=KvCacheConfig(dtype="float16"))
    assert "KvCacheConfig(dtype='float16')" in str(err.value) and "\n" not in str(err.value)
    refuse_unmapped(draft_length_policy="full", draft_token_budget=None, device=None, cache_dir=None, build=None,
                    kv=KvCacheConfig())


def test_serve_flag_makes_a_float16_pool_and_metrics_count_its_bytes(tiny_engine_dir):
    from promptlookup.cli.serve import build_llm, parse_args
    from promptlookup.serving.metrics import prometheus_text

    argv = ["--engine_dir", str(tiny_engine_dir), "--device", "cpu", "--max_tokens_in_paged_kv_cache", "256"]
    sizes = {}
    for dtype in ("auto", "float16"):
        llm = build_llm(parse_args([*argv, "--kv_cache_dtype", dtype]))
        try:
            pool = llm.runner.pool
            sizes[dtype] = (pool.dtype, pool.nbytes)
            assert f'promptlookup_memory_bytes{{holder="kv_pool"}} {pool.nbytes}' in prometheus_text(llm, weights=0)
        finally:
            llm.shutdown()
    assert sizes["auto"][0] == torch.float32 and sizes["float16"][0] == torch.float16
    assert sizes["float16"][1] * 2 == sizes["auto"][1]
