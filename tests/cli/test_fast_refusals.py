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


@pytest.mark.parametrize("case", ["both prompts", "no prompt", "kv fraction", "kv tokens", "seed at greedy",
                                  "v1 candidates", "json over prompt file", "json in engine", "json is csv",
                                  "npy under /proc", "reuse on fmha-disabled engine"])
def test_run_py_refuses_before_loading(tmp_path, case):
    """run.py's refusals that need no model, each one line and exit 2 before torch is imported,
    and nothing written: an output may not replace the run's input (the prompt file, a file of the
    engine) nor another output."""
    engine = _engine(tmp_path)
    prompt = tmp_path / "prompts.json"
    prompt.write_text('["The cat sat on the mat."]')
    if case == "reuse on fmha-disabled engine":
        cfg = json.loads((engine / "config.json").read_text())
        cfg["build_config"]["plugin_config"] = {"use_paged_context_fmha": False}
        (engine / "config.json").write_text(json.dumps(cfg))
    base = ["--engine_dir", str(engine), "--max_output_len", "2"]
    argv, line = {
        "both prompts": (["--input_text", "x", "--input_file", str(prompt)], "error: give either --input_text or"),
        "no prompt": ([], "error: no prompt given; pass --input_text"),
        "kv fraction": (["--input_text", "x", "--kv_cache_free_gpu_memory_fraction", "1.5"],
                        "error: --kv_cache_free_gpu_memory_fraction"),
        "kv tokens": (["--input_text", "x", "--max_tokens_in_paged_kv_cache", "0"],
                      "error: --max_tokens_in_paged_kv_cache must be at least 1, got 0"),
        "seed at greedy": (["--input_text", "x", "--random_seed", "5"], "error: --random_seed seeds sampling"),
        "v1 candidates": (["--input_text", "x", "--prompt_lookup_config", "[4,2]", "--workflow", "v1",
                           "--prompt_lookup_candidates", "4"], "error: --prompt_lookup_candidates 4 (max_candidates)"),
        "json over prompt file": (["--input_file", str(prompt), "--output_json", str(prompt)],
                                  f"error: --output_json {prompt} is --input_file"),
        "json in engine": (["--input_text", "x", "--output_json", str(engine / "config.json")],
                           f"error: --output_json {engine / 'config.json'} lies inside --engine_dir"),
        "json is csv": (["--input_text", "x", "--output_csv", str(tmp_path / "o"), "--output_json",
                         str(tmp_path / "o")], f"error: --output_json {tmp_path / 'o'} is also --output_csv"),
        "npy under /proc": (["--input_text", "x", "--output_npy", "/proc/x/y.npy", "--output_csv",
                             str(tmp_path / "new" / "a.csv")], "error: --output_npy /proc/x/y.npy"),
        "reuse on fmha-disabled engine": (["--input_text", "x", "--kv_cache_enable_block_reuse"],
                                          "error: --kv_cache_enable_block_reuse: "),
    }[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, heavy, stderr = refuse("promptlookup.cli.run", base + argv)
    assert code == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(line), stderr
    assert heavy == [], f"{case}: {heavy} imported before the refusal"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, nothing replaced
    assert prompt.read_text() == '["The cat sat on the mat."]'


def test_summarize_py_will_not_write_its_results_over_the_data_set(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"article": "a b c", "highlights": "a"}\n')
    code, heavy, stderr = refuse("promptlookup.cli.summarize", [
        "--engine_dir", str(_engine(tmp_path)), "--test_trt_llm", "--dataset_path", str(data),
        "--output_json", str(data)])
    assert code == 2 and stderr == f"error: --output_json {data} is --dataset_path {data}, which this run reads; " \
                                   "name another file" and heavy == []
    assert data.read_text() == '{"article": "a b c", "highlights": "a"}\n'


@pytest.mark.parametrize("case", ["serve empty key", "serve missing static cache", "serve dynamic cache under a file",
                                  "serve static is dynamic", "run dynamic cache under a file", "quickstart seed",
                                  "quickstart top_p 0", "serve k over the engine", "serve budget 0",
                                  "quickstart batch over the engine", "quickstart k over the engine",
                                  "quickstart k 0", "quickstart max_tokens 0", "quickstart temperature nan"])
def test_server_and_quickstart_flags_are_refused_before_loading(tmp_path, case):
    """Flags that would be ignored (an empty API key: no key at all; a seed at temperature 0) or
    would fail only at the end (a dynamic n-gram cache saved at shutdown) are refused first."""
    engine = _engine(tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    static = tmp_path / "static.bin"
    static.write_bytes(b"")
    lookup = ["--prompt_lookup_config", "[4,2]"]
    module, argv, line = {
        "serve empty key": ("promptlookup.cli.serve", ["--engine_dir", str(engine), "--api_key", ""],
                            "error: --api_key is empty"),
        "serve missing static cache": ("promptlookup.cli.serve", ["--engine_dir", str(engine), *lookup,
                                       "--ngram_static_cache", str(tmp_path / "none.bin")],
                                       f"error: --ngram_static_cache {tmp_path / 'none.bin'} does not exist"),
        "serve dynamic cache under a file": ("promptlookup.cli.serve", ["--engine_dir", str(engine), *lookup,
                                             "--ngram_dynamic_cache", str(blocker / "c.bin")],
                                             f"error: --ngram_dynamic_cache {blocker / 'c.bin'}"),
        "serve static is dynamic": ("promptlookup.cli.serve", ["--engine_dir", str(engine), *lookup,
                                    "--ngram_static_cache", str(static), "--ngram_dynamic_cache", str(static)],
                                    f"error: --ngram_dynamic_cache {static} is --ngram_static_cache"),
        "run dynamic cache under a file": ("promptlookup.cli.run", ["--engine_dir", str(engine), "--input_text", "x",
                                           *lookup, "--ngram_dynamic_cache", str(blocker / "c.bin")],
                                           f"error: --ngram_dynamic_cache {blocker / 'c.bin'}"),
        "quickstart seed": ("promptlookup.cli.quickstart", ["--model_dir", str(engine), "--seed", "5"],
                            "error: --seed seeds sampling"),
        "quickstart top_p 0": ("promptlookup.cli.quickstart", ["--model_dir", str(engine), "--top_p", "0"],
                               "error: --top_p must be in (0, 1], got 0.0"),
        "serve k over the engine": ("promptlookup.cli.serve", ["--engine_dir", str(engine), "--prompt_lookup_config",
                                    "[50,2]"], "error: --prompt_lookup_config k=50 exceeds the engine's max_draft_len 0"),
        "serve budget 0": ("promptlookup.cli.serve", ["--engine_dir", str(engine), *lookup, "--draft_token_budget",
                           "0"], "error: --draft_token_budget must be at least 1, got 0"),
        "quickstart batch over the engine": ("promptlookup.cli.quickstart", ["--model_dir", str(engine),
                                             "--max_batch_size", "100"],
                                             "error: --max_batch_size 100 exceeds the engine's max_batch_size 1"),
        "quickstart k over the engine": ("promptlookup.cli.quickstart", ["--model_dir", str(engine)],
                                         "error: --spec_decode_max_draft_len 4 exceeds the engine's max_draft_len 0"),
        "quickstart k 0": ("promptlookup.cli.quickstart", ["--model_dir", str(engine), "--spec_decode_max_draft_len",
                           "0"], "error: --spec_decode_max_draft_len must be at least 1, got 0"),
        "quickstart max_tokens 0": ("promptlookup.cli.quickstart", ["--model_dir", str(engine), "--max_tokens", "0"],
                                    "error: --max_tokens must be at least 1, got 0"),
        "quickstart temperature nan": ("promptlookup.cli.quickstart", ["--model_dir", str(engine), "--temperature",
                                       "nan"], "error: --temperature must be a finite number, got nan"),
    }[case]
    code, heavy, stderr = refuse(module, argv)
    assert code == 2 and len(stderr.splitlines()) == 1 and stderr.startswith(line), stderr
    assert heavy == [], f"{case}: {heavy} imported before the refusal"
    assert blocker.read_text() == "x" and static.read_bytes() == b""
