"""bench/bench_soak.py runs end to end against serve.py on a tiny engine (a few seconds;
no assertion on the memory figures themselves, which depend on the machine)."""
from __future__ import annotations

import json

import pytest

from tests.bench import load_bench


@pytest.mark.slow
def test_a_short_soak_writes_the_table_and_the_json(tiny_engine_dir, tmp_path, capsys):
    bench = load_bench("bench_soak")
    out = tmp_path / "soak.json"
    assert bench.main(["--engine_dir", str(tiny_engine_dir), "--duration", "4", "--sample_every", "1",
                       "--concurrency", "2", "--num_threads", "1", "--ngram_pool_max_patterns", "50",
                       "--output_json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["requests"] > 0 and record["errors"] == 0
    assert len(record["samples"]) >= 2 and all(s["rss_mib"] > 0 for s in record["samples"])
    assert all(s["patterns"] <= 50 for s in record["samples"])
    assert record["machine"]["cpus"] and isinstance(record["flat"], bool)
    assert "warm-up ends" in capsys.readouterr().out
