"""summarize.py end to end on a tiny engine: contenders side by side, sweep, accuracy gate, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from promptlookup.cli.summarize import main
from promptlookup.errors import run_cli

from .conftest import SHARED_SAMPLE, article_rows, write_jsonl


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        run_cli(main, [str(a) for a in argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def base_args(engine_dir: Path, dataset: Path) -> list[str]:
    return ["--engine_dir", engine_dir, "--dataset_path", dataset, "--batch_size", 2, "--max_ite", 2,
            "--max_input_length", 96, "--output_len", 12]


def test_engine_and_hf_side_by_side(engine_dir, jsonl_dataset, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    code, out, err = run(base_args(engine_dir, jsonl_dataset) + [
        "--test_trt_llm", "--test_hf", "--prompt_lookup_config", "[4,2,[0]]", "--output_json", out_json,
        "--hf_device", "cpu", "--data_type", "float32", "--num_threads", "1"], capsys)  # as the PyTorch engine
    assert code == 0, err
    data = json.loads(out_json.read_text())
    assert data["num_threads"] == 1 and "1 CPU thread(s)" in out
    by_name = {c["name"]: c for c in data["contenders"]}
    assert list(by_name) == ["ours plain", "ours lookup v2 pool k=4 n=2", "hf plain", "hf lookup pool k=4 n=2"]
    for name, c in by_name.items():
        assert name in out
        assert (c["timed_batches"], c["warmup_batches"]) == (1, 1)  # 2 batches: the first is the warm-up
        assert len(c["samples"]) == 4 and c["total_generated_tokens"] >= c["generated_tokens"] > 0
        assert c["tokens_per_s"] > 0 and c["tokens_per_step"] >= 1.0
        assert set(c["rouge"]) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    ours, lookup = by_name["ours plain"], by_name["ours lookup v2 pool k=4 n=2"]
    assert (lookup["identical"], lookup["compared"]) == (4, 4)  # greedy prompt lookup is lossless
    assert 0 <= lookup["accepted"] <= lookup["drafted"] and lookup["speedup"] > 0
    assert (by_name["hf lookup pool k=4 n=2"]["identical"], by_name["hf lookup pool k=4 n=2"]["compared"]) == (4, 4)
    # our engine and Hugging Face decode the same weights greedily: same tokens
    assert [s["output_ids"] for s in ours["samples"]] == [s["output_ids"] for s in by_name["hf plain"]["samples"]]
    assert data["engine_vs_hf_plain"] == {"identical": 4, "compared": 4} and "4/4 outputs token-identical" in out
    assert data["dataset"]["articles"] == 4 and data["accuracy_check"] is None
    assert data["engine_weights"] == {"weights": "float32", "quant_algo": None, "group_size": None}


def test_check_accuracy_gate(engine_dir, jsonl_dataset, tmp_path, capsys):
    first = tmp_path / "first.json"
    code, _, err = run(base_args(engine_dir, jsonl_dataset) + ["--test_trt_llm", "--output_json", first], capsys)
    assert code == 0, err
    samples = json.loads(first.read_text())["contenders"][0]["samples"]
    outputs = {s["id"]: s["output_text"] for s in samples}
    # references equal to the engine's own outputs: ROUGE-1 is exactly 100
    echo = write_jsonl(tmp_path / "echo.jsonl", [dict(r, highlights=outputs[r["id"]]) for r in article_rows()])
    args = base_args(engine_dir, echo) + ["--test_trt_llm", "--check_accuracy", "--output_json", tmp_path / "r.json"]

    code, out, err = run(args + ["--tensorrt_llm_rouge1_threshold", 99.5], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["contenders"][0]["rouge"]["rouge1"] == pytest.approx(100.0)
    assert result["accuracy_check"]["passed"] is True and "passed" in out

    code, _, err = run(args + ["--tensorrt_llm_rouge1_threshold", 100], capsys)
    assert code == 1
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert err.strip().splitlines()[-1].startswith("error: accuracy check failed")  # one line, last
    assert json.loads((tmp_path / "r.json").read_text())["accuracy_check"]["passed"] is False


def test_sweep_writes_table_csv_and_plot(engine_dir, jsonl_dataset, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    code, out, err = run(base_args(engine_dir, jsonl_dataset) + [
        "--sweep", "--sweep_k", "2,4", "--sweep_n", "1,2", "--sweep_modes", "pool,longest,pool-adaptive",
        "--workflow", "v2", "--sweep_dir", sweep_dir], capsys)
    assert code == 0, err
    assert sorted(p.name for p in sweep_dir.iterdir()) == [".promptlookup-output.json", "sweep.csv", "sweep.json",
                                                          "sweep.png"]
    payload = json.loads((sweep_dir / "sweep.json").read_text())
    assert payload["num_threads"] == 1  # OMP_NUM_THREADS=1 in the tests: the default follows it
    rows = payload["rows"]
    assert len(rows) == 2 * 2 + 2 + 2 * 2
    assert all((r["identical"], r["compared"]) == (4, 4) for r in rows)  # every setting is lossless
    assert all(r["speedup"] > 0 and r["tokens_per_step"] >= 1.0 for r in rows)
    assert payload["best"]["label"] in {r["label"] for r in rows}
    assert "best setting" in out and "pool k=2 n=1" in out
    assert (sweep_dir / "sweep.csv").read_text().count("\n") == len(rows) + 1
    assert (sweep_dir / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_sweep_dir_with_foreign_files_is_refused(engine_dir, jsonl_dataset, tmp_path, capsys):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    code, _, err = run(base_args(engine_dir, jsonl_dataset) + ["--sweep", "--sweep_dir", keep], capsys)
    assert code == 2 and "--sweep_dir" in err
    assert (keep / "notes.txt").read_text() == "precious"


def _bad_dataset(kind: str, tmp_path: Path) -> list[str]:
    if kind == "missing column":
        path = write_jsonl(tmp_path / "d.jsonl", [{"id": "1", "article": "text"}])
        return ["--dataset_path", path]
    if kind == "empty dataset":
        path = tmp_path / "d.jsonl"
        path.write_text("")
        return ["--dataset_path", path]
    return []  # unreachable hub: no --dataset_path while offline


@pytest.mark.parametrize("kind,needle", [("missing column", "highlights"), ("empty dataset", "no rows"),
                                         ("unreachable hub", "--dataset_path")])
def test_bad_input_exits_2_and_writes_nothing(kind, needle, engine_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["--engine_dir", engine_dir, "--test_trt_llm", "--sweep", "--max_ite", 2,
            "--output_json", out_dir / "r.json", "--sweep_dir", out_dir / "sweep"] + _bad_dataset(kind, tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2
    assert err.startswith("error: ") and err.strip().count("\n") == 0 and needle in err
    assert list(out_dir.iterdir()) == []  # no json, no sweep dir, no temporary leftovers


def test_missing_engine_dir_is_blamed_on_engine_dir(jsonl_dataset, tmp_path, capsys):
    code, _, err = run(["--engine_dir", tmp_path / "nope", "--dataset_path", jsonl_dataset, "--test_trt_llm"], capsys)
    assert code == 2 and err.startswith(f"error: engine directory {tmp_path / 'nope'} does not exist")
    assert "tokenizer" not in err and err.strip().count("\n") == 0


@pytest.mark.parametrize("extra,needle", [
    ([], "nothing to evaluate"),
    (["--test_trt_llm", "--prompt_lookup_config", "[9,2,[0]]"], "max_draft_len"),
    (["--test_trt_llm", "--batch_size", 5], "max_batch_size"),
    (["--test_trt_llm", "--output_len", 190], "max_seq_len"),
    (["--sweep", "--max_ite", 1], "--max_ite 2"),
    (["--test_trt_llm", "--use_chat_template", "--end_id", "x"], "--end_id"),
    (["--test_hf", "--hf_device", "tpu:7"], "--hf_device"),
    (["--test_hf", "--hf_model_dir", "/nonexistent"], "--hf_model_dir /nonexistent does not exist"),
    (["--test_trt_llm", "--end_id", "100000"], "--end_id 100000 is outside the engine's vocabulary"),
    (["--test_trt_llm", "--temperature", "nan"], "expected a finite number, got 'nan'"),
    (["--test_trt_llm", "--top_p", "inf"], "expected a finite number, got 'inf'"),
    (["--test_trt_llm", "--tensorrt_llm_rouge1_threshold", "nan"], "expected a finite number"),
    (["--test_trt_llm", "--drafter_mode", "longest"], "--drafter_mode applies only to prompt lookup, which is off; "
                                                      "add --prompt_lookup_config"),
    (["--test_trt_llm", "--workflow", "v2"], "--workflow applies only to prompt lookup"),
    (["--sweep", "--workflow", "v2", "--max_ite", 1], "--max_ite 2"),  # the sweep uses --workflow: not refused
    (["--test_trt_llm", "--max_ite", "2", "--max_tokens", "60"], "unrecognized arguments: --max_tokens"),
    (["--test_trt_llm", "--output_json", "/proc/x/r.json"], "--output_json /proc/x/r.json: cannot write in /proc"),
    # flags whose reader is off, accepted and ignored before
    (["--test_trt_llm", "--hf_device", "cuda"], "--hf_device is read only with --test_hf, which is off"),
    (["--test_trt_llm", "--hf_model_dir", "/nonexistent", "--data_type", "fp16"],
     "--hf_model_dir, --data_type are read only with --test_hf"),
    (["--test_trt_llm", "--sweep_k", "2,4"], "--sweep_k is read only with --sweep"),
    (["--test_trt_llm", "--tensorrt_llm_rouge1_threshold", "99"], "read only with --check_accuracy"),
    (["--test_hf", "--device", "cpu", "--max_tokens_in_paged_kv_cache", "5"],
     "--device, --max_tokens_in_paged_kv_cache are read only with --test_trt_llm or --sweep"),
    (["--test_trt_llm", "--top_k", "5"], "--top_k 5 shapes sampling, but --temperature is 0"),
])
def test_bad_settings_exit_2_before_running(extra, needle, engine_dir, jsonl_dataset, tmp_path, capsys):
    argv = ["--engine_dir", engine_dir, "--dataset_path", jsonl_dataset, "--output_json", tmp_path / "r.json", *extra]
    code, out, err = run(argv, capsys)
    assert code == 2 and needle in err and err.strip().count("\n") == 0
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(not SHARED_SAMPLE.is_file(), reason="shared CNN/DailyMail sample not present")
def test_shared_cnn_dailymail_sample_with_chat_template(engine_dir, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    code, _, err = run(["--engine_dir", engine_dir, "--dataset_path", SHARED_SAMPLE, "--test_trt_llm",
                        "--prompt_lookup_config", "[6,2,[0]]", "--use_chat_template", "--batch_size", 2,
                        "--max_ite", 2, "--max_input_length", 150, "--output_len", 8, "--output_json", out_json], capsys)
    assert code == 0, err
    data = json.loads(out_json.read_text())
    assert data["dataset"]["articles"] == 4 and all(n <= 150 for n in data["dataset"]["prompt_tokens"])
    lookup = data["contenders"][1]
    assert (lookup["identical"], lookup["compared"]) == (4, 4)
