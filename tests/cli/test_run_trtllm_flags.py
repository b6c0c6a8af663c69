"""run.py's TensorRT-LLM flags, end to end on the tiny engine: what each one does.

--backend, --ngram_config, --max_input_length, --num_beams, --stop_words, --bad_words,
--repetition/presence/frequency_penalty, --log_level, --output_csv and --output_npy.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from promptlookup.cli.run import main
from promptlookup.errors import run_cli

TEXT = "one two three four one two three four one two three"
NEW = 16


def run(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        run_cli(main, [str(a) for a in argv])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def gen(engine: Path, tmp_path: Path, capsys, *args) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    code, _, err = run(["--engine_dir", engine, "--max_output_len", NEW, "--output_json", out, *args], capsys)
    assert code == 0, err
    return json.loads(out.read_text()), err


def ids(res: dict) -> list[list[int]]:
    return [s["output_ids"] for s in res["sequences"]]


def refused(engine: Path, tmp_path: Path, capsys, needle: str, *args) -> None:
    out = tmp_path / "refused.json"
    code, _, err = run(["--engine_dir", engine, "--input_text", TEXT, "--output_json", out, *args], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    assert not out.exists()


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture
def plain(tiny_engine_dir, tmp_path, capsys):
    return ids(gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT)[0])[0]


def single_token_word(tokenizer, output: list[int], start: int = 2) -> tuple[str, int]:
    """A string from the output that tokenizes back to exactly one of its tokens."""
    for t in output[start:]:
        text = tokenizer.decode([t])
        if text.strip() and tokenizer.encode(text, add_special_tokens=False) == [t]:
            return text, t
    pytest.skip("no round-tripping single-token word in this output")


# --backend ------------------------------------------------------------------------------

def test_backend_torch_runs_the_pytorch_engine(tiny_engine_dir, tmp_path, capsys, plain):
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--backend", "torch")
    assert ids(res)[0] == plain and res["config"]["backend"] == "torch"


def test_backend_trtllm_is_refused_in_one_line(tiny_engine_dir, tmp_path, capsys):
    refused(tiny_engine_dir, tmp_path, capsys, "--backend trtllm", "--backend", "trtllm")
    refused(tiny_engine_dir, tmp_path, capsys, "invalid choice", "--backend", "onnx")


# --ngram_config ---------------------------------------------------------------------------

def test_ngram_config_is_prompt_lookup_config(tiny_engine_dir, tmp_path, capsys, plain):
    a, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--ngram_config", "[4,2,[0]]")
    b, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--prompt_lookup_config", "[4,2,[0]]")
    assert a["config"]["prompt_lookup_config"] == "[4,2,[0]]" and a["config"]["draft"] == b["config"]["draft"]
    assert a["stats"]["drafted"] > 0 and ids(a) == ids(b) == [plain]
    same, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--ngram_config", "[4, 2, [0]]",
                  "--prompt_lookup_config", "[4,2,[0]]")
    assert ids(same) == [plain]
    refused(tiny_engine_dir, tmp_path, capsys, "differ", "--ngram_config", "[4,2,[0]]",
            "--prompt_lookup_config", "[5,2,[0]]")


# --max_input_length ---------------------------------------------------------------------

def test_max_input_length_keeps_the_last_tokens(tiny_engine_dir, tmp_path, capsys):
    prompt = list(range(100, 130))
    (tmp_path / "p.json").write_text(json.dumps([prompt]))
    (tmp_path / "tail.json").write_text(json.dumps([prompt[-8:]]))
    cut, err = gen(tiny_engine_dir, tmp_path, capsys, "--input_file", tmp_path / "p.json", "--max_input_length", 8)
    tail, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_file", tmp_path / "tail.json")
    assert ids(cut) == ids(tail)
    assert "kept its last 8 of 30 tokens" in err
    untouched, err = gen(tiny_engine_dir, tmp_path, capsys, "--input_file", tmp_path / "p.json",
                         "--max_input_length", 30)
    assert "kept its last" not in err and ids(untouched) != ids(tail)


def test_max_input_length_admits_a_prompt_longer_than_the_engine_limit(tiny_engine_dir, tmp_path, capsys):
    (tmp_path / "long.json").write_text(json.dumps([[7] * 1100]))
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_file", tmp_path / "long.json", "--max_input_length", 1000)
    assert len(ids(res)[0]) == NEW
    refused(tiny_engine_dir, tmp_path, capsys, "--max_input_length must be at least 1", "--max_input_length", 0)


# --num_beams ------------------------------------------------------------------------------

def test_num_beams_above_one_is_refused(tiny_engine_dir, tmp_path, capsys, plain):
    refused(tiny_engine_dir, tmp_path, capsys, "--num_beams 2", "--num_beams", 2, "--prompt_lookup_config", "[4,2,[0]]")
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--num_beams", 1)
    assert ids(res)[0] == plain


# --stop_words / --bad_words ----------------------------------------------------------

@pytest.mark.parametrize("lookup", [[], ["--prompt_lookup_config", "[4,2,[0]]", "--workflow", "v1"],
                                    ["--prompt_lookup_config", "[4,2,[0]]", "--workflow", "v2"]])
def test_stop_words_end_the_output_after_the_word(tiny_engine_dir, tmp_path, capsys, plain, tokenizer, lookup):
    word, token = single_token_word(tokenizer, plain, start=3)
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--stop_words", word, "never-seen-zzq",
                 *lookup)
    assert ids(res)[0] == plain[: plain.index(token) + 1]


@pytest.mark.parametrize("lookup", [[], ["--prompt_lookup_config", "[4,2,[0]]", "--workflow", "v2"]])
def test_bad_words_are_never_generated(tiny_engine_dir, tmp_path, capsys, plain, tokenizer, lookup):
    word, token = single_token_word(tokenizer, plain)
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--bad_words", word, *lookup)
    out = ids(res)[0]
    assert token not in out and out != plain
    assert out[: plain.index(token)] == plain[: plain.index(token)]  # unchanged before its first use
    base, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--bad_words", word)
    assert out == ids(base)[0]  # speculative == plain with the same bad word


def test_word_lists_are_checked(tiny_engine_dir, tmp_path, capsys):
    refused(tiny_engine_dir, tmp_path, capsys, "has no tokens", "--stop_words", "")
    refused(tiny_engine_dir, tmp_path, capsys, "per-prompt word lists", "--bad_words", "a", "--bad_words", "b")


# penalties ----------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--repetition_penalty", "1.5"), ("--presence_penalty", "1.0"),
                                        ("--frequency_penalty", "0.7")])
def test_penalties_change_output_and_lookup_stays_identical(tiny_engine_dir, tmp_path, capsys, plain, flag, value):
    pen, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, flag, value)
    assert ids(pen)[0] != plain
    assert pen["config"]["sampling"][flag[2:]] == float(value)
    for workflow in ("v1", "v2"):
        spec, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, flag, value,
                      "--prompt_lookup_config", "[4,2,[0]]", "--workflow", workflow)
        assert ids(spec) == ids(pen)


@pytest.mark.parametrize("args,needle", [(["--repetition_penalty", "0"], "--repetition_penalty must be"),
                                         (["--presence_penalty", "nan"], "--presence_penalty must be"),
                                         (["--frequency_penalty", "inf"], "--frequency_penalty must be")])
def test_bad_penalties_are_refused(tiny_engine_dir, tmp_path, capsys, args, needle):
    refused(tiny_engine_dir, tmp_path, capsys, needle, *args)


# --log_level ----------------------------------------------------------------------------

def test_log_level_filters_messages(tiny_engine_dir, tmp_path, capsys):
    _, err = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT)
    assert "[INFO] loaded" in err and "[DEBUG]" not in err
    _, err = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--log_level", "verbose")
    assert "[INFO] loaded" in err and "[DEBUG] prompt 0:" in err
    _, err = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--log_level", "warning")
    assert "[INFO]" not in err and "[DEBUG]" not in err


# --output_csv / --output_npy -----------------------------------------------------------

def test_output_csv_and_npy_hold_tensorrt_llm_rows(tiny_engine_dir, tmp_path, capsys):
    csv_path, npy_path = tmp_path / "o" / "out.csv", tmp_path / "o" / "out.npy"
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--input_text", "hello world",
                 "--output_csv", csv_path, "--output_npy", npy_path, "--end_id", 2)
    rows = np.load(npy_path)
    assert rows.dtype == np.int32
    with csv_path.open() as fh:
        assert [[int(x) for x in r] for r in csv.reader(fh)] == rows.tolist()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_engine_dir))
    prompts = [tok(TEXT)["input_ids"], tok("hello world")["input_ids"]]
    assert rows.shape == (2, max(map(len, prompts)) + NEW)
    for row, p, out in zip(rows.tolist(), prompts, ids(res)):
        assert row[: len(p) + len(out)] == p + out
        assert set(row[len(p) + len(out):]) <= {2}  # padded with end_id
    assert sorted(f.name for f in (tmp_path / "o").iterdir()) == ["out.csv", "out.npy"]  # no temporaries
    (tmp_path / "d").mkdir()
    refused(tiny_engine_dir, tmp_path, capsys, "is a directory", "--output_npy", tmp_path / "d")


# TensorRT-LLM's forms and flags (issue 24) ------------------------------------------------

def test_prompt_lookup_config_takes_tensorrt_llms_v2_form(tiny_engine_dir, tmp_path, capsys, plain):
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--prompt_lookup_config", "[4,2]")
    assert res["config"]["draft"]["prompt_lookup_num_tokens"] == 4 and res["stats"]["drafted"] > 0
    assert ids(res) == [plain]
    refused(tiny_engine_dir, tmp_path, capsys, "must have 2 or 3 items", "--prompt_lookup_config", "[4]")
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and '"[k, n]"' in " ".join(out.split())


@pytest.mark.parametrize("args, needle", [
    (["--kv_cache_free_gpu_memory_fraction", "1.5"], "--kv_cache_free_gpu_memory_fraction must be a number in (0, 1]"),
    (["--kv_cache_free_gpu_memory_fraction", "0"], "--kv_cache_free_gpu_memory_fraction must be a number in (0, 1]"),
    (["--enable_chunked_context"], "--enable_chunked_context applies to TensorRT-LLM"),
    (["--prompt_lookup_config", "[4,2]", "--max_concurrency", "2"], "max_concurrency/draft_len_schedule"),
    (["--prompt_lookup_config", "[4,2]", "--draft_len_schedule", "{1:4,4:2}"], "max_concurrency/draft_len_schedule"),
    (["--prompt_lookup_config", "[4,2]", "--draft_len_schedule", "{1:3}"], "must equal max_draft_len 4"),
    (["--draft_len_schedule", "{1:4}"], "applies only to prompt lookup"),
])
def test_settings_the_pytorch_engine_cannot_honour_are_refused(tiny_engine_dir, tmp_path, capsys, args, needle):
    refused(tiny_engine_dir, tmp_path, capsys, needle, *args)


def test_kv_cache_free_gpu_memory_fraction_sizes_the_pytorch_kv_cache(tiny_engine_dir, tmp_path, capsys,
                                                                       monkeypatch, plain):
    """Honoured on a PyTorch engine (issue 23): the pool takes the fraction of the free memory
    (the reader patched to 10 MB), the smaller of it and --max_tokens_in_paged_kv_cache wins,
    and the greedy output is the same."""
    from promptlookup.runtime import kv_cache

    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 10_000_000)
    block_bytes = 2 * 2 * 2 * 16 * 4 * 16  # 2 layers x K,V x 2 KV heads x head_dim 16, fp32; 16 tokens a block
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--prompt_lookup_config", "[4,2]",
                 "--kv_cache_free_gpu_memory_fraction", "0.5")
    assert res["config"]["kv_cache_tokens"] == (5_000_000 // block_bytes - 1) * 16
    assert res["config"]["kv_cache_free_gpu_memory_fraction"] == 0.5 and ids(res) == [plain]
    res, _ = gen(tiny_engine_dir, tmp_path, capsys, "--input_text", TEXT, "--kv_cache_free_gpu_memory_fraction", "0.5",
                 "--max_tokens_in_paged_kv_cache", "2000")
    assert res["config"]["kv_cache_tokens"] == 2000 and ids(res) == [plain]
    refused(tiny_engine_dir, tmp_path, capsys, "raise it to at least 0.0", "--kv_cache_free_gpu_memory_fraction", "0.01")


@pytest.mark.parametrize("args", [
    ["--prompt_lookup_config", "[4,2]"],
    ["--prompt_lookup_config", "[4,2,[0]]", "--workflow", "v1", "--drafter_mode", "longest"],
    ["--prompt_lookup_config", "[4,2]", "--drafter_mode", "llamacpp", "--max_concurrency", "4"],
    ["--lookahead_config", "[4,3,2]"],
    ["--prompt_lookup_config", "[4,2]", "--kv_cache_free_gpu_memory_fraction", "0.5", "--enable_chunked_context",
     "--max_tokens_in_paged_kv_cache", "4096"],
])
def test_every_trtllm_path_without_tensorrt_llm_exits_2_in_one_line(tmp_path, capsys, monkeypatch,
                                                                     smollm2_tokenizer_dir, args):
    import sys

    from tests.runtime_trtllm.fakes import write_engine

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # as on a machine without it
    engine = write_engine(tmp_path / "trt_engine")
    refused(engine, tmp_path, capsys, "tensorrt_llm is not installed", "--backend", "trtllm",
            "--tokenizer_dir", smollm2_tokenizer_dir, *args)


def test_cost_policy_is_refused_for_a_tensorrt_llm_engine(tmp_path, capsys, smollm2_tokenizer_dir):
    from tests.runtime_trtllm.fakes import write_engine

    engine = write_engine(tmp_path / "trt_engine")
    refused(engine, tmp_path, capsys, "--draft_length_policy cost needs a PyTorch engine",
            "--tokenizer_dir", smollm2_tokenizer_dir, "--prompt_lookup_config", "[4,2]",
            "--draft_length_policy", "cost")
