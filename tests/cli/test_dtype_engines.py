"""bfloat16 and float16 engines: convert_checkpoint.py --dtype -> build.sh -> run.py on the CPU.

An engine computes in its checkpoint's dtype (as trtllm-build's engines do); a dtype this
PyTorch cannot compute on the device is refused in one line, exit 2, before any request.
The scripts run in-process (their ``main``), which spares each a fresh torch import.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from promptlookup.cli import build as build_cli
from promptlookup.cli import convert as convert_cli
from promptlookup.cli import run as run_cli
from promptlookup.errors import UserError
from promptlookup.errors import run_cli as script
from tests.tiny import tiny_llama

DTYPES = ["bfloat16", "float16"]
TEXT = "one two three four five six. one two three four five six. one two three"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A tiny random Llama saved as a Hugging Face directory, with the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    out = tmp_path_factory.mktemp("hf_tiny")
    tiny_llama(seed=3, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=DTYPES)
def engine(request, hf_dir, tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp(request.param)
    assert convert_cli.main(["--model_dir", str(hf_dir), "--output_dir", str(root / "ckpt"),
                             "--dtype", request.param]) == 0
    assert build_cli.main(["--checkpoint_dir", str(root / "ckpt"), "--output_dir", str(root / "engine"),
                           "--max_input_len", "256", "--max_seq_len", "512", "--max_draft_len", "8",
                           "--speculative_decoding_mode", "draft_tokens_external", "--backend", "torch",
                           "--device", "cpu"]) == 0
    return request.param, root / "engine"


def test_the_engine_keeps_the_checkpoint_dtype(engine):
    from promptlookup.engine.load import load_runner

    dtype, path = engine
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["pretrained_config"]["dtype"] == dtype
    assert "cpu" in cfg["step_costs"]  # measured at build time, in that dtype
    runner = load_runner(path, device="cpu")
    assert runner.model.dtype == runner.pool.k[0].dtype == getattr(torch, dtype)


def test_run_py_plain_and_prompt_lookup(engine, tmp_path, capsys):
    """Both run to completion on the CPU. (Token identity is asserted in float32 only;
    in half precision the runs may part at near-ties: tests/runtime/test_half_precision.py.)
    float16 on a CPU without fast float16 kernels runs, with a note naming the fix."""
    dtype, path = engine
    outputs = {}
    for name, extra in (("plain", []), ("lookup", ["--prompt_lookup_config", "[4,2,[0]]"])):
        out = tmp_path / f"{name}.json"
        assert run_cli.main(["--engine_dir", str(path), "--input_text", TEXT, "--max_output_len", "24",
                             "--device", "cpu", "--output_json", str(out), *extra]) == 0
        outputs[name] = json.loads(out.read_text())["sequences"][0]
    assert 0 < len(outputs["plain"]["output_ids"]) <= 24
    assert 0 < len(outputs["lookup"]["output_ids"]) <= 24
    slow = dtype == "float16" and not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    notes = [line for line in capsys.readouterr().err.splitlines() if "no fast float16 kernels" in line]
    assert len(notes) == (2 if slow else 0)
    assert all(line.startswith("note: ") and "--dtype bfloat16" in line for line in notes)


def _half_precision_unsupported(monkeypatch) -> None:
    """A PyTorch without half-precision attention kernels (what older CPU builds lacked)."""
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, *args, **kwargs):
        if q.dtype in (torch.float16, torch.bfloat16):
            raise RuntimeError(f'"scaled_dot_product_attention" not implemented for \'{q.dtype}\'\n(details)')
        return real(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)


def test_an_unsupported_dtype_is_one_line_and_exit_2(engine, monkeypatch, capsys):
    dtype, path = engine
    _half_precision_unsupported(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        script(run_cli.main, ["--engine_dir", str(path), "--input_text", TEXT, "--device", "cpu"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    fix = "--dtype bfloat16 or float32" if dtype == "float16" else "--dtype float32"
    assert len(err) == 1 and err[0].startswith(f"error: this PyTorch cannot run a {dtype} engine on cpu"), err
    assert fix in err[0] and "rebuild the engine" in err[0]


def test_float32_needs_no_probe(monkeypatch):
    from promptlookup.runtime.base import EngineLimits
    from promptlookup.runtime.torch_runner import TorchRunner

    _half_precision_unsupported(monkeypatch)
    limits = EngineLimits(1, 16, 32, 4, 512)
    TorchRunner(tiny_llama(), limits, tokens_per_block=8)  # float32 runs
    with pytest.raises(UserError, match="cannot run a bfloat16 engine on cpu"):
        TorchRunner(tiny_llama().to(torch.bfloat16), limits, tokens_per_block=8)
