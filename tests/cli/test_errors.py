"""Bad input is one line on stderr and exit code 2 in every script,
and the exits that are not errors (a closed pipe, a late Ctrl-C) leave no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.test_build_cli import build
from tests.cli.test_run_cli import TEXT, run_cli

ROOT = Path(__file__).resolve().parents[2]


def assert_one_line(proc, fragment: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def _latin1(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    return str(path)


@pytest.mark.parametrize("name, text", [("p.txt", "caf\xe9 au lait"), ("p.csv", "1,2,3\n4,\xe9\n")])
def test_non_utf8_input_file(tiny_engine_dir, tmp_path, name, text):
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_file", _latin1(tmp_path, name, text))
    assert_one_line(r, "is not UTF-8 text")


def test_directory_as_input_file(tiny_engine_dir, tmp_path):
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_file", str(tmp_path))
    assert_one_line(r, f"--input_file {tmp_path} is a directory; name a file")


@pytest.mark.parametrize("target, fragment", [
    ("DIR", "is a directory; name a file"),
    ("/proc/x/out.json", "--output_json /proc/x/out.json: cannot write in /proc"),
])
def test_output_json_is_checked_before_loading(tmp_path, target, fragment):
    target = str(tmp_path) if target == "DIR" else target
    # The engine does not even exist: the output is checked first, so nothing is loaded.
    r = run_cli("--engine_dir", str(tmp_path / "no_engine"), "--input_text", TEXT, "--output_json", target)
    assert_one_line(r, fragment)


@pytest.mark.parametrize("flag, value", [("--temperature", "nan"), ("--temperature", "inf"),
                                         ("--top_p", "nan")])
def test_non_finite_sampling_values(tmp_path, flag, value):
    r = run_cli("--engine_dir", str(tmp_path), "--input_text", TEXT, flag, value)
    assert_one_line(r, f"argument {flag}: expected a finite number, got '{value}'")


def test_end_id_outside_the_vocabulary(tiny_engine_dir):
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--end_id", "10000000")
    assert_one_line(r, "--end_id 10000000 is outside the engine's vocabulary (0..")
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--end_id", "-1")
    assert_one_line(r, "--end_id -1 is outside the engine's vocabulary")


@pytest.mark.parametrize("extra, named", [
    (["--ngram_static_cache", "x.ngc"], "--ngram_static_cache applies"),
    (["--ngram_dynamic_cache", "x.ngc", "--drafter_mode", "longest"], "--drafter_mode, --ngram_dynamic_cache apply"),
    (["--no-is_keep_all"], "--is_keep_all applies"),
    (["--workflow", "v2"], "--workflow applies"),
    (["--adaptive_draft"], "--adaptive_draft applies"),
])
def test_drafting_flags_without_prompt_lookup_config(tmp_path, extra, named):
    r = run_cli("--engine_dir", str(tmp_path), "--input_text", TEXT, *extra)
    assert_one_line(r, f"{named} only to prompt lookup, which is off; add --prompt_lookup_config")


def test_abbreviations_are_refused(tmp_path):
    r = run_cli("--engine_dir", str(tmp_path), "--input_text", TEXT, "--max_tokens", "60")
    assert_one_line(r, "unrecognized arguments: --max_tokens 60")


def test_gemm_plugin_banana(tmp_path):
    r = build("--checkpoint_dir", str(tmp_path), "--output_dir", str(tmp_path / "e"), "--gemm_plugin", "banana")
    assert_one_line(r, "argument --gemm_plugin: invalid choice: 'banana'")


def _with_closed_reader(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` with stdout a pipe whose reading end is already closed (as after ``| head``)."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
        return subprocess.run(argv, cwd=ROOT, env=env, stdout=write_fd, stderr=subprocess.PIPE, text=True,
                              timeout=300, **kwargs)
    finally:
        os.close(write_fd)


def test_streaming_into_a_closed_pipe(tiny_engine_dir):
    r = _with_closed_reader([sys.executable, "run.py", "--engine_dir", str(tiny_engine_dir), "--input_text", TEXT,
                             "--streaming", "--max_output_len", "8"])
    assert r.returncode == 141 and r.stderr == "", r.stderr


def test_streaming_into_a_closed_pipe_still_writes_the_output_json(tiny_engine_dir, tmp_path):
    """``run.py --streaming --output_json r.json | head -1``: the JSON asked for, then exit 141."""
    out = tmp_path / "r.json"
    r = _with_closed_reader([sys.executable, "run.py", "--engine_dir", str(tiny_engine_dir), "--input_text", TEXT,
                             "--streaming", "--max_output_len", "8", "--output_json", str(out)])
    assert r.returncode == 141 and r.stderr == "", r.stderr
    seq = json.loads(out.read_text())["sequences"][0]
    assert seq["generated_tokens"] == len(seq["output_ids"]) > 0


def test_stream_printer_stops_writing_at_a_closed_pipe():
    from promptlookup.stream_output import StreamPrinter
    from promptlookup.runtime.results import StepEvent

    class Closed:
        writes = 0

        def write(self, text):
            Closed.writes += 1
            raise BrokenPipeError

        def flush(self):
            pass

    class Tok:
        def decode(self, ids, **_):
            return "".join(f"<{t}>" for t in ids)

    printer = StreamPrinter(Tok(), Closed(), color=False, num_sequences=1)
    printer.on_step(StepEvent(0, [1, 2], 0))
    printer.on_step(StepEvent(0, [3], 0))
    assert printer.pipe_closed and Closed.writes == 1
    assert printer.finish() == ["<1><2><3>"] and Closed.writes == 1


def test_ngram_cache_inspect_into_a_closed_pipe(tmp_path):
    from promptlookup.drafting import NgramCache, TokenizerIdentity

    cache = NgramCache(2)
    cache.update([1, 2, 3, 1, 2, 4])
    cache.save(tmp_path / "c.ngc", TokenizerIdentity.from_vocab({f"t{i}": i for i in range(8)}, "toy"))
    r = _with_closed_reader([sys.executable, "-m", "promptlookup.cli.ngram_cache", "inspect", str(tmp_path / "c.ngc")])
    assert r.returncode == 141 and r.stderr == "", r.stderr


def test_ngram_cache_create_output_is_a_directory(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"tokenizer": {"name": "toy", "vocab_size": 8, "vocab_sha256": "0" * 64},
                                                 "sequences": [[1, 2, 3]]}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "promptlookup.cli.ngram_cache", "create", str(tmp_path / "t.json"),
                        "--output", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert_one_line(r, f"--output {tmp_path} is a directory; name a file")


LATE_INTERRUPT = textwrap.dedent("""
    import os, signal, threading
    from promptlookup.errors import run_cli

    # A shell may start background jobs with SIGINT ignored; a terminal's Ctrl-C is not.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt_once_done():
        # Wait until run_cli has taken over SIGINT (main has returned), then press Ctrl-C.
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            threading.Event().wait(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    def main(argv):
        threading.Thread(target=interrupt_once_done).start()  # not a daemon: shutdown waits for it
        print("converted")
        return 0

    run_cli(main)
""")


def test_ctrl_c_as_the_work_finishes_exits_130_without_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", LATE_INTERRUPT], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 130, (r.stdout, r.stderr)
    assert r.stdout == "converted\n" and r.stderr == "error: interrupted\n"


def test_interrupt_during_the_final_rename_is_delivered_after_it(tmp_path, monkeypatch):
    import signal

    from promptlookup import fsutil

    real_rename = os.rename

    def rename_interrupted(src, dst):  # Ctrl-C lands exactly while the output is being replaced
        signal.raise_signal(signal.SIGINT)  # to this (the main) thread, so it is handled synchronously
        real_rename(src, dst)

    monkeypatch.setattr(fsutil.os, "rename", rename_interrupted)
    # Ctrl-C as in a terminal, whatever SIGINT disposition the test runner was started with
    # (a shell may start background jobs with SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with fsutil.atomic_output_dir(tmp_path / "out", "test") as tmp:
                (tmp / "data").write_text("x")
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    assert (tmp_path / "out" / "data").read_text() == "x"  # the replacement completed first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("code, why", [(28, "free space there"), (30, "it is read-only"), (13, "it is not writable")])
def test_a_write_the_file_system_refuses_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, code, why):
    """A full disk, a read-only or a forbidden folder: one line naming the path and the fix,
    the temporary removed, an existing output untouched."""
    import errno

    from promptlookup import fsutil
    from promptlookup.errors import UserError

    assert (errno.ENOSPC, errno.EROFS, errno.EACCES) == (28, 30, 13)
    with fsutil.atomic_output_dir(tmp_path / "out", "test") as tmp:
        (tmp / "old").write_text("kept")
    with pytest.raises(UserError, match=rf"cannot write .*big: .*; {why}, or choose another --output_dir"):
        with fsutil.atomic_output_dir(tmp_path / "out", "test") as tmp:
            raise OSError(code, os.strerror(code), str(tmp / "big"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / "old").read_text() == "kept"

    monkeypatch.setattr(fsutil.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(code, os.strerror(code))))
    with pytest.raises(UserError, match=rf"cannot write .*r.json: .*; {why}, or choose another path"):
        fsutil.atomic_write_json(tmp_path / "r.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_other_os_errors_are_not_dressed_up(tmp_path):
    """Only what the file system refused becomes a one-line error; anything else is a bug to see."""
    import errno

    from promptlookup import fsutil

    with pytest.raises(FileNotFoundError):
        with fsutil.atomic_output_dir(tmp_path / "out", "test"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "gone")
    assert list(tmp_path.iterdir()) == []


def test_build_on_a_full_disk_is_one_line(tiny_engine_dir, tmp_path):
    """build.sh where the disk fills up while the weights are copied (as a fresh clone on a full
    disk met it): exit 2, one line, no half-written engine."""
    script = textwrap.dedent(f"""
        import errno, os, shutil, sys
        def full(src, dst, **kw):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        shutil.copyfile = full
        from promptlookup.cli.build import main
        from promptlookup.errors import run_cli
        run_cli(main, ["--checkpoint_dir", {str(tiny_engine_dir)!r}, "--output_dir", {str(tmp_path / "engine")!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert_one_line(proc, "No space left on device; free space there, or choose another --output_dir")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_for_an_engine_and_an_empty_input_file_name_what_they_are(tmp_path):
    from promptlookup.cli.inputs import collect_prompts
    from promptlookup.engine.config import read_engine_config
    from promptlookup.errors import UserError

    (tmp_path / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM", "dtype": "float32"}))
    with pytest.raises(UserError, match=r"is a checkpoint \(convert_checkpoint.py's output\), not an engine; build one "
                                        r"from it: ./build.sh --checkpoint_dir"):
        read_engine_config(tmp_path)
    empty = tmp_path / "prompts.json"
    empty.write_text("[]")
    with pytest.raises(UserError, match=f"--input_file {empty} holds no prompt"):
        collect_prompts(None, str(empty), None, False, None)
