"""run.py end to end on a tiny engine: input formats, output JSON, and bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from promptlookup.cli.run import main

ROOT = Path(__file__).resolve().parents[2]
TEXT = "one two three four one two three four one two three"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def run_json(engine: Path, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    assert main(["--engine_dir", str(engine), "--max_output_len", "16", "--output_json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_output_json_has_the_documented_fields(tiny_engine_dir, tmp_path):
    res = run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--input_text", "hello world",
                   "--prompt_lookup_config", "[4,2,[0]]", "--kv_cache_enable_block_reuse")
    assert set(res) >= {"config", "wall_time_s", "tokens_per_s", "sequences"}
    assert res["config"]["prompt_lookup_config"] == "[4,2,[0]]"
    assert res["config"]["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert res["config"]["cuda_graphs"] == torch.cuda.is_available()
    assert set(res["config"]["drafter_implementation"]) == {"pool", "suffix_automaton"}
    assert len(res["sequences"]) == 2
    for s in res["sequences"]:
        assert set(s) >= {"text", "output_ids", "generated_tokens", "steps", "drafted", "accepted"}
        assert s["generated_tokens"] == len(s["output_ids"]) <= 16
        assert 0 <= s["accepted"] <= s["drafted"]
        assert s["steps"] <= s["generated_tokens"]


@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_lookup_output_equals_plain_output(tiny_engine_dir, tmp_path, workflow):
    plain = run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--input_text", "a b a b a b")
    spec = run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--input_text", "a b a b a b",
                    "--prompt_lookup_config", "[6,2,[0]]", "--workflow", workflow, "--kv_cache_enable_block_reuse")
    assert [s["output_ids"] for s in spec["sequences"]] == [s["output_ids"] for s in plain["sequences"]]


@pytest.mark.parametrize("flags", [
    ("--lookahead_config", "[2,3,2]", "--workflow", "v2"),
    ("--lookahead_config", "[2,2,2]", "--prompt_lookup_config", "[4,2,[0]]", "--workflow", "v1"),
    ("--prompt_lookup_config", "[4,2,[0]]", "--prompt_lookup_candidates", "3", "--workflow", "v2"),
], ids=["lookahead", "lookahead+lookup-v1", "candidates"])
def test_tree_modes_through_run_py_equal_plain(tiny_engine_dir, tmp_path, flags):
    plain = run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--input_text", "a b a b a b")
    spec = run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--input_text", "a b a b a b", *flags)
    assert [s["output_ids"] for s in spec["sequences"]] == [s["output_ids"] for s in plain["sequences"]]
    assert spec["stats"]["tree_tokens"] > 0
    if "--lookahead_config" in flags:
        assert spec["config"]["lookahead_config"] == json.loads(flags[1])
        assert sum(spec["stats"]["accepted_by_source"].values()) == spec["stats"]["accepted"]


def test_input_file_formats_agree(tiny_engine_dir, tmp_path, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))(TEXT)["input_ids"]
    (tmp_path / "p.txt").write_text(TEXT)
    (tmp_path / "p.json").write_text(json.dumps([TEXT, ids]))
    (tmp_path / "p.csv").write_text(",".join(map(str, ids)) + "\n")
    np.save(tmp_path / "p.npy", np.array([ids + [2, 2]], dtype=np.int32))  # end_id padding is stripped
    outs = {}
    for name in ("p.txt", "p.json", "p.csv", "p.npy"):
        res = run_json(tiny_engine_dir, tmp_path, "--input_file", str(tmp_path / name))
        outs[name] = [s["output_ids"] for s in res["sequences"]]
    assert outs["p.txt"][0] == outs["p.csv"][0] == outs["p.npy"][0]  # one prompt each
    assert outs["p.json"][0] == outs["p.json"][1]  # text and ids, batched together
    if not torch.cuda.is_available():
        # A batch of 2 and a batch of 1 agree on the CPU, whose kernels compute each row
        # alike; GPU kernels chosen per batch shape may round differently, and this random
        # tiny model's near-tied logits can then pick another token.
        assert outs["p.txt"][0] == outs["p.json"][0]


def test_token_id_prompts_get_no_chat_template(tiny_engine_dir, tmp_path):
    """Token ids are used as given: with text beside them the template wraps only the text;
    with none, --use_chat_template would change nothing and is refused."""
    (tmp_path / "ids.json").write_text(json.dumps([[5, 6, 7, 8, 5, 6, 7]]))
    (tmp_path / "mixed.json").write_text(json.dumps([[5, 6, 7, 8, 5, 6, 7], TEXT]))
    a = run_json(tiny_engine_dir, tmp_path, "--input_file", str(tmp_path / "ids.json"))
    b = run_json(tiny_engine_dir, tmp_path, "--input_file", str(tmp_path / "mixed.json"), "--use_chat_template")
    if not torch.cuda.is_available():  # a batch of 2 against 1: see test_input_file_formats_agree
        assert a["sequences"][0]["output_ids"] == b["sequences"][0]["output_ids"]
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_file", str(tmp_path / "ids.json"),
                "--use_chat_template", "--output_json", str(tmp_path / "refused.json"))
    assert r.returncode == 2 and "drop --use_chat_template" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "refused.json").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt_lookup_config", "[10,2"], "malformed"),
        (["--prompt_lookup_config", "__import__('os')"], "malformed"),
        (["--prompt_lookup_config", "[0,2,[0]]"], "k (prompt_lookup_num_tokens) must be an integer >= 1"),
        (["--prompt_lookup_config", "[4,0,[0]]"], "n (max_matching_ngram_size) must be an integer >= 1"),
        (["--prompt_lookup_config", "[4,2,[]]"], "device list"),
        (["--prompt_lookup_config", "[4,2,[0],1]"], "must have 2 or 3 items"),
        (["--prompt_lookup_config", "[17,2,[0]]"], "exceeds the engine's max_draft_len 16"),
        (["--prompt_lookup_config", "[4,2,[0,1]]"], "needs the TensorRT-LLM backend"),
        (["--max_output_len", "0"], "--max_output_len must be at least 1"),
        (["--workflow", "v3"], "invalid choice"),
        (["--lookahead_config", "[4,3"], "malformed"),
        (["--lookahead_config", "[4,3]"], "must have 3 items"),
        (["--lookahead_config", "[0,3,4]"], "W (max_window_size) must be an integer >= 1"),
        (["--lookahead_config", "[4,1,4]"], "N (max_ngram_size) must be an integer >= 2"),
        (["--lookahead_config", "[4,3,-1]"], "G (max_verification_set_size) must be an integer >= 0"),
        (["--lookahead_config", "[8,5,8]"], "rebuild with --max_draft_len 64"),
        (["--prompt_lookup_candidates", "2"], "--prompt_lookup_candidates applies only to prompt lookup"),
        (["--prompt_lookup_config", "[4,2,[0]]", "--prompt_lookup_candidates", "0"], "must be in 1..64"),
        # accepted and ignored before: each is refused now
        (["--prompt_lookup_min_ngram", "3"], "--prompt_lookup_min_ngram applies only to prompt lookup"),
        (["--lookahead_config", "[2,3,2]", "--prompt_lookup_min_ngram", "3"], "--prompt_lookup_min_ngram applies only"),
        (["--prompt_lookup_config", "[4,2]", "--drafter_mode", "longest", "--is_keep_all"],
         "--is_keep_all applies to --drafter_mode pool, not 'longest'"),
        (["--prompt_lookup_config", "[4,2]", "--drafter_mode", "longest", "--pool_rules", "v1", "--no-is_use_oldest"],
         "--is_use_oldest, --pool_rules apply to --drafter_mode pool"),
        (["--top_k", "5"], "--top_k 5 shapes sampling, but --temperature is 0"),
        (["--top_p", "0.5", "--top_k", "4"], "--top_k 4, --top_p 0.5 shape sampling"),
        (["--hf_model_dir", "/nonexistent"], "--hf_model_dir applies to TensorRT-LLM engines"),
    ],
)
def test_bad_lookup_config_exits_2_with_one_line(tiny_engine_dir, tmp_path, extra, message, capsys):
    """In-process through the scripts' own entry (``run_cli``), which the subprocess tests
    above cover end to end; the exit code and the single stderr line are the same."""
    from promptlookup.errors import run_cli as script_entry

    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exit_info:
        script_entry(main, ["--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--output_json", str(out),
                            *extra])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert "Traceback" not in err and not out.exists()
    assert not out.exists()


def test_prompt_longer_than_max_input_len(tiny_engine_dir, tmp_path):
    (tmp_path / "long.json").write_text(json.dumps([[7] * 1100]))
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_file", str(tmp_path / "long.json"))
    assert r.returncode == 2 and "max_input_len 1024" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_prompt(tiny_engine_dir, text):
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", text)
    assert r.returncode == 2 and "empty" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_empty_token_prompt(tiny_engine_dir, tmp_path):
    (tmp_path / "e.json").write_text("[[]]")
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_file", str(tmp_path / "e.json"))
    assert r.returncode == 2 and "empty" in r.stderr


def test_missing_engine_dir(tmp_path):
    r = run_cli("--engine_dir", str(tmp_path / "nope"), "--tokenizer_dir", str(tmp_path), "--input_text", "x")
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_incomplete_engine_dir(tiny_engine_dir, tmp_path):
    broken = tmp_path / "engine"
    shutil.copytree(tiny_engine_dir, broken)
    (broken / "rank0.safetensors").unlink()
    r = run_cli("--engine_dir", str(broken), "--input_text", "x")
    assert r.returncode == 2 and "incomplete" in r.stderr and "rank0.safetensors" in r.stderr


def test_tokenizer_larger_than_engine_vocab(tmp_path, smollm2_tokenizer_dir):
    from tests.conftest import _build_engine
    from tests.tiny import tiny_llama

    engine = _build_engine(tiny_llama(vocab_size=512), None, tmp_path)
    r = run_cli("--engine_dir", str(engine), "--tokenizer_dir", str(smollm2_tokenizer_dir), "--input_text", "x")
    assert r.returncode == 2 and "vocabulary is 512" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bad_device_is_one_line_and_exit_2(tiny_engine_dir):
    r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--device", "tpu")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --device 'tpu' is not a device; use auto, cpu, cuda or cuda:N"]
    if not torch.cuda.is_available():
        r = run_cli("--engine_dir", str(tiny_engine_dir), "--input_text", TEXT, "--device", "cpu", "--cuda_graph_mode")
        assert r.returncode == 2 and "--cuda_graph_mode needs the model on a CUDA device" in r.stderr
        assert "Traceback" not in r.stderr


def test_a_float16_kv_cache_is_recorded_and_lookup_output_equals_plain_output_on_it(tiny_engine_dir, tmp_path):
    """``--kv_cache_dtype float16`` (quickstart_advanced.py's flag): the pool halves, the JSON
    records it, and prompt lookup's output equals plain decoding's on the same cache."""
    args = ("--input_text", TEXT, "--input_text", "a b a b a b", "--device", "cpu", "--kv_cache_dtype", "float16")
    plain = run_json(tiny_engine_dir, tmp_path, *args)
    spec = run_json(tiny_engine_dir, tmp_path, *args, "--prompt_lookup_config", "[6,2,[0]]")
    assert plain["config"]["kv_cache_dtype"] == spec["config"]["kv_cache_dtype"] == "float16"
    assert [s["output_ids"] for s in spec["sequences"]] == [s["output_ids"] for s in plain["sequences"]]
    assert run_json(tiny_engine_dir, tmp_path, "--input_text", TEXT, "--device", "cpu")["config"]["kv_cache_dtype"] \
        == "float32"
