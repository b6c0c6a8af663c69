"""bench/bench_load.py without a load generator or a server: option parsing, reading aiperf's
results (captured samples), the aiperf command, the prompts and the lookup/plain table.
No timing."""
import json

import pytest

from promptlookup.errors import UserError
from tests.bench import load_bench

# aiperf 0.13.0's profile_export_aiperf.json, captured against serve.py (SmolLM2 engine,
# chat, streaming, concurrency 1, 2 requests, max_tokens 16), trimmed to the fields the
# bench reads and each metric to a few of its statistics.
EXPORT_OK = json.loads("""{"schema_version": "1.4", "aiperf_version": "0.13.0",
"request_count": {"unit": "requests", "avg": 2.0}, "completed_request_count": {"unit": "requests", "avg": 2.0},
"request_error_rate": {"unit": "%", "avg": 0.0},
"output_token_throughput": {"unit": "tokens/sec", "avg": 27.205458784827087},
"time_to_first_token": {"unit": "ms", "avg": 413.11848, "p50": 413.11848, "min": 335.919984, "max": 490.31697599999995, "count": 2},
"inter_token_latency": {"unit": "ms", "avg": 11.310679766666665, "p50": 11.310679766666665, "min": 10.611953133333332, "max": 12.0094064, "count": 2},
"request_latency": {"unit": "ms", "avg": 582.7786765, "p50": 582.7786765, "min": 516.06108, "max": 649.496273, "count": 2},
"total_output_tokens": {"unit": "tokens", "avg": 32.0}, "benchmark_duration": {"unit": "sec", "avg": 1.1707880960000001},
"error_summary": []}""")

# The same, completions, one of two requests refused (a 9,001-token prompt).
EXPORT_ONE_FAILED = json.loads("""{"schema_version": "1.4", "aiperf_version": "0.13.0",
"request_count": {"unit": "requests", "avg": 1.0}, "completed_request_count": {"unit": "requests", "avg": 2.0},
"error_request_count": {"unit": "requests", "avg": 1.0}, "request_error_rate": {"unit": "%", "avg": 50.0},
"output_token_throughput": {"unit": "tokens/sec", "avg": 0.6610284435072535},
"time_to_first_token": {"unit": "ms", "avg": 1908.714049, "p50": 1908.714049, "count": 1},
"inter_token_latency": {"unit": "ms", "avg": 1448.5500625714285, "p50": 1448.5500625714285, "count": 1},
"request_latency": {"unit": "ms", "avg": 12048.564487, "p50": 12048.564487, "count": 1},
"total_output_tokens": {"unit": "tokens", "avg": 8.0}, "benchmark_duration": {"unit": "sec", "avg": 12.048564480000001},
"error_summary": [{"error_details": {"code": 400, "type": "Bad Request", "message": "{\\"error\\":{\\"message\\":\\"prompt 0 has 9001 tokens, more than the engine's max_input_len 3072\\"}}"}, "count": 1}]}""")

# The lines around the first error of an aiperf log whose tokenizer failed to load (captured).
FAILED_LOG = """\
15:38:54.199 INFO     Configuring dataset (dataset_manager.py:150)
15:38:54.199 ERROR    Dataset configuration failed: TokenizerError("Failed to load tokenizer '/x/engine'") (dataset_manager.py:193)
    raise HFValidationError(
╭─ AIPerf System Exit Errors ──────────────────────────────────────────────────╮
│    Error: CommandError                                                       │
"""


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_load")


def test_defaults_and_lists(bench):
    args = bench.parse_args([])
    assert args.endpoints == ["chat", "completions"]
    assert args.concurrency == [1, 4, 8, 16]
    assert (args.rounds, args.max_tokens, args.server_args) == (3, 48, [])
    args = bench.parse_args(["--endpoints", "completions", "--concurrency", "2,1", "--rounds", "2",
                             "--server_args", "--draft_length_policy full"])
    assert (args.endpoints, args.concurrency, args.rounds) == (["completions"], [2, 1], 2)
    assert args.server_args == ["--draft_length_policy", "full"]


@pytest.mark.parametrize("argv, word", [
    (["--concurrency", "1,0"], "--concurrency"), (["--concurrency", "4,4"], "--concurrency"),
    (["--concurrency", "a"], "--concurrency"), (["--endpoints", "embeddings"], "--endpoints"),
    (["--rounds", "0"], "--rounds"), (["--max_tok", "4"], "--max_tok"),
])
def test_bad_options_are_one_line_exit_2(bench, argv, word, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and word in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--prompt_lookup_config", "[0,2]"], ["--loadgen_spec", "guidellm"],
                                  ["--server_args", "'unclosed"]])
def test_bad_values_are_user_errors(bench, argv):
    with pytest.raises(UserError):
        bench.parse_args(argv)


def test_every_option_has_one_line_help_and_its_default(bench):
    parser = bench.build_parser()
    assert parser.allow_abbrev is False
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            text = parser._get_formatter()._get_help_string(action)
            assert text and "\n" not in text and "default" in text.lower(), action.option_strings


def test_cell_requests(bench):
    assert [bench.cell_requests(c, 2, 4) for c in (1, 4, 8, 16)] == [4, 8, 16, 32]
    assert bench.cell_requests(3, 1, 1) == 3


def test_parse_export(bench):
    ok = bench.parse_aiperf_export(EXPORT_OK)
    assert (ok["requests"], ok["errors"], ok["error_messages"]) == (2, 0, [])
    assert ok["output_tok_s"] == pytest.approx(27.2055, rel=1e-4)
    assert (ok["ttft_ms_avg"], ok["ttft_ms_p50"]) == pytest.approx((413.11848, 413.11848))
    assert ok["itl_ms_p50"] == pytest.approx(11.3107, rel=1e-4)
    assert (ok["output_tokens"], ok["aiperf_version"]) == (32.0, "0.13.0")
    failed = bench.parse_aiperf_export(EXPORT_ONE_FAILED)
    assert (failed["requests"], failed["errors"]) == (2, 1)
    assert "max_input_len" in failed["error_messages"][0]
    summary_only = {k: v for k, v in EXPORT_ONE_FAILED.items() if k != "error_request_count"}
    assert bench.parse_aiperf_export(summary_only)["errors"] == 1  # counted from the summary


def test_failure_line(bench):
    assert bench.aiperf_failure(FAILED_LOG).startswith("Dataset configuration failed: TokenizerError(")
    assert bench.aiperf_failure(FAILED_LOG).endswith("engine'\")")
    assert bench.aiperf_failure("a\n\nlast line\n") == "last line"
    assert bench.aiperf_failure("") == "(empty log)"


def test_aiperf_command(bench, tmp_path):
    cmd = bench.aiperf_command(tmp_path / "aiperf", "http://127.0.0.1:9", "chat", 8, 16, tmp_path / "p.jsonl",
                               "/tok", 48, tmp_path / "out")
    text = " ".join(cmd)
    for part in ("profile", "--endpoint-type chat", "--streaming", "--concurrency 8", "--request-count 16",
                 "--custom-dataset-type single_turn", "--dataset-sampling-strategy sequential",
                 "--extra-inputs max_tokens:48", "--extra-inputs temperature:0", "--use-server-token-count",
                 "--tokenizer /tok"):
        assert part in text, part


def test_code_prompts_are_distinct_and_bounded(bench):
    from promptlookup.evaluation.grounded_prompts import CODE_TASKS, stdlib_functions

    limit = len(stdlib_functions()) * len(CODE_TASKS)
    prompts = bench.code_prompts(limit)
    assert len(set(prompts)) == limit and all("```python\n" in p for p in prompts)
    with pytest.raises(UserError, match="distinct prompts"):
        bench.code_prompts(limit + 1)


def _run(endpoint, conc, mode, rnd, tok_s):
    return {"endpoint": endpoint, "concurrency": conc, "mode": mode, "round": rnd, "output_tok_s": tok_s}


def test_ratio_table(bench):
    runs = [
        _run("chat", 1, "plain", 0, 20.0), _run("chat", 1, "lookup", 0, 32.0),
        _run("chat", 1, "plain", 1, 22.0), _run("chat", 1, "lookup", 1, 33.0),
        _run("chat", 4, "plain", 0, 40.0), _run("chat", 4, "lookup", 0, 30.0),
        _run("chat", 4, "plain", 1, 41.0), _run("chat", 4, "lookup", 1, 32.0),
        _run("completions", 8, "plain", 0, 50.0), _run("completions", 8, "lookup", 0, 49.0),
        _run("completions", 8, "plain", 1, 60.0), _run("completions", 8, "lookup", 1, 55.0),
        _run("completions", 16, "plain", 0, 50.0),  # its lookup run failed: no pair, no row
        {"endpoint": "completions", "concurrency": 16, "mode": "lookup", "round": 0, "error": "x"},
    ]
    table = bench.ratio_table(runs)
    assert [(r["endpoint"], r["concurrency"]) for r in table] == [("chat", 1), ("chat", 4), ("completions", 8)]
    one, four, eight = table
    assert one["ratios"] == pytest.approx([1.6, 1.5])
    assert one["ratio_median"] == pytest.approx(1.55) and one["meets_1_5x"] is True
    assert one["below_plain_beyond_noise"] is False
    assert four["below_plain_beyond_noise"] is True and "meets_1_5x" not in four  # 0.75-0.78, plain spread 2.5%
    # 0.98 and 0.92: under 1 both times, but plain itself moved 20% between the rounds
    assert eight["below_plain_beyond_noise"] is False and eight["plain_spread"] == pytest.approx(10 / 55)
    text = bench.format_ratio_table(table)
    assert "met" in text and "BELOW plain beyond noise" in text and len(text.splitlines()) == 4
    single = bench.ratio_table([_run("chat", 1, "plain", 0, 20.0), _run("chat", 1, "lookup", 0, 10.0)])
    assert single[0]["below_plain_beyond_noise"] is None and single[0]["meets_1_5x"] is False
    assert "one round" in bench.format_ratio_table(single)


def test_skipped_when_the_generator_cannot_install(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "ensure_loadgen", lambda root, spec: (None, f"could not install {spec}: offline"))
    monkeypatch.setattr(bench, "serve_supports", lambda flag: False)
    out = tmp_path / "load.json"
    assert bench.main(["--engine_dir", str(tmp_path), "--output_json", str(out), "--num_threads", "1"]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    data = json.loads(out.read_text())
    assert data["status"] == "skipped" and "offline" in data["reason"]
    assert data["num_threads"] == 1 and "versions" in data and "cpu_flags" in data


# aiperf 0.13.0's inputs.json and outputs.json (--export-outputs-json) of one chat run,
# captured against serve.py (max_tokens 8) and trimmed: the prompts shortened, metrics cut.
INPUTS = {"data": [
    {"session_id": "ca5fca16-fc65-4155-960d-16ab2d16986c", "payloads": [
        {"messages": [{"role": "user", "content": "Add type hints ... def wrap(text, width=70, **kwargs):"}],
         "model": "bench", "stream": True, "max_tokens": 8, "temperature": 0}]},
    {"session_id": "588532ec-b12f-480d-9100-27179ea0c553", "payloads": [
        {"messages": [{"role": "user", "content": "Add a docstring ... def rgb_to_yiq(r, g, b):"}],
         "model": "bench", "stream": True, "max_tokens": 8, "temperature": 0}]},
    {"session_id": "5783c44d-0000-0000-0000-000000000000", "payloads": [
        {"prompt": "never sent", "model": "bench"}]},
]}
OUTPUTS = {"schema_version": "1.0", "data": [
    {"session_num": 0, "conversation_id": "ca5fca16-fc65-4155-960d-16ab2d16986c", "turn_index": 0,
     "metrics": {"output_token_count": 8}, "response_text": "```python\ndef wrap(text,"},
    {"session_num": 1, "conversation_id": "588532ec-b12f-480d-9100-27179ea0c553", "turn_index": 0,
     "metrics": {"output_token_count": 8}, "response_text": "```python\ndef rgb_to_"},
]}


def test_outputs_are_matched_by_prompt(bench, tmp_path):
    texts = bench.read_outputs(INPUTS, OUTPUTS)
    assert texts == {"Add type hints ... def wrap(text, width=70, **kwargs):": "```python\ndef wrap(text,",
                     "Add a docstring ... def rgb_to_yiq(r, g, b):": "```python\ndef rgb_to_"}
    other = dict(texts)
    other["Add a docstring ... def rgb_to_yiq(r, g, b):"] = "```python\ndef rgb"
    assert bench.compare_outputs(texts, texts) == (2, 2)
    assert bench.compare_outputs(texts, other) == (2, 1)
    assert bench.compare_outputs(texts, {}) == (0, 0)
    (tmp_path / "inputs.json").write_text(json.dumps(INPUTS))
    (tmp_path / "outputs.json").write_text(json.dumps(OUTPUTS))
    assert bench.cell_outputs(tmp_path) == texts
    assert bench.cell_outputs(tmp_path / "missing") == {}
