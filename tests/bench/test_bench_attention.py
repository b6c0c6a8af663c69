"""bench/bench_attention.py: a tiny run over float32 and float16 pools (its JSON's fields, no
timing asserted)."""
import json

import pytest

from promptlookup.runtime import kernels
from tests.bench import load_bench


def test_tiny_run_times_every_path_over_both_pool_types(tmp_path):
    if not kernels.available_isas():
        pytest.skip("the C kernels are not built (make native)")
    import torch

    bench = load_bench("bench_attention")
    out = tmp_path / "attention.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--rows", "1", "3", "--context", "40", "--layers", "2", "--rounds", "1", "--flush_mib", "1",
                           "--num_threads", "1", "--kv_dtypes", "float32", "float16", "--output_json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    assert res["kv_dtypes"] == ["float32", "float16"]
    columns = {f"{p} {d}" for p in kernels.available_isas() for d in ("float32", "float16")}
    for step in ("1 rows, hot", "1 rows, cold", "3 rows, hot", "3 rows, cold"):
        assert set(res["ms"][step]) == columns and all(v > 0 for v in res["ms"][step].values())
