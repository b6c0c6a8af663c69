"""``run.py``'s sampling, streaming and colour flags, end to end on a tiny engine.

Most runs call ``promptlookup.cli.run.main`` in this process (cheap); the checks about
exit codes and about what reaches a *pipe* run ``run.py`` as a subprocess, as a user
would. Sampling noise is keyed by (seed, request, position) with a process-independent
hash, so a subprocess and this process sample the same tokens for the same seed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from promptlookup.cli.run import main

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["a b c d a b c d a b c d a b c", "The cat sat on the mat. The cat sat on the mat. The cat sat on the"]
SAMPLED = ["--temperature", "0.7", "--top_k", "3", "--top_p", "0.9", "--random_seed", "1"]
LOOKUP = ["--prompt_lookup_config", "[4,2,[0]]"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def base_args(engine: Path, out: Path, texts=TEXTS) -> list[str]:
    args = ["--engine_dir", str(engine), "--max_output_len", "24", "--output_json", str(out)]
    for t in texts:
        args += ["--input_text", t]
    return args


def run_here(engine: Path, tmp_path: Path, *extra: str, texts=TEXTS) -> dict:
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.json"
    assert main(base_args(engine, out, texts) + list(extra)) == 0
    return json.loads(out.read_text())


def run_subprocess(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def ids(result: dict) -> list[list[int]]:
    return [s["output_ids"] for s in result["sequences"]]


class Recorder:
    """A stdout stand-in that keeps every ``write`` separately (not a terminal)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def streamed_part(writes: list[str]) -> list[str]:
    """The writes before the final statistics line (``[plain decoding] ...``/``[prompt lookup ...``)."""
    end = max(i for i, w in enumerate(writes) if w.startswith(("[plain decoding]", "[prompt lookup ")))
    return writes[:end]


def test_sampling_flags_reach_the_runtime_and_lookup_keeps_the_tokens(tiny_engine_dir, tmp_path, capsys):
    plain = run_here(tiny_engine_dir, tmp_path, *SAMPLED)
    v1 = run_here(tiny_engine_dir, tmp_path, *SAMPLED, *LOOKUP, "--workflow", "v1")
    v2 = run_here(tiny_engine_dir, tmp_path, *SAMPLED, *LOOKUP)  # v2: the default
    assert plain["config"]["sampling"] == {"temperature": 0.7, "top_k": 3, "top_p": 0.9, "random_seed": 1,
                                           "repetition_penalty": 1.0, "presence_penalty": 0.0,
                                           "frequency_penalty": 0.0, "bad_words": [], "stop_words": [],
                                           "logit_bias": [], "min_tokens": 0, "logprobs": None,
                                           "stop_token_ids": []}
    assert ids(v1) == ids(plain) and ids(v2) == ids(plain)  # same seed: the same tokens
    assert v1["stats"]["drafted"] > 0 and v1["stats"]["accepted"] > 0  # drafts were checked, some kept
    other_seed = run_here(tiny_engine_dir, tmp_path, *SAMPLED[:-1], "2")
    greedy = run_here(tiny_engine_dir, tmp_path)
    assert ids(other_seed) != ids(plain)
    assert ids(greedy) != ids(plain)
    assert greedy["config"]["sampling"]["temperature"] == 0.0


@pytest.mark.parametrize(
    "flag,value",
    [("--temperature", "-0.5"), ("--top_p", "0"), ("--top_p", "1.5"), ("--top_k", "-1"), ("--top_k", "2.5")],
)
def test_bad_sampling_values_exit_2_with_one_line(tiny_engine_dir, tmp_path, flag, value):
    proc = run_subprocess(base_args(tiny_engine_dir, tmp_path / "out.json") + [flag, value])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("color", ["never", "always"])
def test_streamed_chunks_concatenate_to_the_final_text(tiny_engine_dir, tmp_path, monkeypatch, color):
    rec = Recorder()
    monkeypatch.setattr(sys, "stdout", rec)
    out = tmp_path / "out.json"
    assert main(base_args(tiny_engine_dir, out, TEXTS[:1]) + SAMPLED + LOOKUP + ["--streaming", "--color", color]) == 0
    final = json.loads(out.read_text())["sequences"][0]["text"]
    chunks = streamed_part(rec.writes)
    streamed = "".join(chunks)
    assert len([c for c in chunks if ANSI.sub("", c).strip()]) >= 3  # really streamed, piece by piece
    assert ANSI.sub("", streamed) == final + "\n"
    assert (ANSI.search(streamed) is not None) == (color == "always")


def test_piped_output_has_no_colour_codes_and_streams_the_same_text(tiny_engine_dir, tmp_path):
    """``--color`` alone means auto: a pipe is not a terminal, so no codes."""
    reference = run_here(tiny_engine_dir, tmp_path, *SAMPLED, texts=TEXTS[:1])
    out = tmp_path / "piped.json"
    proc = run_subprocess(base_args(tiny_engine_dir, out, TEXTS[:1]) + SAMPLED + LOOKUP + ["--streaming", "--color"])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert ids(result) == ids(reference)  # same seed, another process: the same tokens
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr
    assert proc.stdout.startswith(result["sequences"][0]["text"] + "\n")


def test_colour_always_marks_accepted_draft_text_in_a_pipe(tiny_engine_dir, tmp_path):
    out = tmp_path / "color.json"
    proc = run_subprocess(base_args(tiny_engine_dir, out, TEXTS[:1]) + LOOKUP + ["--color", "always"])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["stats"]["accepted"] > 0  # greedy on a repetitive prompt: drafts are kept
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Output [Text 0 Beam 0]:"))
    assert "\x1b[32m" in line
    assert ANSI.sub("", line) == f'Output [Text 0 Beam 0]: "{result["sequences"][0]["text"]}"'
