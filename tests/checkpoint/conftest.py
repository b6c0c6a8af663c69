"""Shared helpers for the checkpoint tests: running ``convert_checkpoint.py`` as users do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "convert_checkpoint.py"


def run_convert(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python convert_checkpoint.py ARGS`` offline; return the completed process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def leftovers(parent: Path, name: str) -> list[str]:
    """Entries in ``parent`` that a conversion to ``parent/name`` could have left behind."""
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))


@pytest.fixture
def ids():
    """A deterministic batch of token ids valid for every tiny vocabulary used here."""
    import torch

    return torch.randint(0, 500, (2, 11), generator=torch.Generator().manual_seed(1234))
