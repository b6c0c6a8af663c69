"""bench_kernels.py runs end to end on tiny shapes and records what its header says."""
from __future__ import annotations

import json

import torch

from tests.bench import load_bench


def test_a_tiny_run_writes_the_table_and_the_json(tmp_path, capsys):
    bench = load_bench("bench_kernels")
    out = tmp_path / "kernels.json"
    threads = torch.get_num_threads()
    assert bench.main(["--scale", "0.02", "--layers", "2", "--repeats", "1", "--rows", "1,3", "--probe_mib", "4",
                       "--num_threads", str(threads), "--output_json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["num_threads"] == threads and record["rows"] == [1, 3] and record["limit_gbs"] > 0
    names = {r["candidate"] for r in record["results"]}
    assert {"mkl", "c_fp32", "c_int8", "c_int4"} <= names
    assert all(r["step_ms"] > 0 for r in record["results"])
    assert "threads" in capsys.readouterr().out


def test_an_unknown_candidate_is_one_line_and_exit_2(tmp_path, capsys):
    bench = load_bench("bench_kernels")
    code = bench.main(["--scale", "0.02", "--layers", "1", "--candidates", "cublas", "--probe_mib", "4",
                       "--num_threads", str(torch.get_num_threads()), "--output_json", str(tmp_path / "k.json")])
    assert code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
