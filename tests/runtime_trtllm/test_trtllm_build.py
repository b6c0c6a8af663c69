"""trtllm-build command line and the atomic, streaming build runner."""
from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path

import pytest

from promptlookup.engine.trtllm_build import run_trtllm_build, trtllm_build_command
from promptlookup.errors import UserError

SIZES = dict(max_batch_size=4, max_input_len=3200, max_seq_len=4800, max_draft_len=10)


def flag_values(argv: list[str]) -> dict[str, str]:
    assert all(a.startswith("--") for a in argv[1::2]), argv
    return dict(zip(argv[1::2], argv[2::2]))


def test_command_has_the_prompt_lookup_flags():
    argv = trtllm_build_command("ckpt", "engine", **SIZES, gemm_plugin="float16")
    assert argv[0] == "trtllm-build"
    assert flag_values(argv) == {
        "--checkpoint_dir": "ckpt",
        "--output_dir": "engine",
        "--speculative_decoding_mode": "draft_tokens_external",
        "--max_draft_len": "10",
        "--use_paged_context_fmha": "enable",
        "--max_batch_size": "4",
        "--max_input_len": "3200",
        "--max_seq_len": "4800",
        "--gemm_plugin": "float16",
    }
    assert flag_values(trtllm_build_command("c", "e", **SIZES))["--gemm_plugin"] == "auto"


def test_extra_flags_are_appended_verbatim():
    argv = trtllm_build_command("c", "e", **SIZES, extra=["--workers", "2", "--remove_input_padding", "enable"])
    assert argv[-4:] == ["--workers", "2", "--remove_input_padding", "enable"]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(max_draft_len=0), "--max_draft_len"),
        (dict(max_batch_size=-1), "--max_batch_size"),
        (dict(max_input_len=5000), "exceeds --max_seq_len"),
        (dict(gemm_plugin=""), "--gemm_plugin"),
    ],
)
def test_bad_sizes_are_user_errors(change, message):
    with pytest.raises(UserError, match=message):
        trtllm_build_command("c", "e", **{**SIZES, **change})


def test_build_refuses_without_tensorrt_llm(tmp_path, no_tensorrt_llm):
    with pytest.raises(UserError, match="tensorrt_llm is not installed"):
        run_trtllm_build(tmp_path / "ckpt", tmp_path / "engine", **SIZES)
    assert not (tmp_path / "engine").exists()


def test_build_refuses_without_trtllm_build_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="not on PATH"):
        run_trtllm_build(tmp_path / "ckpt", tmp_path / "engine", **SIZES, require_tensorrt_llm=False)


FAKE_BUILD = """#!{python}
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
out = args["--output_dir"]
print("fake trtllm-build", " ".join(sys.argv[1:]), flush=True)
if os.environ.get("FAKE_BUILD_FAIL"):
    open(os.path.join(out, "rank0.engine"), "wb").write(b"half")
    print("building failed", flush=True)
    sys.exit(3)
json.dump({{"build_config": {{"max_draft_len": int(args["--max_draft_len"])}}}}, open(os.path.join(out, "config.json"), "w"))
open(os.path.join(out, "rank0.engine"), "wb").write(b"engine")
print("done", flush=True)
"""


@pytest.fixture
def fake_build(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "trtllm-build"
    exe.parent.mkdir()
    exe.write_text(FAKE_BUILD.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    return exe


def test_build_streams_output_and_lands_atomically(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_build.parent}{os.pathsep}{os.environ['PATH']}")
    out = io.StringIO()
    engine = run_trtllm_build(tmp_path / "ckpt", tmp_path / "engine", **SIZES, stream=out, require_tensorrt_llm=False)
    assert engine == tmp_path / "engine"
    assert (engine / "rank0.engine").read_bytes() == b"engine"
    log = out.getvalue()
    assert "fake trtllm-build" in log and "--speculative_decoding_mode draft_tokens_external" in log
    assert log.rstrip().endswith("done")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "ckpt", "engine"]  # no temporaries left


def test_failed_build_leaves_no_engine(tmp_path, fake_build, monkeypatch):
    monkeypatch.setenv("FAKE_BUILD_FAIL", "1")
    out = io.StringIO()
    with pytest.raises(UserError, match="exit code 3"):
        run_trtllm_build(
            tmp_path / "ckpt", tmp_path / "engine", **SIZES, stream=out, executable=str(fake_build),
            require_tensorrt_llm=False,
        )
    assert "building failed" in out.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "ckpt"]


def test_missing_checkpoint_config_is_a_user_error(tmp_path, fake_build):
    with pytest.raises(UserError, match="no config.json"):
        run_trtllm_build(
            tmp_path / "nowhere", tmp_path / "engine", **SIZES, executable=str(fake_build), require_tensorrt_llm=False
        )
