"""bench/bench_limit.py: a tiny engine end to end in-process (its JSON's fields, no timing
asserted), and its refusals of counts it cannot use."""
import json

import pytest

from tests.bench import load_bench


@pytest.fixture(scope="module")
def bench_limit():
    return load_bench("bench_limit")


def test_tiny_run_writes_steps_prefill_and_side_by_side_speeds(bench_limit, tiny_engine_dir, tmp_path):
    import torch

    out = tmp_path / "limit.json"
    threads = torch.get_num_threads()  # the bench sets its own count; the other tests keep theirs
    try:
        code = bench_limit.main(["--engine_dir", str(tiny_engine_dir), "--threads", "1", "--context", "40", "--steps", "2",
                                 "--matrix_mib", "1", "--repeats", "1", "--num_code", "0", "--prefill_rounds", "2",
                                 "--against", str(tiny_engine_dir), f"{tiny_engine_dir}@float16",
                                 "--output_json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    results = json.loads(out.read_text())
    assert results["kv_cache_dtype"] == "float32"
    row = results["by_threads"]["1"]
    assert row["plain_ms"] > 0 and row["verify11_ms"] > 0 and row["prefill_ms"] > 0
    side_by_side = row["against"][str(tiny_engine_dir)]  # the engine against itself, steps alternated
    assert side_by_side["plain_ms"] > 0 and side_by_side["speed_over_base"] > 0 and side_by_side["speed_over_base_cpu"] > 0
    assert row["against"][f"{tiny_engine_dir}@float16"]["plain_ms"] > 0  # the same engine over a float16 cache


def test_an_against_cache_type_it_does_not_know_is_refused(bench_limit, tiny_engine_dir):
    from promptlookup.errors import UserError

    with pytest.raises(UserError, match="'int3' is not a KV cache dtype"):
        bench_limit.main(["--engine_dir", str(tiny_engine_dir), "--against", f"{tiny_engine_dir}@int3"])


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--threads", "2", "0"], "--threads must be at least 1, got 0"),
    (["--prefill_rounds", "-1"], "--prefill_rounds must be at least 0, got -1"),
])
def test_counts_it_cannot_use_are_refused_in_one_line(bench_limit, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_limit.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
