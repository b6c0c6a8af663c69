"""build.sh refuses, in one line and before it imports torch where it can, every flag it
would otherwise take and ignore: limits below 1 (``--max_seq_len 0`` is not "the default"),
--device and --num_threads where nothing is measured or compiled, a speculative decoding
mode without --max_draft_len, and a --max_input_len that leaves the default --max_seq_len
no room."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_build_cli import build
from tests.cli.test_fast_refusals import refuse

MAX_POS = 8192  # SmolLM2's


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from promptlookup.checkpoint.convert import convert_model
    from tests.tiny import tiny_llama

    return convert_model(tiny_llama(), None, tmp_path_factory.mktemp("ck") / "ckpt", dtype="float32")


def _checkpoint_config(tmp_path: Path) -> Path:
    """A checkpoint directory as far as its config.json goes (no weights: a refusal that
    comes before loading them never notices)."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architecture": "LlamaForCausalLM", "dtype": "float32", "vocab_size": 512,
        "max_position_embeddings": MAX_POS, "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}))
    return d


@pytest.mark.parametrize("extra, line", [
    (["--max_seq_len", "0", "--step_costs", "none", "--max_input_len", "64"], "error: --max_seq_len must be at least 1, got 0; pass"),
    (["--max_seq_len", "-5"], "error: --max_seq_len must be at least 1, got -5"),
    (["--max_input_len", "0"], "error: --max_input_len must be at least 1, got 0"),
    (["--max_batch_size", "0"], "error: --max_batch_size must be at least 1, got 0"),
    (["--max_draft_len", "-2", "--speculative_decoding_mode", "draft_tokens_external"],
     "error: --max_draft_len must be 0 or more, got -2"),
    (["--max_input_len", "600", "--max_seq_len", "512"],
     "error: --max_seq_len 512 must exceed --max_input_len 600; pass a larger --max_seq_len or a smaller --max_input_len"),
    (["--device", "cuda:3", "--num_threads", "7", "--step_costs", "none"],
     "error: --device cuda:3 is read only to measure step costs or compile a PyTorch engine, and --step_costs none "
     "with --torch_compile off does neither; drop --device, or pass --step_costs measure"),
    (["--num_threads", "7", "--step_costs", "none"], "error: --num_threads 7 is read only to measure step costs"),
    (["--num_threads", "0"], "error: --num_threads must be a positive integer, got 0"),
    (["--speculative_decoding_mode", "lookahead_decoding"],
     "error: --speculative_decoding_mode lookahead_decoding needs --max_draft_len of at least 1 (got 0)"),
    (["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "0"],
     "error: --speculative_decoding_mode draft_tokens_external needs --max_draft_len of at least 1 (got 0)"),
    (["--max_input_len", str(MAX_POS)],
     f"error: --max_input_len {MAX_POS} leaves no room for output: the model's max_position_embeddings is {MAX_POS}, "
     f"which caps --max_seq_len (default: max_input_len + 1024); pass --max_input_len below {MAX_POS}"),
])
def test_bad_flag_is_one_line_before_torch_loads(tmp_path, extra, line):
    out = tmp_path / "engine"
    code, heavy, stderr = refuse("promptlookup.cli.build", ["--checkpoint_dir", str(_checkpoint_config(tmp_path)),
                                                            "--output_dir", str(out), *extra])
    assert code == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(line), stderr
    assert "Traceback" not in stderr
    assert heavy == [], f"{heavy} imported before the refusal"
    assert not out.exists()


def test_a_missing_device_is_refused_before_the_weights_load(tmp_path):
    """--device cuda:99 where step costs are measured: the checkpoint has no weights, so
    only a refusal that comes before loading them names the device."""
    out = tmp_path / "engine"
    code, _, stderr = refuse("promptlookup.cli.build", ["--checkpoint_dir", str(_checkpoint_config(tmp_path)),
                                                        "--output_dir", str(out), "--device", "cuda:99",
                                                        "--max_input_len", "64"])
    assert code == 2 and stderr == "error: --device cuda:99 is not available here; use cpu or auto", stderr
    assert not out.exists()


@pytest.mark.parametrize("backend", ["trtllm", "auto"])
@pytest.mark.parametrize("extra, line", [
    (["--device", "cpu"], "error: --device cpu is read only to measure step costs or compile a PyTorch engine, and "),
    (["--num_threads", "2"], "error: --num_threads 2 is read only to measure step costs or compile a PyTorch engine"),
    (["--step_costs", "measure"], "error: --step_costs measure applies to PyTorch engines"),
])
def test_torch_only_flags_are_refused_for_a_tensorrt_llm_engine(tmp_path, monkeypatch, capsys, backend, extra, line):
    from promptlookup.cli.build import main
    from promptlookup.errors import run_cli

    monkeypatch.setattr("promptlookup.runtime.trtllm.env.trtllm_unavailable_reason", lambda: None)  # it could run
    out = tmp_path / "engine"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["--checkpoint_dir", str(_checkpoint_config(tmp_path)), "--output_dir", str(out),
                       "--backend", backend, "--max_draft_len", "4", "--speculative_decoding_mode",
                       "draft_tokens_external", *extra])
    assert exit_info.value.code == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(line), err
    assert ("--backend auto chose TensorRT-LLM here" in err and "--backend torch" in err) == (backend == "auto"), err
    assert not out.exists()


def test_a_tensorrt_llm_engine_without_max_draft_len_is_refused_before_the_checkpoint_is_read(tmp_path, monkeypatch,
                                                                                              capsys):
    from promptlookup.cli.build import main
    from promptlookup.errors import run_cli

    monkeypatch.setattr("promptlookup.runtime.trtllm.env.trtllm_unavailable_reason", lambda: None)  # it could run
    monkeypatch.setattr("promptlookup.cli.build.read_checkpoint_config", lambda *a: pytest.fail("read the checkpoint"))
    out = tmp_path / "engine"
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ["--checkpoint_dir", str(_checkpoint_config(tmp_path)), "--output_dir", str(out),
                       "--backend", "trtllm"])
    assert exit_info.value.code == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("error: a TensorRT-LLM engine is built with --speculative_decoding_mode "
                          "draft_tokens_external, which needs --max_draft_len") and not out.exists()


def test_tensorrt_llm_gets_tokens_per_block_and_takes_step_costs_none(tmp_path, monkeypatch, capsys):
    """--tokens_per_block reaches trtllm-build (it was dropped); --step_costs none is what a
    TensorRT-LLM engine has anyway, so it is accepted."""
    from promptlookup.cli.build import main

    calls = []
    monkeypatch.setattr("promptlookup.runtime.trtllm.env.trtllm_unavailable_reason", lambda: None)
    monkeypatch.setattr("promptlookup.engine.trtllm_build.run_trtllm_build", lambda *a, **kw: calls.append(kw))
    argv = ["--checkpoint_dir", str(_checkpoint_config(tmp_path)), "--output_dir", str(tmp_path / "engine"),
            "--backend", "trtllm", "--max_draft_len", "4", "--speculative_decoding_mode", "draft_tokens_external",
            "--step_costs", "none"]
    assert main([*argv, "--tokens_per_block", "64"]) == 0
    assert main(argv) == 0
    assert [tuple(c["extra"]) for c in calls] == [("--tokens_per_block", "64"), ()]
    assert calls[0]["max_seq_len"] == 1024 + 1024 and calls[0]["max_draft_len"] == 4


def test_lookahead_engine_with_the_default_seq_len_at_the_model_limit(tiny_checkpoint, tmp_path):
    """A mode with --max_draft_len builds; with --max_input_len near the model's limit the
    default --max_seq_len is that limit (2048 for the tiny model)."""
    out = tmp_path / "engine"
    r = build("--checkpoint_dir", str(tiny_checkpoint), "--output_dir", str(out), "--backend", "torch",
              "--speculative_decoding_mode", "lookahead_decoding", "--max_draft_len", "16",
              "--max_input_len", "2000", "--step_costs", "none")
    assert r.returncode == 0, r.stderr
    b = json.loads((out / "config.json").read_text())["build_config"]
    assert (b["max_input_len"], b["max_seq_len"], b["max_draft_len"]) == (2000, 2048, 16)
    assert b["speculative_decoding_mode"] == "lookahead_decoding"
