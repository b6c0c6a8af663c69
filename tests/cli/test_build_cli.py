"""build.sh: trtllm-build's flags, the PyTorch engine layout, and clear errors."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# build.sh runs in a subprocess, so TensorRT-LLM's absence cannot be simulated there: the
# case that relies on it (--backend trtllm is refused) needs a machine without it.
needs_no_tensorrt_llm = pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None,
                                           reason="TensorRT-LLM is installed here")


def build(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([str(ROOT / "build.sh"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from promptlookup.checkpoint.convert import convert_model
    from tests.tiny import tiny_llama

    return convert_model(tiny_llama(), None, tmp_path_factory.mktemp("ck") / "ckpt", dtype="float32", tp_size=2)


def test_builds_a_torch_engine_with_the_limits(checkpoint, tmp_path):
    out = tmp_path / "engine"
    backend = "auto" if importlib.util.find_spec("tensorrt_llm") is None else "torch"  # auto: torch without it
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out), "--max_batch_size", "4",
              "--max_input_len", "256", "--max_seq_len", "512", "--max_draft_len", "10",
              "--speculative_decoding_mode", "draft_tokens_external", "--use_paged_context_fmha", "enable",
              "--gemm_plugin", "auto", "--backend", backend)
    assert r.returncode == 0, r.stderr
    assert "torch engine" in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["backend"] == "torch"
    b = cfg["build_config"]
    assert (b["max_batch_size"], b["max_input_len"], b["max_seq_len"], b["max_draft_len"]) == (4, 256, 512, 10)
    assert b["speculative_decoding_mode"] == "draft_tokens_external"
    assert b["plugin_config"]["use_paged_context_fmha"] is True
    assert cfg["pretrained_config"]["mapping"]["tp_size"] == 2
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == ["rank0.safetensors", "rank1.safetensors"]

    from promptlookup.engine.load import load_runner

    runner = load_runner(out)
    assert runner.limits.max_draft_len == 10
    assert len(runner.generate([[5, 6, 7]], max_new_tokens=3, end_id=-1)[0].output_ids) == 3


@pytest.mark.parametrize(
    "extra, message",
    [
        pytest.param(["--backend", "trtllm"], "tensorrt_llm is not installed", marks=needs_no_tensorrt_llm),
        (["--max_draft_len", "4"], "needs --speculative_decoding_mode draft_tokens_external"),
        (["--max_input_len", "600", "--max_seq_len", "512"], "must exceed --max_input_len"),
        (["--max_seq_len", "100000"], "exceeds the model's max_position_embeddings"),
        (["--tokens_per_block", "24"], "power of two"),
        (["--max_batch_size", "0"], "--max_batch_size must be at least 1"),
        (["--backend", "torch", "--gemm_plugin", "fp8"], "--gemm_plugin fp8: a PyTorch engine computes its products "
                                                         "in the checkpoint's float32"),
    ],
)
def test_bad_build_input_exits_2(checkpoint, tmp_path, extra, message):
    out = tmp_path / "engine"
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out), *extra)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".engine")]


def test_missing_checkpoint(tmp_path):
    r = build("--checkpoint_dir", str(tmp_path / "none"), "--output_dir", str(tmp_path / "e"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_paged_context_fmha_disable_is_honoured(checkpoint, tmp_path, capsys):
    """trtllm-build gets the user's value; a PyTorch engine built with disable runs without
    KV block reuse (which needs it), saying so once on stderr."""
    from promptlookup.engine.load import load_runner
    from promptlookup.engine.trtllm_build import trtllm_build_command

    argv = trtllm_build_command(checkpoint, tmp_path / "t", max_batch_size=1, max_input_len=8, max_seq_len=16,
                                max_draft_len=4, use_paged_context_fmha=False, executable="trtllm-build")
    assert argv[argv.index("--use_paged_context_fmha") + 1] == "disable"
    out = tmp_path / "engine"
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out), "--backend", "torch",
              "--use_paged_context_fmha", "disable", "--gemm_plugin", "float32", "--step_costs", "none")
    assert r.returncode == 0, r.stderr
    runner = load_runner(out)
    assert not runner.blocks.enable_reuse
    assert "built with --use_paged_context_fmha disable" in capsys.readouterr().err
