"""bench/bench_llamacpp.py: reading llama.cpp's output (captured samples; no build, no timing)
and the bench's own option parsing."""
import pytest

from promptlookup.errors import UserError
from tests.bench import load_bench

# The end of llama-completion's stderr, captured (llama.cpp 0c1e57098 from llama-cpp-python
# 0.3.36, SmolLM2-135M-Instruct Q4_1, -t 1, -n 30, a 14-token prompt; a loaded machine).
COMPLETION_LOG = """\
0.00.809.315 I generate: n_ctx = 512, n_batch = 2048, n_predict = 30, n_keep = 0
0.00.809.315 I 
0.02.347.961 I common_perf_print:    sampling time =      12.78 ms
0.02.347.979 I common_perf_print:    samplers time =       1.00 ms /    44 tokens
0.02.347.985 I common_perf_print:        load time =     400.43 ms
0.02.348.000 I common_perf_print: prompt eval time =     257.12 ms /    14 tokens (   18.37 ms per token,    54.45 tokens per second)
0.02.348.001 I common_perf_print:        eval time =    1266.45 ms /    29 runs   (   43.67 ms per token,    22.90 tokens per second)
0.02.348.002 I common_perf_print:       total time =    1539.03 ms /    43 tokens
0.02.348.003 I common_perf_print: unaccounted time =       2.67 ms /   0.2 %      (total - sampling - prompt eval - eval) / (total)
0.02.348.003 I common_perf_print:    graphs reused =         28
"""

# The end of llama-lookup's stderr, captured with the same build, model and prompt
# (--spec-draft-n-max 10). Its context lines count draft batches as prompt eval: not used.
LOOKUP_LOG = """\
0.02.764.396 I encoded   14 tokens in    0.278 seconds, speed:  183.364 t/s
0.02.764.397 I decoded   37 tokens in    1.762 seconds, speed:   20.994 t/s
0.02.764.397 I 
0.02.764.398 I n_draft      = 10
0.02.764.398 I n_predict    = 37
0.02.764.398 I n_drafted    = 30
0.02.764.399 I t_draft_flat = 0.02 ms
0.02.764.401 I t_draft      = 0.29 ms, 9.67 us per token, 103448.28 tokens per second
0.02.764.418 I n_accept     = 11
0.02.764.419 I accept       = 36.667%
0.02.764.419 I 
target:

0.02.764.426 I common_perf_print:    sampling time =       4.92 ms
0.02.764.427 I common_perf_print:    samplers time =       1.10 ms /    37 tokens
0.02.764.449 I common_perf_print:        load time =     275.19 ms
0.02.764.450 I common_perf_print: prompt eval time =     821.85 ms /    47 tokens (   17.49 ms per token,    57.19 tokens per second)
0.02.768.345 I common_perf_print:        eval time =     947.23 ms /    22 runs   (   43.06 ms per token,    23.23 tokens per second)
"""


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_llamacpp")


def test_plain_timings_read_the_prompt_and_eval_lines(bench):
    t = bench.parse_plain_timings(COMPLETION_LOG)
    assert (t.prompt_ms, t.prompt_tokens, t.eval_ms, t.eval_runs) == (257.12, 14, 1266.45, 29)


def test_plain_timings_accept_older_prefixes_and_take_the_last_report(bench):
    old = COMPLETION_LOG.replace("0.02.348.001 I common_perf_print", "llama_perf_context_print")
    earlier = ("llama_perf_context_print:        eval time =      1.00 ms /     1 runs   "
               "(1 ms per token, 1 tokens per second)\n")
    t = bench.parse_plain_timings(earlier + old)
    assert (t.eval_ms, t.eval_runs) == (1266.45, 29)


def test_lookup_timings_read_its_summary_not_the_context_lines(bench):
    t = bench.parse_lookup_timings(LOOKUP_LOG)
    assert (t.encoded_tokens, t.encode_s, t.decoded_tokens, t.decode_s) == (14, 0.278, 37, 1.762)
    assert (t.drafted, t.accepted) == (30, 11)


@pytest.mark.parametrize("parse", ["parse_plain_timings", "parse_lookup_timings"])
def test_a_log_without_timings_is_an_error(bench, parse):
    with pytest.raises(ValueError, match="printed no"):
        getattr(bench, parse)("llama_model_load: error loading model\n")


def test_token_ids_and_output_texts(bench):
    assert bench.parse_token_ids("[1, 9690, 198, 2]\n") == [1, 9690, 198, 2]
    assert bench.plain_output_text("def f(x: int) -> int:\n    return x [end of text]\n\n\n") == \
        "def f(x: int) -> int:\n    return x"
    assert bench.plain_output_text("def f(x: int) -> int:\n\n\n\n") == "def f(x: int) -> int:\n\n"
    prompt = "<|im_start|>user\nAdd hints<|im_end|>\n<|im_start|>assistant\n"
    stdout = f"\n\n{prompt}def f(x: int):<|im_end|>\n\n\n\n"
    assert bench.lookup_output_text(stdout, prompt, "<|im_end|>") == "def f(x: int):"
    assert bench.lookup_output_text(f"\n\n{prompt}abc\n\n\n\n", prompt, "<|im_end|>") == "abc"


def test_outputs_agree_over_their_common_length(bench):
    assert bench.agree_over_common_length("abc", "abcdef")
    assert not bench.agree_over_common_length("abd", "abcdef")
    assert bench.agree_over_common_length("", "x")


def test_lookup_config_takes_k_n_with_or_without_devices(bench):
    assert bench.parse_lookup_config("[10,2]") == (10, 2)
    assert bench.parse_lookup_config("[4, 3, [0]]") == (4, 3)
    with pytest.raises(UserError):
        bench.parse_lookup_config("[0,2]")


def test_engines_are_labelled_by_precision(bench, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert bench.parse_engines(None, f"fp32={a},int8={b}") == [("fp32", a), ("int8", b)]
    assert bench.parse_engines([f"int4={b}"], None) == [("int4", b)]
    assert bench.parse_engines([str(a)], None) == [("a", a)]  # no config.json: the folder's name
    with pytest.raises(UserError, match="share a precision label"):
        bench.parse_engines([f"x={a}", f"x={b}"], None)
    with pytest.raises(UserError, match="no folder"):
        bench.parse_engines([f"int8={tmp_path / 'missing'}"], None)


def test_gguf_precision_comes_from_the_file_name(bench, tmp_path):
    assert bench.gguf_precision(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert bench.gguf_precision(tmp_path / "SmolLM2-135M-Instruct.Q4_1.F32.gguf") == "F32"
