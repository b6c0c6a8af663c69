"""summarize.py honours or refuses every flag: a flag that none of the runs asked for reads is
refused in one line (exit 2) before anything loads, and the JSON records what ran.

The refusals are checked with an engine folder that does not exist: had the flag got past
the argument checks, the error would blame --engine_dir instead."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from promptlookup.cli import summarize
from promptlookup.cli.args import LOOKUP_ONLY_FLAGS

from .test_summarize_cli import run


def refused(argv, capsys, *needles: str) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and err.startswith("error: ") and err.strip().count("\n") == 0, err
    assert "Traceback" not in err and all(n in err for n in needles), err
    return err


def small(engine_dir, dataset, *extra) -> list:
    return ["--engine_dir", engine_dir, "--dataset_path", dataset, "--batch_size", 2, "--max_ite", 2,
            "--max_input_length", 64, "--output_len", 6, *extra]


SWEEP_ONLY = ["--sweep", "--sweep_k", "2", "--sweep_n", "1", "--sweep_modes", "pool"]


def test_every_drafting_flag_has_a_reader():
    """Each drafting flag of run.py's list belongs to one of summarize.py's reader groups."""
    grouped = {**summarize.ENGINE_ONLY_FLAGS, **summarize.SWEEP_DRAFT_FLAGS, **summarize.CONTENDER_ONLY_FLAGS}
    assert set(LOOKUP_ONLY_FLAGS) <= set(grouped)
    assert not set(summarize.SWEEP_DRAFT_FLAGS) & set(summarize.CONTENDER_ONLY_FLAGS)


# Defect 1: --sweep alone reads none of these (the grid sets k, n, the drafter and adaptive itself).
@pytest.mark.parametrize("flag, reader", [
    (["--lookahead_config", "[2,2,2]"], "--test_trt_llm, which is off"),
    (["--prompt_lookup_config", "[4,2]"], "--test_trt_llm or --test_hf, which are off"),
    (["--ngram_config", "[4,2]"], "--test_trt_llm or --test_hf, which are off"),
    (["--drafter_mode", "longest"], "--test_trt_llm, which is off"),
    (["--adaptive_draft"], "--test_trt_llm, which is off"),
    (["--ngram_dynamic_cache", "dyn.bin"], "--test_trt_llm, which is off"),
    (["--draft_len_schedule", "{1:2}"], "--test_trt_llm, which is off"),
])
def test_sweep_alone_refuses_the_contenders_drafting_flags(flag, reader, tmp_path, jsonl_dataset, capsys):
    out = tmp_path / "s.json"
    refused(small(tmp_path / "no_engine", jsonl_dataset, *SWEEP_ONLY, *flag, "--sweep_dir", tmp_path / "sw",
                  "--output_json", out), capsys, f"error: {flag[0]} is read only with {reader}",
            "--sweep_k", "--sweep_modes")
    assert not out.exists() and not (tmp_path / "sw").exists()


def test_sweep_reads_the_pool_options_without_prompt_lookup_config(engine_dir, jsonl_dataset, tmp_path, capsys,
                                                                  monkeypatch):
    """--is_keep_all and friends reach every sweep point (no --prompt_lookup_config needed) and
    are recorded as settings.sweep_draft; settings.draft stays None (no lookup contender ran)."""
    import promptlookup.decoding as decoding

    seen = []
    real = decoding.generate
    monkeypatch.setattr(decoding, "generate", lambda *a, **kw: seen.append(kw.get("draft")) or real(*a, **kw))
    out = tmp_path / "s.json"
    code, _, err = run(small(engine_dir, jsonl_dataset, *SWEEP_ONLY, "--no-is_keep_all", "--prompt_lookup_candidates",
                             "2", "--sweep_dir", tmp_path / "sw", "--output_json", out), capsys)
    assert code == 0, err
    drafts = [d for d in seen if d is not None]
    assert drafts and all((d.is_keep_all, d.max_candidates, d.prompt_lookup_num_tokens) == (False, 2, 2) for d in drafts)
    settings = json.loads(out.read_text())["settings"]
    assert settings["draft"] is None and settings["lookahead"] is None
    assert settings["sweep_draft"]["is_keep_all"] is False and settings["sweep_draft"]["max_candidates"] == 2
    assert "prompt_lookup_num_tokens" not in settings["sweep_draft"]  # each point sets its own k


# Defect 2: Hugging Face's prompt lookup reads k and n only.
@pytest.mark.parametrize("flag", [
    ["--adaptive_draft"], ["--prompt_lookup_candidates", "4"], ["--is_keep_all"], ["--no-is_use_oldest"],
    ["--is_public_pool"], ["--pool_rules", "v1"], ["--prompt_lookup_min_ngram", "2"],
    ["--ngram_static_cache", "s.bin"], ["--ngram_dynamic_cache", "d.bin"], ["--ngram_pool_max_patterns", "10"],
    ["--public_text_max_tokens", "10"], ["--max_concurrency", "2"], ["--draft_len_schedule", "{1:4}"],
    ["--drafter_mode", "longest"], ["--workflow", "v1"], ["--draft_length_policy", "full"],
    ["--lookahead_config", "[2,2,2]"],
])
def test_hf_alone_refuses_our_drafters_flags(flag, tmp_path, jsonl_dataset, capsys):
    out = tmp_path / "h.json"
    name = "--is_use_oldest" if flag[0] == "--no-is_use_oldest" else flag[0]
    refused(["--engine_dir", tmp_path / "no_engine", "--test_hf", "--dataset_path", jsonl_dataset,
             "--prompt_lookup_config", "[4,2]", *flag, "--output_json", out], capsys,
            f"error: {name} is read only with --test_trt_llm")
    assert not out.exists()


def test_hf_with_sweep_still_refuses_what_neither_reads(tmp_path, jsonl_dataset, capsys):
    refused(small(tmp_path / "no_engine", jsonl_dataset, "--test_hf", *SWEEP_ONLY, "--prompt_lookup_config", "[4,2]",
                  "--adaptive_draft", "--sweep_dir", tmp_path / "sw"), capsys,
            "--adaptive_draft is read only with --test_trt_llm, which is off")


# Defect 3: --workflow reaches the Lookahead contenders (and is refused where it cannot run).
@pytest.mark.parametrize("workflow", ["v1", "v2"])
def test_lookahead_contenders_use_workflow(workflow):
    from promptlookup.decoding.lookahead import LookaheadConfig
    from promptlookup.drafting.base import DraftConfig
    from promptlookup.evaluation.pipeline import EvalSettings, contender_specs

    specs = contender_specs(EvalSettings(test_engine=True, workflow=workflow, lookahead=LookaheadConfig(2, 2, 2),
                                         draft=DraftConfig(prompt_lookup_num_tokens=2)))
    assert [s.workflow for s in specs if s.speculative] == [workflow] * 3
    assert f"ours lookahead {workflow} [2,2,2]" in [s.name for s in specs]


def test_lookahead_under_v1_runs_v1_and_the_json_says_so(engine_dir, jsonl_dataset, tmp_path, capsys):
    out = tmp_path / "la.json"
    code, _, err = run(small(engine_dir, jsonl_dataset, "--test_trt_llm", "--lookahead_config", "[2,2,2]",
                             "--workflow", "v1", "--output_json", out), capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["settings"]["workflow"] == "v1"
    la = {c["name"]: c for c in data["contenders"]}["ours lookahead v1 [2,2,2]"]
    assert (la["workflow"], la["lookahead"], la["speculative"]) == ("v1", [2, 2, 2], True)
    assert (la["identical"], la["compared"]) == (4, 4)  # greedy Lookahead is lossless under v1 too


def test_lookahead_under_v1_on_a_tensorrt_llm_engine_is_refused_before_loading(engine_dir, jsonl_dataset, tmp_path,
                                                                              capsys, monkeypatch):
    from promptlookup.engine import config as engine_config
    from promptlookup.evaluation import contenders

    real = engine_config.read_engine_config
    monkeypatch.setattr(engine_config, "read_engine_config", lambda d: replace(real(d), backend="trtllm"))
    monkeypatch.setattr(contenders.EngineBackend, "_load", lambda self: pytest.fail("the engine was loaded"))
    refused(small(engine_dir, jsonl_dataset, "--test_trt_llm", "--lookahead_config", "[2,2,2]", "--workflow", "v1"),
            capsys, "--lookahead_config on a TensorRT-LLM engine", "--workflow v2")


# Defect 4: --output_dir that would hold nothing.
@pytest.mark.parametrize("extra, needle", [
    (["--test_trt_llm"], "--output_json names the results file;"),
    (["--sweep", "--sweep_dir", "SW"], "--output_json names the results file and --sweep_dir the sweep's folder"),
])
def test_output_dir_that_would_hold_nothing_is_refused(extra, needle, tmp_path, jsonl_dataset, capsys):
    extra = [str(tmp_path / "sw") if e == "SW" else e for e in extra]
    out_dir, out = tmp_path / "results", tmp_path / "mine.json"
    refused(small(tmp_path / "no_engine", jsonl_dataset, *extra, "--output_dir", out_dir, "--output_json", out), capsys,
            f"error: --output_dir {out_dir} would hold nothing", needle)
    assert not out_dir.exists() and not out.exists()


def test_output_dir_still_takes_the_sweep_beside_output_json():
    """With --sweep and no --sweep_dir, --output_dir holds the sweep's folder: accepted."""
    args = summarize.build_parser().parse_args(["--sweep", "--output_dir", "res", "--output_json", "mine.json"])
    summarize.resolve_outputs(args)
    assert (args.output_json, Path(args.sweep_dir)) == ("mine.json", Path("res") / "summarize_sweep")


def test_sweep_lookahead_points_run_the_workflow_asked(engine_dir, jsonl_dataset, tmp_path, capsys):
    """--sweep_lookahead's points run --workflow as every sweep point does (they ran v2 always)."""
    out = tmp_path / "sweep.json"
    code, _, err = run(small(engine_dir, jsonl_dataset, *SWEEP_ONLY, "--sweep_lookahead", "[[2,2,2]]",
                             "--workflow", "v1", "--sweep_dir", tmp_path / "sw", "--output_json", out), capsys)
    assert code == 0, err
    data = json.loads(out.read_text())
    rows = {r["label"]: r for r in data["sweep"]["rows"]}
    assert rows["lookahead [2,2,2]"]["identical"] == rows["lookahead [2,2,2]"]["compared"] == 4
    assert data["settings"]["workflow"] == "v1"
    assert data["sweep"]["deploy"].startswith("--workflow v1 ")


def test_sweep_lookahead_under_v1_on_a_tensorrt_llm_engine_is_refused_before_loading(engine_dir, jsonl_dataset,
                                                                                    tmp_path, capsys, monkeypatch):
    from promptlookup.engine import config as engine_config
    from promptlookup.evaluation import contenders

    real = engine_config.read_engine_config
    monkeypatch.setattr(engine_config, "read_engine_config", lambda d: replace(real(d), backend="trtllm"))
    monkeypatch.setattr(contenders.EngineBackend, "_load", lambda self: pytest.fail("the engine was loaded"))
    refused(small(engine_dir, jsonl_dataset, *SWEEP_ONLY, "--sweep_lookahead", "[[2,2,2]]", "--workflow", "v1",
                  "--sweep_dir", tmp_path / "sw"), capsys, "--sweep_lookahead on a TensorRT-LLM engine", "--workflow v2")
