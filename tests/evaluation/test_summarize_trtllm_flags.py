"""summarize.py's TensorRT-LLM flags: --dataset_dir, --eval_task, --output_dir, --backend,
--max_input_length (what each does; today's names keep working beside them)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import article_rows, write_jsonl
from .test_summarize_cli import run


def args(engine_dir: Path, *extra) -> list:
    return ["--engine_dir", engine_dir, "--test_trt_llm", "--batch_size", 2, "--max_ite", 2,
            "--max_input_length", 96, "--output_len", 8, *extra]


def samples(path: Path) -> list[tuple[str, list[int]]]:
    data = json.loads(path.read_text())
    return [(s["id"], s["output_ids"]) for s in data["contenders"][0]["samples"]]


def refused(argv, capsys, needle: str) -> None:
    code, _, err = run(argv, capsys)
    assert code == 2 and needle in err and err.strip().count("\n") == 0, err


def test_dataset_dir_is_a_folder_or_a_file(engine_dir, jsonl_dataset, tmp_path, capsys):
    folder = tmp_path / "cnn"
    folder.mkdir()
    shutil.copy(jsonl_dataset, folder / "test.jsonl")
    (folder / "README.txt").write_text("not data")
    results = {}
    for name, flag in [("path", ["--dataset_path", jsonl_dataset]), ("dir", ["--dataset_dir", folder]),
                       ("dir-file", ["--dataset_dir", jsonl_dataset])]:
        out = tmp_path / f"{name}.json"
        code, _, err = run(args(engine_dir, *flag, "--output_json", out), capsys)
        assert code == 0, err
        results[name] = samples(out)
    assert results["path"] == results["dir"] == results["dir-file"] and len(results["path"]) == 4
    # the same data twice is fine; different data is refused
    code, _, err = run(args(engine_dir, "--dataset_dir", folder, "--dataset_path", folder / "test.jsonl",
                            "--output_json", tmp_path / "same.json"), capsys)
    assert code == 0, err
    other = write_jsonl(tmp_path / "other.jsonl", article_rows()[:2])
    refused(args(engine_dir, "--dataset_dir", folder, "--dataset_path", other), capsys, "name different data")


def test_dataset_dir_with_no_or_several_data_files(engine_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(args(engine_dir, "--dataset_dir", empty), capsys, "found none")
    two = tmp_path / "two"
    two.mkdir()
    write_jsonl(two / "a.jsonl", article_rows())
    write_jsonl(two / "b.jsonl", article_rows())
    refused(args(engine_dir, "--dataset_dir", two), capsys, "found a.jsonl, b.jsonl")


def test_eval_task_summarize_only(engine_dir, jsonl_dataset, tmp_path, capsys):
    out = tmp_path / "r.json"
    code, _, err = run(args(engine_dir, "--dataset_path", jsonl_dataset, "--eval_task", "summarize",
                            "--output_json", out), capsys)
    assert code == 0 and out.is_file(), err
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, "--eval_task", "code_completion"), capsys,
            "--eval_task code_completion is not supported")


def test_output_dir_holds_the_results_and_the_sweep(engine_dir, jsonl_dataset, tmp_path, capsys):
    out_dir = tmp_path / "results"
    code, out, err = run(["--engine_dir", engine_dir, "--dataset_path", jsonl_dataset, "--sweep", "--sweep_k", "2",
                          "--sweep_n", "1", "--sweep_modes", "pool", "--batch_size", 2, "--max_ite", 2,
                          "--max_input_length", 40, "--output_len", 8, "--output_dir", out_dir], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["summarize.json", "summarize_sweep"]
    assert sorted(p.name for p in (out_dir / "summarize_sweep").iterdir()) == [
        ".promptlookup-output.json", "sweep.csv", "sweep.json", "sweep.png"]  # the manifest marks it as ours
    data = json.loads((out_dir / "summarize.json").read_text())
    assert all(n <= 40 for n in data["dataset"]["prompt_tokens"])  # --max_input_length
    # with --output_json (and no sweep) --output_dir would hold nothing: refused, not ignored
    explicit = tmp_path / "mine.json"
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, "--output_dir", tmp_path / "r2",
                 "--output_json", explicit), capsys, "--output_dir")
    assert not explicit.exists() and not (tmp_path / "r2").exists()
    (tmp_path / "afile").write_text("x")
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, "--output_dir", tmp_path / "afile"), capsys,
            "is not a directory")


def test_backend(engine_dir, jsonl_dataset, tmp_path, capsys):
    out = tmp_path / "torch.json"
    code, _, err = run(args(engine_dir, "--dataset_path", jsonl_dataset, "--backend", "torch", "--output_json", out),
                       capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["settings"]["backend"] == "torch"
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, "--backend", "trtllm",
                 "--output_json", tmp_path / "t.json"), capsys, "--backend trtllm")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("flag, needle", [
    (["--kv_cache_free_gpu_memory_fraction", "1.5"], "--kv_cache_free_gpu_memory_fraction must be a number in (0, 1]"),
    (["--enable_chunked_context"], "--enable_chunked_context applies to TensorRT-LLM engines"),
])
def test_tensorrt_llm_kv_flags_refused_for_a_pytorch_engine(engine_dir, jsonl_dataset, tmp_path, capsys, flag, needle):
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, *flag, "--output_json", tmp_path / "k.json"), capsys,
            needle)


def test_kv_cache_free_gpu_memory_fraction_reaches_the_pytorch_runner(engine_dir, jsonl_dataset, tmp_path, capsys,
                                                                     monkeypatch):
    """Honoured (issue 23): the runner reads the free memory and sizes its pool by it."""
    from promptlookup.runtime import kv_cache

    asked = []
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: asked.append(device) or 10_000_000)
    code, _, err = run(args(engine_dir, "--dataset_path", jsonl_dataset, "--kv_cache_free_gpu_memory_fraction", "0.5",
                            "--output_json", tmp_path / "f.json"), capsys)
    assert code == 0, err
    assert asked  # one read per load, on the device the engine runs on


def test_load_knobs_are_refused_up_front_for_a_pytorch_engine(engine_dir, jsonl_dataset, tmp_path, capsys):
    refused(args(engine_dir, "--dataset_path", jsonl_dataset, "--prompt_lookup_config", "[4,2]", "--max_concurrency",
                 "2", "--output_json", tmp_path / "m.json"), capsys, "max_concurrency/draft_len_schedule")


def test_kv_cache_dtype_reaches_the_pytorch_runner(engine_dir, jsonl_dataset, tmp_path, capsys, monkeypatch):
    """``--kv_cache_dtype float16`` (run.py's flag) builds the engine's pool in float16 and is
    recorded in the JSON's settings; without --test_trt_llm it is refused as unread."""
    import torch

    from promptlookup.runtime import kv_cache

    made = []
    real_init = kv_cache.KVPool.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self.dtype)

    monkeypatch.setattr(kv_cache.KVPool, "__init__", spy)
    out = tmp_path / "k.json"
    code, _, err = run(args(engine_dir, "--dataset_path", jsonl_dataset, "--kv_cache_dtype", "float16",
                            "--output_json", out), capsys)
    assert code == 0, err
    assert made and set(made) == {torch.float16}
    assert json.loads(out.read_text())["settings"]["kv_cache_dtype"] == "float16"
    refused(["--engine_dir", engine_dir, "--test_hf", "--dataset_path", jsonl_dataset, "--kv_cache_dtype", "float16"],
            capsys, "--kv_cache_dtype is read only with --test_trt_llm or --sweep")
