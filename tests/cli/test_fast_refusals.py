"""Input a CLI can check without a model is refused before torch or transformers is imported
(importing them takes seconds here; a one-line error should not): each case runs the script's
``main`` in a fresh interpreter and asserts the exit code, the line, and which heavy modules
were loaded by then. No timing is read."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
from promptlookup.errors import run_cli
from {module} import main
try:
    run_cli(main, {argv!r})
except SystemExit as exc:
    print(json.dumps([exc.code, [m for m in ("torch", "transformers") if m in sys.modules]]))
"""


def refuse(module: str, argv: list[str]) -> tuple[int, list[str], str]:
    r = subprocess.run([sys.executable, "-c", PROBE.format(module=module, argv=argv)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    code, heavy = json.loads(r.stdout.strip().splitlines()[-1])
    return code, heavy, r.stderr.strip()


def _engine(tmp_path: Path) -> Path:
    """An engine directory as far as its config.json goes (the refusals read nothing more)."""
    d = tmp_path / "engine"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "backend": "torch", "pretrained_config": {"vocab_size": 512},
        "build_config": {"max_batch_size": 1, "max_input_len": 8, "max_seq_len": 16}}))
    (d / "rank0.safetensors").write_bytes(b"")
    return d


@pytest.mark.parametrize("case", ["build", "quickstart", "summarize", "run end_id", "run input file"])
def test_bad_input_is_one_line_before_torch_loads(tmp_path, case):
    missing = str(tmp_path / "missing")
    text = tmp_path / "p.txt"
    text.write_bytes("caf\xe9".encode("latin-1"))
    module, argv, line = {
        "build": ("promptlookup.cli.build", ["--checkpoint_dir", missing],
                  f"error: checkpoint directory {missing} does not exist"),
        "quickstart": ("promptlookup.cli.quickstart", ["--model_dir", missing], f"error: model {missing} does not exist"),
        "summarize": ("promptlookup.cli.summarize", ["--engine_dir", missing, "--test_trt_llm"],
                      f"error: engine directory {missing} does not exist"),
        "run end_id": ("promptlookup.cli.run", ["--engine_dir", str(_engine(tmp_path)), "--input_text", "x",
                                                "--end_id", "512"], "error: --end_id 512 is outside the engine's vocabulary"),
        "run input file": ("promptlookup.cli.run", ["--engine_dir", missing, "--input_file", str(text)],
                           f"error: --input_file {text} is not UTF-8 text"),
    }[case]
    code, heavy, stderr = refuse(module, argv)
    assert code == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(line), stderr
    assert heavy == [], f"{case}: {heavy} imported before the refusal"
