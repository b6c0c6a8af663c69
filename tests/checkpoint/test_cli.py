"""``convert_checkpoint.py`` end to end: success, and every bad input -> exit 2, one line, no output."""
from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from promptlookup.checkpoint.config import DTYPE_CHOICES
from promptlookup.checkpoint.load import load_checkpoint
from tests.checkpoint.conftest import leftovers, run_convert
from tests.tiny import tiny_llama


@pytest.fixture
def hf_dir(tmp_path):
    path = tmp_path / "hf"
    tiny_llama(seed=7).save_pretrained(path)
    return path


def test_converts_a_hugging_face_directory(tmp_path, hf_dir, ids):
    out = tmp_path / "ckpt"
    proc = run_convert("--model_dir", str(hf_dir), "--output_dir", str(out), "--tp_size", "2", "--pp_size", "2",
                       "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr
    assert f"checkpoint: {out.resolve()}" in proc.stdout
    assert "tp_size=2, pp_size=2" in proc.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2} and cfg["dtype"] == "float32"
    with torch.no_grad():
        assert torch.equal(load_checkpoint(out)(ids).logits, tiny_llama(seed=7)(ids).logits)
    assert leftovers(tmp_path, "ckpt") == ["ckpt"]


def test_default_output_dir_is_relative_to_the_working_directory(tmp_path, hf_dir):
    proc = run_convert("--model_dir", str(hf_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "tllm_checkpoint" / "config.json").read_text())["dtype"] == "float16"


def _write(path, content: bytes):
    path.write_bytes(content)
    return path


def _non_llama_dir(tmp_path):
    path = tmp_path / "gpt2"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    _write(path / "model.safetensors", b"")
    return path


def _no_weights_dir(tmp_path, hf_dir):
    (hf_dir / "model.safetensors").unlink()
    return hf_dir


CASES = {
    # name: (argv builder, expected fragment of the error line)
    "missing model dir": (lambda t, h: ["--model_dir", str(t / "nope")], "does not exist"),
    "empty model dir": (lambda t, h: ["--model_dir", str((t / "empty").mkdir() or t / "empty")], "is empty"),
    "model dir without weights": (lambda t, h: ["--model_dir", str(_no_weights_dir(t, h))], "has no weights"),
    "neither source": (lambda t, h: [], "one of the arguments --model_dir --gguf_file is required"),
    "both sources": (lambda t, h: ["--model_dir", str(h), "--gguf_file", "x.gguf"], "not allowed with"),
    "non-llama": (lambda t, h: ["--model_dir", str(_non_llama_dir(t))], "model_type 'gpt2'"),
    "tp does not divide heads": (lambda t, h: ["--model_dir", str(h), "--tp_size", "3"],
                                 "tp_size 3 does not divide the model's 4 attention heads"),
    "pp larger than layers": (lambda t, h: ["--model_dir", str(h), "--pp_size", "3"], "pp_size 3 is larger"),
    "zero tp": (lambda t, h: ["--model_dir", str(h), "--tp_size", "0"], "expected a positive integer"),
    "bad dtype": (lambda t, h: ["--model_dir", str(h), "--dtype", "float8"], "invalid choice: 'float8'"),
    "output under a file": (lambda t, h: ["--model_dir", str(h), "--output_dir",
                                          str(_write(t / "afile", b"x") / "out")], "is not a directory"),
    "output is a file": (lambda t, h: ["--model_dir", str(h), "--output_dir", str(_write(t / "out", b"x"))],
                         "exists and is not a directory"),
    "missing gguf": (lambda t, h: ["--gguf_file", str(t / "nope.gguf")], "does not exist"),
    "random bytes gguf": (lambda t, h: ["--gguf_file", str(_write(t / "r.gguf", os.urandom(4096)))],
                          "is not a GGUF file"),
    # Right magic and version, then garbage: only a real parse can tell (transformers loads it).
    "corrupt gguf": (lambda t, h: ["--gguf_file", str(_write(t / "c.gguf", b"GGUF" + struct.pack("<I", 3)
                                                               + os.urandom(2000)))],
                     "cannot read GGUF file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, hf_dir, case):
    build, fragment = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    argv = build(work, hf_dir)
    if "--output_dir" not in argv:
        argv += ["--output_dir", str(work / "ckpt")]
    before = sorted(p.name for p in work.iterdir())
    proc = run_convert(*argv)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    error_lines = [line for line in lines if line.startswith("error: ")]
    assert len(error_lines) == 1 and lines[-1] == error_lines[0], proc.stderr
    assert fragment in error_lines[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == before  # nothing created, no temp dirs left


def test_cli_dtype_choices_match_the_library():
    proc = run_convert("--help")
    assert proc.returncode == 0
    assert "{" + ",".join(DTYPE_CHOICES) + "}" in proc.stdout
