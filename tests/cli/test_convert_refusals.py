"""``convert_checkpoint.py`` (and ``python -m promptlookup.cli.convert``) refuse what they cannot
convert faithfully: exit 2, one ``error:`` line naming the value and the fix, no traceback,
nothing written. A model whose weights are not exactly its config's Llama is refused rather
than converted with tensors silently dropped."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.checkpoint.conftest import ROOT, run_convert
from tests.tiny import tiny_llama


@pytest.fixture
def hf_dir(tmp_path):
    path = tmp_path / "hf"
    tiny_llama(seed=7).save_pretrained(path)
    return path


def _assert_refused(proc: subprocess.CompletedProcess, fragment: str) -> str:
    """Exit 2, the last stderr line the only ``error:`` line (progress bars aside), no traceback."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    assert fragment in errors[0] and "Traceback" not in proc.stderr
    return errors[0]


def _edit_config(hf_dir, **changes):
    path = hf_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_python_m_runs_the_converter(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "promptlookup.cli.convert", "--model_dir", str(tmp_path / "nope"),
                           "--output_dir", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120)
    _assert_refused(proc, "does not exist")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--model_dir", "--gguf_file", "--output_dir"])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path, hf_dir, flag):
    work = tmp_path / "work"
    work.mkdir()
    argv = {"--model_dir": ["--model_dir", ""], "--gguf_file": ["--gguf_file", ""],
            "--output_dir": ["--model_dir", str(hf_dir), "--output_dir", ""]}[flag]
    line = _assert_refused(run_convert(*argv, cwd=work), "expected a path, got an empty string")
    assert flag in line and list(work.iterdir()) == []


@pytest.mark.parametrize("changes, fragment", [
    ({"attention_bias": True}, "sets attention_bias; Llama variants with attention or MLP biases are not supported"),
    ({"mlp_bias": True}, "sets mlp_bias;"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}},
     "pre-quantized model (quantization_config, quant_method 'gptq'), which cannot be converted; convert the float"),
])
def test_config_refusals_come_before_loading_the_weights(tmp_path, hf_dir, changes, fragment):
    _edit_config(hf_dir, **changes)
    proc = run_convert("--model_dir", str(hf_dir), "--output_dir", str(tmp_path / "out"))
    _assert_refused(proc, fragment)
    assert "loading" not in proc.stdout and not (tmp_path / "out").exists()


def test_a_gguf_folder_given_as_model_dir_names_the_gguf_flag(tmp_path):
    folder = tmp_path / "gguf_folder"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF")
    proc = run_convert("--model_dir", str(folder), "--output_dir", str(tmp_path / "out"))
    _assert_refused(proc, f"holds a GGUF file; convert it with --gguf_file {folder / 'model.gguf'}")


def _rewrite_weights(hf_dir, edit) -> None:
    path = hf_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


WEIGHT_CASES = {
    # a bias the config does not declare: transformers drops it without an error
    "extra tensor": (lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.ones(64)}),
                     "hold 1 tensors a Llama of its config.json does not have "
                     "(e.g. model.layers.0.self_attn.q_proj.bias), which the conversion would drop"),
    "tensor of another shape": (lambda t: t.update({"model.layers.1.mlp.up_proj.weight": torch.ones(100, 64)}),
                                "1 tensors have another shape (e.g. model.layers.1.mlp.up_proj.weight: (100, 64) "
                                "stored, (128, 64) expected)"),
    "missing tensor": (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
                       "are incomplete: missing 1 tensors (e.g. model.layers.1.mlp.up_proj.weight)"),
}


@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_weights_that_are_not_the_configs_llama_are_refused_in_one_line(tmp_path, hf_dir, case):
    edit, fragment = WEIGHT_CASES[case]
    _rewrite_weights(hf_dir, edit)
    proc = run_convert("--model_dir", str(hf_dir), "--output_dir", str(tmp_path / "out"))
    _assert_refused(proc, fragment)
    assert "LOAD REPORT" not in proc.stderr  # transformers' multi-line table is not shown
    assert not (tmp_path / "out").exists()
