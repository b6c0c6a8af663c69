"""V2 adapter: the LLM API with NGramDecodingConfig, mapped through recording fakes."""
from __future__ import annotations

from pathlib import Path

import pytest

from promptlookup.runtime.results import StepEvent
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import SamplingConfig
from promptlookup.runtime.trtllm import TrtllmLookupGenerator, check_llmapi_draft

from .fakes import (
    FakeKvCacheConfig,
    FakeLLM,
    FakeNGramDecodingConfig,
    FakeSamplingParams,
    cycle_target,
    greedy,
    write_engine,
)

END = 63


@pytest.fixture
def llm_cls():
    class Fake(FakeLLM):
        instances: list = []
        target = staticmethod(cycle_target())
        omit_end_id = False
        metrics = "reported"

    Fake.instances = FakeLLM.instances = []
    return Fake


def make(hf_dir: Path, llm_cls, **kw) -> TrtllmLookupGenerator:
    return TrtllmLookupGenerator(
        hf_dir,
        llm_cls=llm_cls,
        engine_llm_cls=llm_cls,
        ngram_config_cls=FakeNGramDecodingConfig,
        kv_cache_config_cls=FakeKvCacheConfig,
        sampling_params_cls=FakeSamplingParams,
        **kw,
    )


def test_llm_is_built_with_ngram_config_and_block_reuse(hf_dir, llm_cls):
    gen = make(hf_dir, llm_cls, tensor_parallel_size=2, pipeline_parallel_size=1, kv_cache_free_gpu_memory_fraction=0.8)
    draft = DraftConfig(prompt_lookup_num_tokens=7, max_matching_ngram_size=3, is_keep_all=False, is_use_oldest=False, is_public_pool=False)
    gen.generate([[1, 2, 3]], max_new_tokens=4, end_id=END, draft=draft)
    (llm,) = FakeLLM.instances
    kw = llm.kwargs
    assert kw["model"] == str(hf_dir)
    assert kw["tensor_parallel_size"] == 2 and kw["pipeline_parallel_size"] == 1
    assert kw["disable_overlap_scheduler"] is True
    spec = kw["speculative_config"]
    assert isinstance(spec, FakeNGramDecodingConfig)
    assert spec.kwargs == dict(
        max_draft_len=7, max_matching_ngram_size=3, is_keep_all=False, is_use_oldest=False, is_public_pool=False
    )
    kv = kw["kv_cache_config"]
    assert isinstance(kv, FakeKvCacheConfig)
    assert kv.kwargs == dict(enable_block_reuse=True, free_gpu_memory_fraction=0.8)


def test_sampling_params_mapping(hf_dir, llm_cls):
    gen = make(hf_dir, llm_cls)
    gen.generate([[1]], max_new_tokens=5, end_id=END, draft=DraftConfig())
    _, params, streaming = FakeLLM.instances[0].requests[0]
    assert streaming is True
    assert params.kwargs == dict(max_tokens=5, end_id=END, pad_id=END, detokenize=False, return_perf_metrics=True, top_k=1)
    gen.generate([[1]], max_new_tokens=5, end_id=END, draft=DraftConfig(), sampling=SamplingConfig(0.8, 0, 0.95, 9))
    _, params, _ = FakeLLM.instances[0].requests[1]
    assert (params.kwargs["temperature"], params.kwargs["top_k"], params.kwargs["top_p"], params.kwargs["seed"]) == (
        0.8,
        None,
        0.95,
        9,
    )


def test_results_from_streamed_chunks(hf_dir, llm_cls):
    gen = make(hf_dir, llm_cls)
    events: list[StepEvent] = []
    prompts = [[1, 2, 3], [9, 9]]
    results = gen.generate(prompts, max_new_tokens=20, end_id=END, draft=DraftConfig(), on_step=events.append)
    sizes = []
    s = 0
    while sum(sizes) < 20:  # the fake's chunking: (1, 3, 1, 4, 2) cycled, cut at max_tokens
        sizes.append(min(llm_cls.chunk_sizes[s % 5], 20 - sum(sizes)))
        s += 1
    for i, (r, p) in enumerate(zip(results, prompts)):
        assert r.output_ids == greedy(llm_cls.target, p, 20, END)
        assert r.steps == len(sizes)
        assert r.accepted == sum(n - 1 for n in sizes)
        assert sum(r.draft_flags) == r.accepted and len(r.draft_flags) == len(r.output_ids)
        assert r.drafted == llm_cls.drafted_per_step * (len(sizes) - 1)  # from request_perf_metrics
        assert not r.finished
        mine = [e for e in events if e.index == i]
        assert [len(e.tokens) for e in mine] == sizes
        assert [e.accepted for e in mine] == [n - 1 for n in sizes]
        assert sum((e.tokens for e in mine), []) == r.output_ids
    assert [e.index for e in events] == sorted(e.index for e in events)  # one request after another


@pytest.mark.parametrize("metrics", ["none", "absent", "no_spec"])
def test_end_id_is_appended_when_left_out_and_drafted_falls_back(hf_dir, llm_cls, metrics):
    stop_at = 9
    llm_cls.target = staticmethod(lambda seq: END if len(seq) >= stop_at else (seq[-1] * 3 + 7) % 50 + 1)
    llm_cls.omit_end_id = True
    llm_cls.metrics = metrics
    gen = make(hf_dir, llm_cls)
    (r,) = gen.generate([[1, 2]], max_new_tokens=20, end_id=END, draft=DraftConfig())
    truth = greedy(llm_cls.target, [1, 2], 20, END)
    assert truth[-1] == END
    assert r.output_ids == truth and r.finished
    assert r.draft_flags[-1] is False and sum(r.draft_flags) == r.accepted
    assert r.drafted == r.accepted  # no metrics: the documented lower bound


def test_llm_reused_for_same_draft_and_rebuilt_for_another(hf_dir, llm_cls):
    gen = make(hf_dir, llm_cls)
    gen.generate([[1]], max_new_tokens=2, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4))
    gen.generate([[1]], max_new_tokens=2, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4))
    assert len(FakeLLM.instances) == 1
    gen.generate([[1]], max_new_tokens=2, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=6))
    first, second = FakeLLM.instances
    assert first.shut_down and not second.shut_down
    with gen:
        pass
    assert second.shut_down


@pytest.mark.parametrize(
    "draft, message",
    [
        (DraftConfig(max_candidates=2), "--prompt_lookup_candidates 2: TensorRT-LLM verifies one draft chain"),
        (DraftConfig(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens >= 1"),
    ],
)
def test_unsupported_draft_configs_are_user_errors(hf_dir, llm_cls, draft, message):
    with pytest.raises(UserError, match=message):
        check_llmapi_draft(draft)
    gen = make(hf_dir, llm_cls)
    with pytest.raises(UserError):
        gen.generate([[1]], max_new_tokens=2, end_id=END, draft=draft)
    assert FakeLLM.instances == []


@pytest.mark.parametrize(
    "draft, settings",
    [
        (DraftConfig(mode="longest"), ("--drafter_mode longest",)),
        (DraftConfig(adaptive=True), ("--adaptive_draft",)),
        (DraftConfig(static_cache="x.bin"), ("--ngram_static_cache",)),
        (DraftConfig(dynamic_cache="y.bin"), ("--ngram_dynamic_cache",)),
        (DraftConfig(pool_rules="v1"), ("--pool_rules v1",)),
        (DraftConfig(min_matching_ngram_size=2), ("--prompt_lookup_min_ngram 2",)),
        (DraftConfig(mode="longest", max_match_len=8), ("--drafter_mode longest", "max_match_len 8")),
    ],
)
def test_settings_without_an_ngram_field_run_this_projects_drafter_inside_tensorrt_llm(draft, settings):
    plan = check_llmapi_draft(draft)  # 1.0: UserProvidedDecodingConfig, never a plain NGram run
    assert plan.config_class == "UserProvidedDecodingConfig" and plan.needs_own_drafter == settings


def test_engine_dir_is_not_a_model_for_the_llm_api(tmp_path, llm_cls):
    eng = write_engine(tmp_path / "engine")
    with pytest.raises(UserError, match="Hugging Face checkpoint"):
        make(eng, llm_cls)


def test_real_llm_api_needs_tensorrt_llm(hf_dir, no_tensorrt_llm):
    with pytest.raises(UserError, match="tensorrt_llm is not installed"):
        TrtllmLookupGenerator(hf_dir)


def test_v2_through_the_engine_runner_and_decoding_generate(tmp_path, hf_dir, llm_cls):
    from functools import partial

    from promptlookup.decoding import generate
    from promptlookup.runtime.trtllm import TrtllmRunner

    from .fakes import FakeModelRunnerCpp

    engine = write_engine(tmp_path / "engine", tp=2, max_seq_len=100, max_batch_size=3)
    factory = partial(
        TrtllmLookupGenerator,
        llm_cls=llm_cls,
        ngram_config_cls=FakeNGramDecodingConfig,
        kv_cache_config_cls=FakeKvCacheConfig,
        sampling_params_cls=FakeSamplingParams,
    )
    from promptlookup.engine.trtllm_config import read_trtllm_engine_config

    no_hf = TrtllmRunner(read_trtllm_engine_config(engine), model_runner_cls=FakeModelRunnerCpp)
    with pytest.raises(UserError, match="--hf_model_dir"):
        generate(no_hf, [[1, 2]], max_new_tokens=4, end_id=END, draft=DraftConfig(), workflow="v2")
    runner = TrtllmRunner(read_trtllm_engine_config(engine), model_runner_cls=FakeModelRunnerCpp, hf_model_dir=hf_dir,
                          lookup_generator_cls=factory)
    (r,) = generate(
        runner, [[1, 2]], max_new_tokens=12, end_id=END, draft=DraftConfig(), workflow="v2"
    )
    assert r.output_ids == greedy(llm_cls.target, [1, 2], 12, END)
    (llm,) = FakeLLM.instances
    assert llm.kwargs["tensor_parallel_size"] == 2  # the engine's parallelism
    assert (llm.kwargs["max_batch_size"], llm.kwargs["max_seq_len"]) == (3, 100)
    runner.close()
    assert llm.shut_down


def test_lookahead_maps_onto_tensorrt_llms_lookahead_decoding_config(hf_dir, llm_cls):
    from promptlookup.decoding.lookahead import LookaheadConfig
    from tests.runtime_trtllm.fakes import FakeLookaheadDecodingConfig

    gen = make(hf_dir, llm_cls, lookahead_config_cls=FakeLookaheadDecodingConfig)
    gen.generate([[1, 2, 3]], max_new_tokens=4, end_id=END, draft=None, lookahead=LookaheadConfig(5, 4, 3))
    spec = FakeLLM.instances[-1].kwargs["speculative_config"]
    assert isinstance(spec, FakeLookaheadDecodingConfig)
    assert spec.kwargs == dict(max_window_size=5, max_ngram_size=4, max_verification_set_size=3)
    with pytest.raises(UserError, match="one speculative_config"):
        gen.generate([[1]], max_new_tokens=2, end_id=END, draft=DraftConfig(), lookahead=LookaheadConfig(5, 4, 3))
    with pytest.raises(UserError, match="max_verification_set_size >= 1"):
        gen.generate([[1]], max_new_tokens=2, end_id=END, draft=None, lookahead=LookaheadConfig(5, 4, 0))
