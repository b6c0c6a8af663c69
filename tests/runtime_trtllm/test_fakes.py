"""The TensorRT-LLM fakes accept what TensorRT-LLM accepts, and nothing else."""
from __future__ import annotations

import pytest
import torch

from . import signatures
from .fakes import FakeKvCacheConfig, FakeLLM, FakeModelRunnerCpp, FakeNGramDecodingConfig, FakeSamplingParams, write_engine


@pytest.fixture(autouse=True)
def fresh_real_signatures():
    signatures.real_signature.cache_clear()
    yield
    signatures.real_signature.cache_clear()


@pytest.mark.parametrize(
    "make",
    [
        lambda: FakeSamplingParams(max_tokens=4, end_idd=2),
        lambda: FakeSamplingParams(max_new_tokens=4),  # ModelRunnerCpp's name, not the LLM API's
        lambda: FakeNGramDecodingConfig(max_draft_len=4, prompt_lookup_num_tokens=4),  # the 0.1x name
        lambda: FakeKvCacheConfig(enable_block_reuse=True, kv_cache_free_gpu_memory_fraction=0.5),
        lambda: FakeLLM("model", speculative_config=None, disable_overlap_schedular=True),
    ],
)
def test_unknown_keywords_raise_type_error(make):
    with pytest.raises(TypeError, match="unexpected keyword"):
        make()


def test_model_runner_fakes_take_the_real_names_only(tmp_path):
    engine = write_engine(tmp_path / "e")
    with pytest.raises(TypeError):
        FakeModelRunnerCpp.from_dir(str(engine), is_orchestrator=True)
    with pytest.raises(TypeError):
        FakeModelRunnerCpp.from_dir(engine_dir=str(engine), max_seq_len=128)  # from_dir has no max_seq_len
    runner = FakeModelRunnerCpp.from_dir(str(engine), is_orchestrator_mode=True, max_input_len=127)
    ids = [torch.tensor([1, 2], dtype=torch.int32)]
    with pytest.raises(TypeError, match="draft_token_list"):
        runner.generate(ids, max_new_tokens=1, end_id=63, draft_token_list=[[3]])
    out = runner.generate(ids, max_new_tokens=1, end_id=63, random_seed=0, draft_tokens_list=[[3]], return_dict=True)
    assert out["output_ids"].shape[0] == 1


def test_generate_async_signature():
    llm = FakeLLM("model")
    params = FakeSamplingParams(max_tokens=2, end_id=63)
    with pytest.raises(TypeError):
        llm.generate_async([1, 2], sampling_params=params, stream=True)
    assert list(llm.generate_async([1, 2], sampling_params=params, streaming=True))


def test_binds_against_the_installed_tensorrt_llm(importable_tensorrt_llm):
    class InstalledSamplingParams:  # stands in for an installed release that lacks return_perf_metrics
        def __init__(self, *, max_tokens: int = 32, end_id: int | None = None) -> None:
            pass

    importable_tensorrt_llm.SamplingParams = InstalledSamplingParams
    FakeSamplingParams(max_tokens=2, end_id=1)
    with pytest.raises(TypeError, match="installed TensorRT-LLM"):
        FakeSamplingParams(max_tokens=2, return_perf_metrics=True)


def test_no_installed_tensorrt_llm_means_recorded_signatures_only(no_tensorrt_llm):
    assert signatures.real_signature(signatures.SAMPLING_PARAMS) is None
    FakeSamplingParams(max_tokens=2, return_perf_metrics=True)
