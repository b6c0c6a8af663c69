"""V1 adapter: ModelRunnerCpp (orchestrator mode) argument and output mapping, validation."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import pytest
import torch

from promptlookup.decoding.orchestrator import run_orchestrator
from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.runtime.base import SamplingConfig
from promptlookup.runtime.trtllm import env
from promptlookup.engine.trtllm_config import read_trtllm_engine_config
from promptlookup.runtime.trtllm import TrtllmRunner, trtllm_unavailable_reason

from .conftest import simulate_gpus
from .fakes import FakeModelRunnerCpp, cycle_target, greedy, write_engine

END = 63


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    return write_engine(tmp_path / "engine", max_draft_len=10, max_seq_len=128, max_batch_size=4)


@pytest.fixture
def fake_cls():
    class Fake(FakeModelRunnerCpp):
        instances: list = []
        target = staticmethod(cycle_target())
        continue_after_end = False

    return Fake


def make(engine: Path, fake_cls, **kw) -> TrtllmRunner:
    return TrtllmRunner(read_trtllm_engine_config(engine), model_runner_cls=fake_cls, **kw)


# --------------------------------------------------------------------------- from_dir


def test_from_dir_gets_orchestrator_mode_devices_and_block_reuse(engine, fake_cls):
    runner = make(engine, fake_cls)
    (inst,) = fake_cls.instances
    kw = inst.from_dir_kwargs
    assert kw["engine_dir"] == str(engine)
    assert kw["is_orchestrator_mode"] is True
    assert kw["device_ids"] == [0]
    assert kw["kv_cache_enable_block_reuse"] is True
    assert kw["max_batch_size"] == 4
    assert kw["max_input_len"] == 127  # whole sequences are re-submitted: bounded by max_seq_len
    assert kw["max_beam_width"] == 1
    assert runner.limits.max_draft_len == 10 and runner.limits.vocab_size == 64


def test_from_dir_passes_explicit_devices_for_tensor_parallel_engine(tmp_path, fake_cls):
    eng = write_engine(tmp_path / "tp2", tp=2)
    make(eng, fake_cls, device_ids=[4, 5], kv_cache_free_gpu_memory_fraction=0.5, max_batch_size=2)
    kw = fake_cls.instances[-1].from_dir_kwargs
    assert kw["device_ids"] == [4, 5]
    assert kw["kv_cache_free_gpu_memory_fraction"] == 0.5
    assert kw["max_batch_size"] == 2


# --------------------------------------------------------------------------- generate


def test_generate_maps_drafts_and_greedy_sampling(engine, fake_cls):
    runner = make(engine, fake_cls)
    target = fake_cls.target
    prompt = [1, 2, 3]
    truth = greedy(target, prompt, 6, END)
    k = 4
    runner.generate([prompt], max_new_tokens=k + 1, end_id=END, draft_tokens_list=[truth[:k]])
    call = fake_cls.instances[0].calls[-1]
    assert call["draft_tokens_list"] == [truth[:k]]
    assert call["max_new_tokens"] == k + 1
    assert call["end_id"] == END and call["pad_id"] == END
    assert (call["temperature"], call["top_k"], call["top_p"]) == (1.0, 1, 0.0)  # TensorRT-LLM's greedy
    assert call["streaming"] is False and call["return_dict"] is True
    assert call["output_sequence_lengths"] is True and call["num_beams"] == 1
    (ids,) = call["batch_input_ids"]
    assert ids.dtype == torch.int32 and ids.tolist() == prompt


def test_generate_maps_sampling_parameters(engine, fake_cls):
    runner = make(engine, fake_cls, pad_id=0)
    s = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, random_seed=123)
    runner.generate([[1, 2]], max_new_tokens=2, end_id=END, sampling=s)
    call = fake_cls.instances[0].calls[-1]
    assert (call["temperature"], call["top_k"], call["top_p"], call["random_seed"]) == (0.7, 20, 0.9, 123)
    assert call["pad_id"] == 0
    assert "draft_tokens_list" not in call


def test_outputs_are_new_tokens_with_agreeing_prefix(engine, fake_cls):
    runner = make(engine, fake_cls)
    target = fake_cls.target
    prompts = [[1, 2, 3], [9, 8], [5], [7, 7, 7, 7]]
    truths = [greedy(target, p, 8, END) for p in prompts]
    wrong = lambda t: (t % 50) + 2  # never equal to t  # noqa: E731
    drafts = [
        truths[0][:4],  # all right: 4 accepted + 1 own
        truths[1][:2] + [wrong(truths[1][2])] + truths[1][3:5],  # first two right
        [wrong(truths[2][0]), truths[2][1]],  # wrong at once
        [],  # no draft
    ]
    outs = runner.generate(prompts, max_new_tokens=5, end_id=END, draft_tokens_list=drafts)
    assert [o.drafted for o in outs] == [4, 5, 2, 0]
    assert [o.accepted for o in outs] == [4, 2, 0, 0]
    for o, t in zip(outs, truths):
        assert o.output_ids == t[: o.accepted + 1]
        assert not o.finished
    # the empty draft travels as run_dtm_pld's [end_id] placeholder
    assert fake_cls.instances[0].calls[-1]["draft_tokens_list"][3] == [END]
    assert runner.stats.forward_calls == 1


def test_end_id_finishes_and_cuts(engine, fake_cls):
    stop_at = 6
    fake_cls.target = staticmethod(lambda seq: END if len(seq) >= stop_at else (seq[-1] * 3 + 7) % 50 + 1)
    fake_cls.continue_after_end = True  # the fake appends tokens after end_id; they must go
    runner = make(engine, fake_cls)
    prompt = [1, 2, 3]
    truth = greedy(fake_cls.target, prompt, 10, END)
    assert truth[-1] == END and len(truth) == 4
    (out,) = runner.generate([prompt], max_new_tokens=8, end_id=END, draft_tokens_list=[truth[:5]])
    assert out.output_ids == truth
    assert out.finished
    assert out.accepted == 4  # end_id itself was an accepted draft token
    # with an empty draft, the [end_id] placeholder is accepted by the engine but not counted
    (out,) = runner.generate([prompt + truth[:3]], max_new_tokens=1, end_id=END, draft_tokens_list=[[]])
    assert out.output_ids == [END] and out.finished
    assert out.drafted == 0 and out.accepted == 0


def test_plain_decoding_without_drafts(engine, fake_cls):
    runner = make(engine, fake_cls)
    (out,) = runner.generate([[4, 4]], max_new_tokens=6, end_id=END)
    assert out.output_ids == greedy(fake_cls.target, [4, 4], 6, END)
    assert out.drafted == 0


def test_generate_rejects_what_the_engine_cannot_take(engine, fake_cls):
    runner = make(engine, fake_cls)
    with pytest.raises(UserError, match="max_batch_size"):
        runner.generate([[1]] * 5, max_new_tokens=1, end_id=END)
    with pytest.raises(UserError, match="max_seq_len"):
        runner.generate([[1] * 120], max_new_tokens=9, end_id=END)
    with pytest.raises(UserError, match="max_draft_len"):
        runner.generate([[1]], max_new_tokens=12, end_id=END, draft_tokens_list=[[2] * 11])


class LastTokenDrafter:
    """A minimal prompt-lookup drafter for the loop test: follow the last earlier match."""

    config = DraftConfig(prompt_lookup_num_tokens=4)

    def new_request(self, prompt: Sequence[int], max_seq_len: int):
        drafter = self

        class Req:
            text = list(prompt)

            def extend(self, tokens):
                self.text.extend(tokens)

            def propose(self):
                last = self.text[-1]
                for j in range(len(self.text) - 2, -1, -1):
                    if self.text[j] == last:
                        room = max_seq_len - len(self.text) - 1
                        return self.text[j + 1 : j + 1 + min(drafter.config.prompt_lookup_num_tokens, room)]
                return []

            def record(self, drafted, accepted):
                pass

            def finish(self):
                pass

        return Req()


def test_v1_loop_through_the_adapter_matches_greedy(engine, fake_cls):
    runner = make(engine, fake_cls)
    runner.validate_lookup(4)
    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8]]
    results = run_orchestrator(runner, prompts, max_new_tokens=30, end_id=END, drafter=LastTokenDrafter())
    for r, p in zip(results, prompts):
        assert r.output_ids == greedy(fake_cls.target, p, 30, END)
        assert sum(r.draft_flags) == r.accepted <= r.drafted
        assert r.steps < len(r.output_ids)  # cycles make lookup pay off
    assert sum(r.accepted for r in results) > 0


# --------------------------------------------------------------------------- validation


def test_device_list_must_match_tp_times_pp(tmp_path, fake_cls):
    eng = write_engine(tmp_path / "tp2pp2", tp=2, pp=2)
    with pytest.raises(UserError, match=r"tp_size\*pp_size = 2\*2 = 4"):
        make(eng, fake_cls, device_ids=[0, 1])
    runner = make(eng, fake_cls, device_ids=[0, 1, 2, 3])
    with pytest.raises(UserError, match="4 devices"):
        runner.validate_lookup(4, [0])
    with pytest.raises(UserError, match="distinct"):
        make(eng, fake_cls, device_ids=[0, 0, 1, 2])


def test_k_above_max_draft_len_is_rejected(tmp_path, fake_cls):
    runner = make(write_engine(tmp_path / "e", max_draft_len=4), fake_cls)
    runner.validate_lookup(4)
    with pytest.raises(UserError, match="--max_draft_len 5"):
        runner.validate_lookup(5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(speculative_decoding_mode=1), "draft_tokens_external"),
        (dict(speculative_decoding_mode="medusa"), "draft_tokens_external"),
        (dict(use_paged_context_fmha=False), "use_paged_context_fmha"),
        (dict(max_draft_len=0), "max_draft_len"),
    ],
)
def test_engine_built_without_lookup_support_is_rejected(tmp_path, fake_cls, overrides, message):
    runner = make(write_engine(tmp_path / "e", **overrides), fake_cls)
    with pytest.raises(UserError, match=message):
        runner.validate_lookup(2)


def test_block_reuse_is_required_for_lookup(engine, fake_cls):
    runner = make(engine, fake_cls, kv_cache_enable_block_reuse=False)
    assert fake_cls.instances[-1].from_dir_kwargs["kv_cache_enable_block_reuse"] is False
    with pytest.raises(UserError, match="kv_cache_enable_block_reuse"):
        runner.validate_lookup(2)


def test_engine_dir_problems_are_one_line_user_errors(tmp_path, fake_cls):
    with pytest.raises(UserError, match="does not exist"):
        make(tmp_path / "missing", fake_cls)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(UserError, match="not an engine config"):
        read_trtllm_engine_config(hf)
    with pytest.raises(UserError, match="rank1.engine"):
        read_trtllm_engine_config(write_engine(tmp_path / "partial", tp=2, ranks=1))
    assert fake_cls.instances == []  # nothing reached TensorRT-LLM


# --------------------------------------------------------------------------- environment


def test_unavailable_without_tensorrt_llm_with_one_line_reason(no_tensorrt_llm):
    reason = trtllm_unavailable_reason()
    assert reason is not None and reason.startswith("tensorrt_llm is not installed")
    assert "\n" not in reason and "--backend torch" in reason


def test_real_classes_are_not_used_without_tensorrt_llm(engine, no_tensorrt_llm):
    with pytest.raises(UserError, match="tensorrt_llm is not installed"):
        TrtllmRunner(read_trtllm_engine_config(engine))


def test_broken_tensorrt_llm_install_is_one_line(monkeypatch, importable_tensorrt_llm):
    def broken(name, *args, **kwargs):
        if name == "tensorrt_llm":
            raise OSError("libnvinfer.so.10: cannot open shared object file\nmore detail")
        return real_import(name, *args, **kwargs)

    real_import = importlib.import_module
    monkeypatch.setattr(env.importlib, "import_module", broken)
    reason = trtllm_unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert "tensorrt_llm failed to import (OSError: libnvinfer.so.10" in reason


@pytest.mark.parametrize(
    "capabilities, problem",
    [
        ([], "no CUDA GPU is visible"),
        ([(7, 5)], "compute capability 7.5"),
        ([(6, 1), (7, 0)], "compute capability 7.0"),  # the best one is named
    ],
)
def test_gpu_reason_when_tensorrt_llm_imports(monkeypatch, importable_tensorrt_llm, capabilities, problem):
    simulate_gpus(monkeypatch, capabilities)
    reason = trtllm_unavailable_reason()
    assert reason is not None and problem in reason and "\n" not in reason
    assert "--backend torch" in reason


@pytest.mark.parametrize("capabilities", [[(8, 0)], [(9, 0)], [(7, 5), (8, 6)]])
def test_available_with_tensorrt_llm_and_an_ampere_or_newer_gpu(monkeypatch, importable_tensorrt_llm, capabilities):
    simulate_gpus(monkeypatch, capabilities)
    assert trtllm_unavailable_reason() is None
