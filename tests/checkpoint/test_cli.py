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
    # weight-only quantization (the tiny model: hidden 64, 4 heads of 16, intermediate 128)
    "int3": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision", "int3"],
             "invalid choice: 'int3'"),
    "precision without use_weight_only": (lambda t, h: ["--model_dir", str(h), "--weight_only_precision", "int4"],
                                          "--weight_only_precision needs --use_weight_only"),
    "per_group without use_weight_only": (lambda t, h: ["--model_dir", str(h), "--per_group"],
                                          "--per_group needs --use_weight_only"),
    "quantize_lm_head without use_weight_only": (lambda t, h: ["--model_dir", str(h), "--quantize_lm_head"],
                                                 "--quantize_lm_head needs --use_weight_only"),
    "int8 per group, default group size": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--per_group"],
                                           "--group_size 128 does not divide the model's hidden size 64"),
    "group size without per_group": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision",
                                                   "int4", "--group_size", "32"], "--group_size applies with --per_group"),
    "int4 without per_group": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision",
                                             "int4"], "--weight_only_precision int4 needs --per_group"),
    "default group size does not divide hidden": (
        lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision", "int4", "--per_group"],
        "--group_size 128 does not divide the model's hidden size 64"),
    "group size does not divide hidden": (
        lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision", "int4", "--per_group",
                      "--group_size", "48"], "--group_size 48 does not divide the model's hidden size 64"),
    "odd group size": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision", "int4",
                                     "--per_group", "--group_size", "1"], "--group_size must be an even number"),
    "tp cuts a group": (lambda t, h: ["--model_dir", str(h), "--use_weight_only", "--weight_only_precision", "int4",
                                      "--per_group", "--group_size", "64", "--tp_size", "2"],
                        "--tp_size 2 cuts the int4 groups"),
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


def _metadata_only_gguf(path, arch="llama", heads=4, layers=2):
    """A GGUF file with a Llama's metadata and no tensors, written by the gguf package."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(heads)
    writer.add_head_count_kv(2)
    writer.add_token_list([f"t{i}".encode() for i in range(300)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_is_read_without_the_weights(tmp_path):
    from promptlookup.checkpoint.gguf_header import read_gguf_geometry

    arch, geometry = read_gguf_geometry(_metadata_only_gguf(tmp_path / "m.gguf"))
    assert arch == "llama"
    assert geometry == {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300}


@pytest.mark.parametrize("flags, fragment", [
    (["--tp_size", "3"], "tp_size 3 does not divide the model's 4 attention heads"),
    (["--pp_size", "3"], "pp_size 3 is larger than the model's 2 layers"),
])
def test_gguf_split_is_checked_before_loading(tmp_path, flags, fragment):
    gguf = _metadata_only_gguf(tmp_path / "m.gguf")
    proc = run_convert("--gguf_file", str(gguf), "--output_dir", str(tmp_path / "out"), *flags)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr
    assert "loading" not in proc.stdout and not (tmp_path / "out").exists()


def test_non_llama_gguf_is_refused_before_loading(tmp_path):
    gguf = _metadata_only_gguf(tmp_path / "g.gguf", arch="gpt2")
    proc = run_convert("--gguf_file", str(gguf), "--output_dir", str(tmp_path / "out"))
    assert proc.returncode == 2 and "holds a 'gpt2' model" in proc.stderr and "loading" not in proc.stdout


def test_converted_checkpoint_as_model_dir_is_named_as_such(tmp_path):
    from promptlookup.checkpoint.convert import convert_model

    ckpt = convert_model(tiny_llama(), None, tmp_path / "ckpt", dtype="float32")
    proc = run_convert("--model_dir", str(ckpt), "--output_dir", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {ckpt} is already a converted TensorRT-LLM checkpoint, not a Hugging Face model; "
        f"build an engine from it with build.sh --checkpoint_dir {ckpt}"]
