"""The batched step-cost table: its lookups, its JSON form, what the server's budget does
with it, and the shape of a table measured on a tiny model (no timing is asserted)."""
from __future__ import annotations

import math

import pytest

from promptlookup.engine.step_costs import batch_costs_for, batch_sizes_for, measure_batch_costs
from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.batch_costs import BatchStepCosts, single_sequence_prices
from promptlookup.runtime.torch_runner import TorchRunner
from promptlookup.decoding.draft_budget import allot, allot_by_cost
from tests.tiny import tiny_llama

TABLE = BatchStepCosts((1, 2, 4), ((0.0, 1.0, 1.1, 1.2), (0.0, 1.2, 1.5, 1.8), (0.0, 1.6, 2.4)))


def test_lookups_interpolate_between_batch_sizes_and_scale_beyond():
    assert TABLE.step(2, 2) == 1.5
    assert TABLE.step(3, 1) == pytest.approx((1.2 + 1.6) / 2)
    assert TABLE.step(8, 2) == pytest.approx(2.4 * 2)
    assert math.isinf(TABLE.step(4, 3))  # beyond the measured row
    assert math.isinf(TABLE.step(3, 3))  # needs both neighbours
    assert single_sequence_prices([0.0, 1.0, 1.5, 2.0])(2, 1) == 1.5


def test_json_round_trip_and_malformed_entries():
    assert BatchStepCosts.from_json(TABLE.to_json()) == TABLE
    for bad in (None, [], {"batch_sizes": [2], "costs": [[0.0, 1.0]]}, {"batch_sizes": [1]},
                {"batch_sizes": [1, 2], "costs": [[0.0, 1.0]]}, {"batch_sizes": ["x"], "costs": [[0.0, 1.0]]}):
        assert BatchStepCosts.from_json(bad) is None
    stored = {"cpu": {"costs": [0.0, 1.0], "batched": TABLE.to_json()}}
    assert batch_costs_for(stored, "cpu") == TABLE and batch_costs_for(stored, "cuda") is None


def test_the_budget_prices_batched_steps_from_the_batched_table():
    lengths, rates = [6, 6], [(0.9, 0.9), (0.9, 0.9)]
    single_flat = [0.0] + [1.0] * 30  # one sequence: drafts look free
    dear = BatchStepCosts((1, 2), ((0.0, 1.0, 1.0), (0.0, 1.0, 3.0)))  # batched: one draft token triples the step
    assert allot_by_cost(lengths, rates, single_flat, 13) == allot(lengths, 13)
    assert allot_by_cost(lengths, rates, single_flat, 13, dear) == [0, 0]
    cheap = BatchStepCosts((1, 2), ((0.0, 1.0) + (1.0,) * 12, (0.0, 1.0) + (1.05,) * 12))
    assert allot_by_cost(lengths, rates, single_flat, 13, cheap) == allot(lengths, 13)


def test_a_runner_that_skips_padding_is_priced_by_its_rows():
    """One sequence with a good draft and one with a poor one: padded, the poor draft rides
    free in the rows the good one pays for; ragged, every row is priced, so it is dropped."""
    table = BatchStepCosts((1, 2), ((0.0,) + (1.0,) * 9, (0.0, 1.0) + tuple(1.0 + 0.2 * q for q in range(1, 8))))
    lengths, rates = [6, 6], [(0.95, 0.95), (0.05, 0.05)]
    padded = allot_by_cost(lengths, rates, [0.0] + [1.0] * 20, 13, table)
    ragged = allot_by_cost(lengths, rates, [0.0] + [1.0] * 20, 13, table, ragged=True)
    assert padded == [5, 5] and ragged == [5, 0]  # 5: the token budget's share
    # a ragged step of 2 + 3 rows between the table's 2 x 2 and 2 x 3 rows
    per_row = allot_by_cost([3, 0], [(1.0, 1.0), (0.0, 0.0)], [0.0] + [1.0] * 20, 13, table, ragged=True)
    assert per_row == [3, 0]


def test_the_c_route_skips_padding():
    limits = EngineLimits(max_batch_size=2, max_input_len=16, max_seq_len=32, max_draft_len=4, vocab_size=512)
    runner = TorchRunner(tiny_llama(seed=0), limits, tokens_per_block=8, max_tokens_in_paged_kv_cache=64)
    assert runner.skips_padding == (runner.model.layer_records is not None)


def test_measured_table_has_the_documented_shape():
    limits = EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=128, max_draft_len=8, vocab_size=512)
    runner = TorchRunner(tiny_llama(seed=0), limits, tokens_per_block=8, max_tokens_in_paged_kv_cache=512)
    free = runner.blocks.num_available
    table = measure_batch_costs(runner, 9, batch_sizes_for(4), context=30)
    assert table.batch_sizes == (1, 2, 4) and batch_sizes_for(6) == [1, 2, 4, 6]
    assert table.costs[0][:2] == (0.0, 1.0)
    for i, row in enumerate(table.costs):
        assert len(row) == 10 and all(a <= b for a, b in zip(row[1:], row[2:]))
        if i:
            assert all(a <= b for a, b in zip(table.costs[i - 1], row))
    assert runner.blocks.num_available == free  # every block given back


def test_the_cpu_table_names_its_kernels_and_another_route_gets_a_note(monkeypatch):
    from promptlookup.engine import step_costs
    from promptlookup.runtime import kernels

    limits = EngineLimits(max_batch_size=1, max_input_len=16, max_seq_len=32, max_draft_len=2, vocab_size=512)
    runner = TorchRunner(tiny_llama(seed=0), limits, tokens_per_block=8, max_tokens_in_paged_kv_cache=64)
    entry = step_costs.table_entry(runner, 3, context=8)
    assert entry["kernels"] == kernels.isa() and entry["costs"][:2] == [0.0, 1.0]
    stored = {"cpu": entry}
    assert step_costs.route_note(stored, "cpu") is None  # measured on the route this process runs
    assert step_costs.route_note({"cpu": {"costs": [0.0, 1.0]}}, "cpu") is None  # an older table says nothing
    monkeypatch.setattr(kernels, "isa", lambda: "avx2" if entry["kernels"] != "avx2" else "generic")
    note = step_costs.route_note(stored, "cpu")
    assert note is not None and "rebuild it with build.sh" in note and kernels.isa() in note
    assert step_costs.route_note({"cpu": {**entry, "kernels": "reference"}}, "cpu").startswith(
        "its step-cost table was measured on PyTorch's products")
