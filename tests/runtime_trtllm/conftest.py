"""Simulated environments for the TensorRT-LLM adapter's tests.

The tests must hold on any machine: without TensorRT-LLM (CI), and on the project's target
hardware (TensorRT-LLM installed, an Ampere-or-newer GPU). So no test asks the machine
whether TensorRT-LLM or a GPU is there; each one that cares sets the answer up here.
"""
from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Sequence

import pytest
import torch


def _forget_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def no_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without TensorRT-LLM: ``find_spec`` says None and ``import`` raises ImportError."""
    _forget_tensorrt_llm(monkeypatch)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)


@pytest.fixture
def importable_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A machine where ``import tensorrt_llm`` succeeds (an empty stand-in module)."""
    _forget_tensorrt_llm(monkeypatch)
    module = types.ModuleType("tensorrt_llm")
    module.__spec__ = importlib.machinery.ModuleSpec("tensorrt_llm", None)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    return module


def simulate_gpus(monkeypatch: pytest.MonkeyPatch, capabilities: Sequence[tuple[int, int]]) -> None:
    """Make ``torch.cuda`` report one visible GPU per compute capability given (none: no CUDA)."""
    caps = list(capabilities)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(caps))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(caps))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: caps[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"Simulated GPU {i} (sm_{caps[i][0]}{caps[i][1]})")


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    """A Hugging Face Llama folder as far as the adapter looks (its ``config.json``)."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64}))
    return d
