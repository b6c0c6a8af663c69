"""bench/bench_scale.py on the CPU: the tiny shape end to end, in-process (no timing asserted).

The bench itself checks, in float32, that our plain decoding equals Hugging Face's greedy
``generate`` token for token and that V2 lookup equals our plain decoding; this test
reads its JSON for those checks and for the rows and figures the GPU table needs.
"""
import json

import pytest

from tests.bench import load_bench


@pytest.fixture(scope="module")
def bench_scale():
    return load_bench("bench_scale")


def test_tiny_smoke_run_writes_rows_with_identical_tokens(bench_scale, tmp_path):
    out = tmp_path / "scale.json"
    code = bench_scale.main(["--shapes", "tiny", "--device", "cpu", "--batch_sizes", "1", "--new_tokens", "4",
                             "--context", "16", "--reps", "1", "--num_threads", "1", "--copy_mib", "8",
                             "--output_json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["dtype"] == "float32" and data["gpu"] is None
    [row] = data["rows"]
    assert (row["shape"], row["batch"], row["context"], row["new_tokens"]) == ("tiny", 1, 16, 4)
    assert row["token_check"] == "required" and row["tokens_identical"] and row["first_difference"] is None
    assert row["weight_read_bytes"] > 0 and row["kv_read_bytes"] > 0
    # CPU: ratios only, no absolute times
    assert row["hf_ms_per_token"] is None and row["ours_ms_per_token"] is None and row["limit_ms"] is None
    assert data["bandwidth"]["bytes_per_s"] is None and data["setup"]["tiny"]["ours_build_s"] is None
    [lookup] = data["lookup_rows"]
    assert lookup["tokens_identical"] and lookup["tokens_per_step"] >= 1


def test_weight_read_bytes_counts_every_matrix_and_batch_embedding_rows(bench_scale):
    from transformers import LlamaForCausalLM

    config = bench_scale.shape_config("tiny")
    model = LlamaForCausalLM(config)
    matrices = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    assert bench_scale.weight_read_bytes(config, 3, 2) == 2 * (matrices + 3 * config.hidden_size)
    # Llama-3.1-8B in bfloat16: about 15 GiB read per step (8.03 B parameters, 0.53 B of them the embedding)
    big = bench_scale.shape_config("llama-3.1-8b")
    assert 14.9e9 < bench_scale.weight_read_bytes(big, 1, 2) < 15.1e9


def test_repetitive_prompts_repeat_one_chunk(bench_scale):
    [p] = bench_scale.repetitive_prompts(512, 1, 20, 8, seed=0)
    assert len(p) == 20 and p[8:16] == p[:8] and p[16:] == p[:4]


def test_weight_only_rows_run_the_same_weights_quantized(bench_scale, tmp_path):
    out = tmp_path / "scale.json"
    code = bench_scale.main(["--shapes", "tiny", "--device", "cpu", "--batch_sizes", "1", "--new_tokens", "4",
                             "--context", "16", "--reps", "1", "--num_threads", "1", "--copy_mib", "8",
                             "--lookup_k", "0", "--weight_only", "int8,int4g32", "--output_json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    rows = {r["weight_only"]: r for r in data["weight_only_rows"]}
    assert set(rows) == {"int8", "int4g32"}
    [float_row] = data["rows"]
    for r in rows.values():
        assert r["shape"] == "tiny" and r["batch"] == 1
        # a ratio of two times, or None where a 4-token decode was too short to time (no test
        # may depend on timing: on a busy machine either happens)
        assert r["speedup_over_float"] is None or r["speedup_over_float"] > 0
        assert r["ours_ms_per_token"] is None  # CPU: ratios only
        assert 0 < r["weight_read_bytes"] < float_row["weight_read_bytes"]
    assert rows["int4g32"]["resident_weight_bytes"] < rows["int8"]["resident_weight_bytes"]


@pytest.mark.parametrize("argv,message", [
    (["--weight_only", "int9"], "--weight_only takes a comma-separated subset"),
    (["--shapes", "tiny", "--weight_only", "int8g128"], "--weight_only int8g128 on shape tiny: --group_size 128"),
    (["--shapes", "tiny", "--weight_only", "int8", "--torch_compile", "inductor"], "add --torch_compile off"),
])
def test_weight_only_refusals(bench_scale, argv, message):
    from promptlookup.errors import UserError

    with pytest.raises(UserError, match=message):
        bench_scale.parse_args(["--device", "cpu", *argv])
