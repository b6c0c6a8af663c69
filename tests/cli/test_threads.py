"""--num_threads: the default, PyTorch's setting, OpenMP's wait policy, and the recorded count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from promptlookup import threads
from promptlookup.errors import UserError
from tests.cli.test_run_cli import TEXT, run_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cpus, expected", [(1, 1), (2, 2), (3, 2), (4, 2), (6, 3), (8, 4), (64, 4)])
def test_default_is_half_the_available_cpus_at_least_two_capped(monkeypatch, cpus, expected):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert threads.default_num_threads() == expected


@pytest.mark.parametrize("value, expected", [("3", 3), ("2,1", 2), ("0", 2), ("x", 2)])
def test_default_follows_omp_num_threads_when_valid(monkeypatch, value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert threads.default_num_threads() == expected  # invalid values fall back to the CPU rule


def test_configure_threads_sets_torch_and_refuses_zero():
    before = torch.get_num_threads()
    try:
        assert threads.configure_threads(2) == 2 and torch.get_num_threads() == 2
        with pytest.raises(UserError, match="--num_threads must be a positive integer, got 0"):
            threads.configure_threads(0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("preset, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_scripts_ask_openmp_to_wait_passively_unless_told_otherwise(preset, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    code = "import os, promptlookup.cli.run; import torch; print(os.environ['OMP_WAIT_POLICY'])"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == expected, r.stderr


def test_run_records_the_thread_count(tiny_engine_dir, tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--max_output_len", "4",
                "--num_threads", "2", "--output_json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["config"]["num_threads"] == 2
    assert "; 2 CPU thread(s)" in r.stdout


def test_run_refuses_zero_threads(tmp_path):
    r = run_cli("--engine_dir", str(tmp_path), "--input_text", TEXT, "--num_threads", "0")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --num_threads must be a positive integer, got 0"]


def test_the_runtime_config_carries_the_thread_count(tiny_engine_dir):
    """--num_threads travels inside RuntimeConfig: load_runner applies it; a bad one is refused as the flag."""
    from promptlookup.engine.load import load_runner
    from promptlookup.runtime.options import RuntimeConfig

    with pytest.raises(UserError, match="--num_threads must be a positive integer, got 0"):
        RuntimeConfig(num_threads=0)
    before = torch.get_num_threads()
    try:
        load_runner(tiny_engine_dir, RuntimeConfig(device="cpu", num_threads=2))
        assert torch.get_num_threads() == 2
        load_runner(tiny_engine_dir, RuntimeConfig(device="cpu"))  # None: PyTorch's count is left as it is
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_llm_api_takes_the_runtime_config_whole(tiny_engine_dir):
    from promptlookup.api import LLM, RuntimeConfig

    with pytest.raises(UserError, match="not both"):
        LLM(str(tiny_engine_dir), device="cpu", runtime_config=RuntimeConfig(device="cpu"))
    with pytest.raises(UserError, match="must be a RuntimeConfig"):
        LLM(str(tiny_engine_dir), runtime_config={"device": "cpu"})
    before = torch.get_num_threads()
    try:
        with LLM(str(tiny_engine_dir), runtime_config=RuntimeConfig(device="cpu", num_threads=2)) as llm:
            assert torch.get_num_threads() == 2 and llm.runner.describe()["device"] == "cpu"
    finally:
        torch.set_num_threads(before)


def test_other_tools_run_with_the_users_wait_policy(monkeypatch):
    """The PASSIVE policy our scripts add is ours: a peer run as a subprocess (llama.cpp in a
    benchmark) gets the environment without it, and keeps a policy the user set."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "_POLICY_SET_HERE", False)
    threads.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in threads.users_environment()
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setattr(threads, "_POLICY_SET_HERE", False)
    threads.prefer_passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and threads.users_environment()["OMP_WAIT_POLICY"] == "ACTIVE"
