"""Every adapter path against fake TensorRT-LLM releases (1.0 era and main), with no injection:
the adapter imports ``tensorrt_llm`` and reads its ``__version__`` as it would for real."""
from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from promptlookup.decoding.lookahead import LookaheadConfig
from promptlookup.drafting.base import DraftConfig
from promptlookup.engine.trtllm_config import read_trtllm_engine_config
from promptlookup.errors import UserError
from promptlookup.runtime.trtllm import TrtllmLookupGenerator, TrtllmRunner
from promptlookup.runtime.trtllm.releases import CAPABILITIES, Release, installed_release, parse_version
from promptlookup.runtime.trtllm.spec_plan import plan_speculation

from .fake_releases import FakeLlmRequest, FakeScheduledRequests, LlmRequestState, install_release
from .fakes import FakeLLM, FakeModelRunnerCpp, greedy, write_engine

END = 63
CYCLE = [1, 11, 41, 31, 1, 11, 41]  # the fake target's text from 1 repeats every 4 tokens: lookup-friendly


@pytest.fixture(params=["1.0", "main"])
def release(request, monkeypatch):
    modules = install_release(monkeypatch, request.param)
    yield request.param, modules
    installed_release.cache_clear()


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------ the version table


def test_versions_and_capability_ranges():
    assert parse_version("1.0.0rc4") == (1, 0) and parse_version("1.3.0.post1") == (1, 3)
    assert parse_version("0.21.0") == (0, 21)
    with pytest.raises(UserError, match="cannot read TensorRT-LLM's version"):
        parse_version("nightly")
    old, v10, v12, main = Release("0.21.0"), Release("1.0.0"), Release("1.2.1"), Release("1.3.0rc0")
    assert [r.has("engine_workflow") for r in (old, v10, v12, main)] == [True, True, True, False]
    assert [r.has("engine_llm") for r in (old, v10, v12, main)] == [False, True, True, False]
    assert [r.has("max_draft_len") for r in (old, v10, main)] == [False, True, True]
    assert [r.has("prompt_lookup_num_tokens") for r in (old, v10)] == [True, False]
    assert [r.has("sa_decoding") for r in (v12, main)] == [False, True]
    assert [r.has("draft_len_schedule") for r in (v12, main)] == [False, True]
    assert all(v10.has(c) for c in ("user_provided_drafter", "max_concurrency", "pytorch_llm_api"))
    with pytest.raises(UserError) as exc:
        main.require("engine_workflow", "trtllm-build")
    assert "TensorRT-LLM 1.3.0rc0 (installed) lacks" in one_line(exc) and "releases < 1.3" in str(exc.value)
    assert set(CAPABILITIES) >= {"engine_workflow", "sa_decoding", "user_provided_drafter", "draft_len_schedule"}


def test_version_is_read_once_from_the_installed_package(release):
    which, modules = release
    assert installed_release().version_text == modules["tensorrt_llm"].__version__
    modules["tensorrt_llm"].__version__ = "9.9.9"
    assert installed_release().version_text != "9.9.9"  # cached for the process


def test_pre_1_0_names_the_draft_length_prompt_lookup_num_tokens():
    plan = plan_speculation(DraftConfig(prompt_lookup_num_tokens=7), None, Release("0.21.0"))
    assert plan.kwargs["prompt_lookup_num_tokens"] == 7 and "max_draft_len" not in plan.kwargs
    with pytest.raises(UserError) as exc:
        plan_speculation(DraftConfig(adaptive=True), None, Release("0.21.0"))
    assert "--adaptive_draft" in one_line(exc) and "releases >= 1.0" in str(exc.value)


# ------------------------------------------------------------------ the fakes are strict


def test_fake_configs_forbid_unknown_fields_and_the_llm_checks_backends(release):
    which, modules = release
    api = modules["tensorrt_llm.llmapi"]
    with pytest.raises(pydantic.ValidationError):
        api.NGramDecodingConfig(max_draft_len=4, prompt_lookup_num_tokens=4)
    with pytest.raises(pydantic.ValidationError):
        api.KvCacheConfig(max_tokens_in_paged_kv_cache=10)
    if which == "1.0":
        la = api.LookaheadDecodingConfig(max_window_size=4, max_ngram_size=3, max_verification_set_size=4)
        with pytest.raises(ValueError, match="does not support backend pytorch"):
            modules["tensorrt_llm"].LLM("m", speculative_config=la)
        with pytest.raises(pydantic.ValidationError):
            api.NGramDecodingConfig(max_draft_len=4, draft_len_schedule={4: 4})  # main's field
    else:
        assert not hasattr(api, "LookaheadDecodingConfig")
        with pytest.raises(pydantic.ValidationError):
            api.NGramDecodingConfig(max_draft_len=4, max_concurrency=2, draft_len_schedule={4: 4})
        with pytest.raises(pydantic.ValidationError):
            api.SADecodingConfig(max_draft_len=4, max_matching_ngram_size=0)


# ------------------------------------------------------------------ V1: the engine workflow


def test_v1_runs_where_the_release_has_the_engine_workflow(release, tmp_path):
    which, _ = release
    engine = write_engine(tmp_path / "engine", max_seq_len=100)
    config = read_trtllm_engine_config(engine)
    if which == "main":
        with pytest.raises(UserError) as exc:
            TrtllmRunner(config)
        assert "ModelRunnerCpp" in one_line(exc) and "releases < 1.3" in str(exc.value)
        return
    FakeModelRunnerCpp.instances = []
    runner = TrtllmRunner(config, max_tokens_in_paged_kv_cache=4096, kv_cache_free_gpu_memory_fraction=0.5,
                          enable_chunked_context=True)
    kwargs = runner._runner.from_dir_kwargs
    assert (kwargs["max_tokens_in_paged_kv_cache"], kwargs["kv_cache_free_gpu_memory_fraction"],
            kwargs["enable_chunked_context"]) == (4096, 0.5, True)
    from promptlookup.decoding import generate

    (r,) = generate(runner, [[1, 2]], max_new_tokens=10, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4),
                    workflow="v1")
    assert r.output_ids == greedy(FakeModelRunnerCpp.target, [1, 2], 10, END)


def test_trtllm_build_is_refused_where_the_engine_workflow_is_gone(release, tmp_path):
    which, _ = release
    from promptlookup.engine.trtllm_build import run_trtllm_build

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if which == "main":
        with pytest.raises(UserError, match=r"trtllm-build.*releases < 1\.3"):
            run_trtllm_build(ckpt, tmp_path / "e", max_batch_size=1, max_input_len=8, max_seq_len=16, max_draft_len=4)
    else:  # 1.0 gets past the release check to PATH
        with pytest.raises(UserError, match="not on PATH|config.json"):
            run_trtllm_build(ckpt, tmp_path / "e", max_batch_size=1, max_input_len=8, max_seq_len=16, max_draft_len=4,
                             executable="/nonexistent/trtllm-build")


# ------------------------------------------------------------------ V2: the LLM API


def test_v2_ngram_with_the_kv_cache_flags(release, hf_dir):
    which, modules = release
    gen = TrtllmLookupGenerator(hf_dir, tensor_parallel_size=2, max_tokens_in_paged_kv_cache=2048,
                                kv_cache_free_gpu_memory_fraction=0.7, enable_chunked_context=True)
    draft = DraftConfig(prompt_lookup_num_tokens=5, max_matching_ngram_size=3, is_keep_all=False)
    (r,) = gen.generate([[1, 2, 3]], max_new_tokens=12, end_id=END, draft=draft)
    (llm,) = FakeLLM.instances
    assert r.output_ids == greedy(llm.target, [1, 2, 3], 12, END)
    spec, kv = llm.kwargs["speculative_config"], llm.kwargs["kv_cache_config"]
    assert type(spec) is modules["tensorrt_llm.llmapi"].NGramDecodingConfig
    assert (spec.max_draft_len, spec.max_matching_ngram_size, spec.is_keep_all) == (5, 3, False)
    assert (kv.enable_block_reuse, kv.max_tokens, kv.free_gpu_memory_fraction) == (True, 2048, 0.7)
    assert llm.kwargs["enable_chunked_prefill"] is True and llm.kwargs["disable_overlap_scheduler"] is True
    assert llm.kwargs["tensor_parallel_size"] == 2
    gen.close()


def test_v2_longest_is_sa_on_main_and_this_projects_drafter_on_1_0(release, hf_dir):
    which, modules = release
    gen = TrtllmLookupGenerator(hf_dir)
    (r,) = gen.generate([CYCLE], max_new_tokens=16, end_id=END,
                        draft=DraftConfig(mode="longest", prompt_lookup_num_tokens=4))
    (llm,) = FakeLLM.instances
    assert r.output_ids == greedy(llm.target, CYCLE, 16, END)
    spec = llm.kwargs["speculative_config"]
    if which == "main":
        assert type(spec) is modules["tensorrt_llm.llmapi"].SADecodingConfig
        assert (spec.max_draft_len, spec.max_matching_ngram_size, spec.enable_global_pool) == (4, -1, True)
        assert "disable_overlap_scheduler" not in llm.kwargs  # SA supports the overlap scheduler
    else:
        assert type(spec) is modules["tensorrt_llm.llmapi"].UserProvidedDecodingConfig
        assert isinstance(spec.drafter, modules["tensorrt_llm._torch.speculative.drafter"].Drafter)
        assert r.drafted > 0 and r.accepted > 0
    gen.close()


@pytest.mark.parametrize("draft", [
    DraftConfig(prompt_lookup_num_tokens=4, adaptive=True),
    DraftConfig(prompt_lookup_num_tokens=4, pool_rules="v1"),
    DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=3, min_matching_ngram_size=2),
    DraftConfig(prompt_lookup_num_tokens=4, mode="llamacpp"),
])
def test_this_projects_drafters_run_inside_tensorrt_llm(release, hf_dir, draft):
    which, modules = release
    gen = TrtllmLookupGenerator(hf_dir)
    prompt = CYCLE
    (r,) = gen.generate([prompt], max_new_tokens=20, end_id=END, draft=draft)
    (llm,) = FakeLLM.instances
    assert r.output_ids == greedy(llm.target, prompt, 20, END)  # drafts never change the output
    spec = llm.kwargs["speculative_config"]
    assert type(spec) is modules["tensorrt_llm.llmapi"].UserProvidedDecodingConfig
    assert spec.max_draft_len == 4 and llm.kwargs["disable_overlap_scheduler"] is True
    assert r.drafted > 0 and r.accepted > 0 and r.steps < len(r.output_ids)
    drafting = gen.user_drafter.drafting
    assert drafting.drafted == r.drafted and not drafting._tracked  # finished when TensorRT-LLM completed it
    gen.close()


def test_concurrency_knobs_pass_through_where_the_release_has_them(release, hf_dir):
    which, _ = release
    gen = TrtllmLookupGenerator(hf_dir)
    gen.generate([[1, 2]], max_new_tokens=4, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4, max_concurrency=8))
    assert FakeLLM.instances[-1].kwargs["speculative_config"].max_concurrency == 8
    schedule = DraftConfig(prompt_lookup_num_tokens=4, draft_len_schedule=((4, 4), (8, 2)))
    if which == "1.0":
        with pytest.raises(UserError) as exc:
            gen.generate([[1, 2]], max_new_tokens=4, end_id=END, draft=schedule)
        assert "draft_len_schedule" in one_line(exc) and "releases >= 1.3" in str(exc.value)
    else:
        gen.generate([[1, 2]], max_new_tokens=4, end_id=END, draft=schedule)
        assert FakeLLM.instances[-1].kwargs["speculative_config"].draft_len_schedule == {4: 4, 8: 2}
        gen.generate([[1, 2]], max_new_tokens=4, end_id=END,
                     draft=DraftConfig(prompt_lookup_num_tokens=4, adaptive=True, draft_len_schedule=((4, 4),)))
        spec = FakeLLM.instances[-1].kwargs["speculative_config"]
        assert spec.draft_len_schedule == {4: 4} and spec.drafter.draft_len_schedule == {4: 4}
    gen.close()


def test_lookahead_runs_on_the_tensorrt_engine_llm_only(release, hf_dir):
    which, modules = release
    gen = TrtllmLookupGenerator(hf_dir)
    if which == "main":
        with pytest.raises(UserError) as exc:
            gen.generate([[1, 2]], max_new_tokens=4, end_id=END, draft=None, lookahead=LookaheadConfig(4, 3, 2))
        assert "TensorRT-engine LLM" in one_line(exc) and "releases >= 1.0 and < 1.3" in str(exc.value)
        assert FakeLLM.instances == []
        return
    (r,) = gen.generate([[1, 2]], max_new_tokens=8, end_id=END, draft=None, lookahead=LookaheadConfig(4, 3, 2))
    (llm,) = FakeLLM.instances
    assert type(llm) is modules["tensorrt_llm._tensorrt_engine"].LLM  # never the PyTorch LLM
    spec = llm.kwargs["speculative_config"]
    assert (spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size) == (4, 3, 2)
    assert "disable_overlap_scheduler" not in llm.kwargs
    gen.close()


def test_several_candidates_are_refused_on_every_release(release, hf_dir):
    gen = TrtllmLookupGenerator(hf_dir)
    with pytest.raises(UserError) as exc:
        gen.generate([[1, 2]], max_new_tokens=4, end_id=END, draft=DraftConfig(max_candidates=3))
    assert "--prompt_lookup_candidates 3" in one_line(exc)
    assert FakeLLM.instances == []


def test_v2_through_the_engine_runner_forwards_the_kv_flags(release, tmp_path, hf_dir):
    which, _ = release
    if which == "main":
        pytest.skip("no engine workflow on main (refusal tested above)")
    from promptlookup.decoding import generate

    engine = write_engine(tmp_path / "engine", max_seq_len=100)
    runner = TrtllmRunner(read_trtllm_engine_config(engine), hf_model_dir=hf_dir, max_tokens_in_paged_kv_cache=512,
                          kv_cache_free_gpu_memory_fraction=0.6, enable_chunked_context=True)
    generate(runner, [[1, 2]], max_new_tokens=6, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4),
             workflow="v2")
    llm = FakeLLM.instances[-1]
    kv = llm.kwargs["kv_cache_config"]
    assert (kv.max_tokens, kv.free_gpu_memory_fraction, llm.kwargs["enable_chunked_prefill"]) == (512, 0.6, True)
    runner.close()
    other = TrtllmRunner(read_trtllm_engine_config(engine), device_ids=[1], hf_model_dir=hf_dir)
    with pytest.raises(UserError) as exc:
        generate(other, [[1, 2]], max_new_tokens=6, end_id=END, draft=DraftConfig(prompt_lookup_num_tokens=4),
                 workflow="v2")
    assert "CUDA_VISIBLE_DEVICES=1" in one_line(exc)


# ------------------------------------------------------------------ the user-provided drafter itself


def test_scheduled_drafting_on_fake_scheduled_requests(release):
    which, modules = release
    from promptlookup.drafting import make_drafter
    from promptlookup.runtime.trtllm.user_drafter import make_user_drafter

    drafter = make_user_drafter(make_drafter(DraftConfig(prompt_lookup_num_tokens=3), workflow="v2"),
                                max_draft_len=3, max_concurrency=2)
    assert isinstance(drafter, modules["tensorrt_llm._torch.speculative.drafter"].Drafter)
    assert drafter.max_concurrency == 2
    a = FakeLlmRequest(7, [1, 2, 3, 4, 1, 2], py_orig_prompt_len=5, py_max_new_tokens=10)  # 2: the context step's
    b = FakeLlmRequest(8, [9, 9, 9], py_orig_prompt_len=3, py_max_new_tokens=1)
    drafter.prepare_draft_tokens(FakeScheduledRequests(generation_requests=[a, b]), None)
    assert a.py_draft_tokens == [3, 4, 1]  # the pool's continuation of [1, 2]
    assert b.py_draft_tokens == []  # 3 + 1 tokens already fill prompt + max new tokens
    a.tokens += [3, 4, 7]  # two draft tokens accepted, then the target's own
    if which == "main":
        drafter.update_max_total_draft_tokens(1)  # the executor's runtime draft length
    drafter.prepare_draft_tokens(FakeScheduledRequests(generation_requests=[a]), None)
    assert drafter.drafting.accepted == 2
    assert len(a.py_draft_tokens) <= (1 if which == "main" else 3)
    a.state = LlmRequestState.GENERATION_COMPLETE
    drafter.prepare_draft_tokens(FakeScheduledRequests(context_requests=[a]), None)
    assert set(drafter.drafting._tracked) == {8}
    drafter.drafting.finish_all()
    assert not drafter.drafting._tracked


def test_user_drafter_module_imports_without_tensorrt_llm(no_tensorrt_llm):
    import importlib

    module = importlib.import_module("promptlookup.runtime.trtllm.user_drafter")
    from promptlookup.drafting import make_drafter

    class Base:
        def __init__(self, max_concurrency=None):
            self.max_concurrency = max_concurrency

    d = module.make_user_drafter(make_drafter(DraftConfig(), workflow="v2"), max_draft_len=10, base_cls=Base)
    assert isinstance(d, Base)
    with pytest.raises(TypeError, match="draft_len_schedule"):
        module.make_user_drafter(make_drafter(DraftConfig(), workflow="v2"), max_draft_len=10, base_cls=Base,
                                 draft_len_schedule={4: 10})


# ------------------------------------------------------------------ promptlookup.LLM(..., backend="trtllm")


def test_llm_api_backend_trtllm(release, tmp_path, smollm2_tokenizer_dir):
    import shutil

    from promptlookup import LLM, KvCacheConfig, NGramDecodingConfig, SamplingParams

    which, modules = release
    hf = tmp_path / "hf"
    shutil.copytree(smollm2_tokenizer_dir, hf)
    (hf / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    spec = NGramDecodingConfig(max_draft_len=4, mode="longest", max_concurrency=8)
    with LLM(str(hf), speculative_config=spec, kv_cache_config=KvCacheConfig(max_tokens=1024), backend="trtllm") as llm:
        a, b = llm.generate(["one two one two", [1, 11, 41, 31, 1]], SamplingParams(max_tokens=6, end_id=END))
        want = greedy(FakeLLM.instances[-1].target, b.prompt_token_ids, 6, END)
        assert b.outputs[0].token_ids == want and a.finished and b.outputs[0].finish_reason == "length"
        sent = FakeLLM.instances[-1].kwargs
        assert sent["kv_cache_config"].max_tokens == 1024 and sent["speculative_config"].max_concurrency == 8
        expected = "SADecodingConfig" if which == "main" else "UserProvidedDecodingConfig"
        assert type(sent["speculative_config"]) is getattr(modules["tensorrt_llm.llmapi"], expected)
        with pytest.raises(UserError, match="generate\\(\\) only"):
            llm.generate_async("x")
        with pytest.raises(UserError, match="stop strings"):
            llm.generate("x", SamplingParams(max_tokens=2, stop="two"))
        with pytest.raises(UserError, match="logprobs are not passed"):  # refused, not dropped
            llm.generate("x", SamplingParams(max_tokens=2, logprobs=3))
    for kwargs, needle in ((dict(device="cpu"), "takes no device"), (dict(draft_length_policy="cost"), "in full"),
                           (dict(kv_cache_config=KvCacheConfig(enable_block_reuse=False)), "always reuses")):
        with pytest.raises(UserError, match=needle):
            LLM(str(hf), speculative_config=spec, backend="trtllm", **kwargs)


def test_llm_api_backend_trtllm_without_tensorrt_llm(no_tensorrt_llm, tmp_path, smollm2_tokenizer_dir):
    from promptlookup import LLM, NGramDecodingConfig

    with pytest.raises(UserError, match="tensorrt_llm is not installed"):
        LLM(str(smollm2_tokenizer_dir), speculative_config=NGramDecodingConfig(), backend="trtllm")
