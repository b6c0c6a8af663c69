"""Output folders: the tools replace only what they wrote.

Every case reproduced in the issue, run as users run the scripts: each refusal is one
line, exit code 2, before anything is loaded, and leaves every file where it was.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from promptlookup.fsutil import MANIFEST
from tests.checkpoint.conftest import run_convert
from tests.cli.test_build_cli import build
from tests.tiny import tiny_llama


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(proc, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "model"
    tiny_llama(seed=5).save_pretrained(path)
    (path / "README.md").write_text("my model card")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from promptlookup.checkpoint.convert import convert_model

    return convert_model(tiny_llama(), None, tmp_path_factory.mktemp("ck") / "ckpt", dtype="float32")


def test_build_refuses_a_folder_with_unrelated_files(checkpoint, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot(out)
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out))
    one_error_line(r, str(out), "did not write", "notes.txt", "choose a new or empty folder")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporaries


def test_convert_refuses_its_own_model_dir_as_output(hf_dir):
    before = snapshot(hf_dir)
    r = run_convert("--model_dir", str(hf_dir), "--output_dir", str(hf_dir))
    one_error_line(r, f"--output_dir {hf_dir} is --model_dir", "outside the input")
    assert snapshot(hf_dir) == before


@pytest.mark.parametrize("where, relation", [("inside", "lies inside"), ("parent", "contains")])
def test_convert_refuses_an_output_inside_or_around_the_model_dir(hf_dir, where, relation):
    out = hf_dir / "ckpt" if where == "inside" else hf_dir.parent
    before = snapshot(hf_dir.parent)
    r = run_convert("--model_dir", str(hf_dir), "--output_dir", str(out))
    one_error_line(r, relation, "--model_dir")
    assert snapshot(hf_dir.parent) == before


def test_convert_refuses_a_folder_holding_the_gguf_file(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 16)
    r = run_convert("--gguf_file", str(gguf), "--output_dir", str(tmp_path))
    one_error_line(r, "contains --gguf_file")
    assert gguf.exists()


def test_build_refuses_the_checkpoint_dir_as_output(checkpoint):
    before = snapshot(checkpoint)
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(checkpoint))
    one_error_line(r, "is --checkpoint_dir")
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(checkpoint / "engine"))
    one_error_line(r, "lies inside --checkpoint_dir")
    assert snapshot(checkpoint) == before


@pytest.mark.parametrize("tool", ["convert", "build"])
def test_output_dir_dot_is_one_line_and_leaves_nothing(hf_dir, checkpoint, tmp_path, tool):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("x")
    if tool == "convert":
        r = run_convert("--model_dir", str(hf_dir), "--output_dir", ".", cwd=work)
    else:
        import os
        import subprocess

        from tests.cli.test_build_cli import ROOT

        r = subprocess.run([str(ROOT / "build.sh"), "--checkpoint_dir", str(checkpoint), "--output_dir", "."],
                           cwd=work, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                           timeout=300)
    one_error_line(r, "--output_dir . is the working directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no ..old-* or .tmp-* litter
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_rebuild_replaces_the_engine_it_wrote_and_marks_it(checkpoint, tmp_path):
    out = tmp_path / "engine"
    out.mkdir()  # an empty folder may be used
    for max_batch in ("2", "3"):
        r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out), "--max_batch_size", max_batch)
        assert r.returncode == 0, r.stderr
        assert json.loads((out / "config.json").read_text())["build_config"]["max_batch_size"] == int(max_batch)
    manifest = json.loads((out / MANIFEST).read_text())
    assert {k: manifest[k] for k in ("tool", "kind", "version")} == {"tool": "promptlookup", "kind": "engine",
                                                                     "version": 2}
    assert manifest["files"] == sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                                       if p.is_file() and p.name != MANIFEST)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_a_file_added_to_an_output_it_wrote_is_never_deleted(checkpoint, hf_dir, tmp_path):
    """Replacing an output of the same kind is refused once it holds a file the tool did not
    write (a user's notes): the replacement would delete it. An output from before the
    manifest listed its files is still replaced as before."""
    out = tmp_path / "engine"
    assert build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out)).returncode == 0
    (out / "NOTES.txt").write_text("mine")
    before = snapshot(out)
    one_error_line(build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out)),
                   "also holds files it did not write (NOTES.txt)", "move them out")
    assert snapshot(out) == before
    ckpt = tmp_path / "ckpt"
    assert run_convert("--model_dir", str(hf_dir), "--output_dir", str(ckpt)).returncode == 0
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "x.txt").write_text("mine")
    one_error_line(run_convert("--model_dir", str(hf_dir), "--output_dir", str(ckpt)), "(sub/x.txt)")
    assert (ckpt / "sub" / "x.txt").read_text() == "mine"
    (out / "NOTES.txt").unlink()
    old = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({"tool": "promptlookup", "kind": "engine", "version": 1}))
    assert build("--checkpoint_dir", str(checkpoint), "--output_dir", str(out)).returncode == 0
    assert json.loads((out / MANIFEST).read_text())["files"] == old["files"]


def test_build_refuses_to_replace_a_checkpoint_it_converted(checkpoint, tmp_path):
    from promptlookup.checkpoint.convert import convert_model

    other = convert_model(tiny_llama(seed=2), None, tmp_path / "other_ckpt", dtype="float32")
    assert json.loads((other / MANIFEST).read_text())["kind"] == "checkpoint"
    before = snapshot(other)
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", str(other))
    one_error_line(r, "holds a checkpoint written by promptlookup, not the engine")
    assert snapshot(other) == before


def test_unwritable_output_is_refused_before_loading(hf_dir, checkpoint):
    r = run_convert("--model_dir", str(hf_dir), "--output_dir", "/proc/x")
    one_error_line(r, "/proc", "choose a writable path")
    assert "loading" not in r.stdout
    r = build("--checkpoint_dir", str(checkpoint), "--output_dir", "/proc/x")
    one_error_line(r, "/proc", "choose a writable path")
