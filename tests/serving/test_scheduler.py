"""The continuous-batching scheduler: requests join a running batch, leave it when done or
cancelled, free their KV blocks, and produce decoding.generate's tokens."""
from __future__ import annotations

import pytest

from promptlookup.decoding import generate
from promptlookup.drafting import DraftConfig, make_drafter
from promptlookup.errors import UserError
from promptlookup.engine.load import load_runner
from promptlookup.decoding.draft_budget import allot
from promptlookup.decoding.scheduler import GenerationRequest, Scheduler


@pytest.fixture(scope="module")
def runner(tiny_engine_dir):
    return load_runner(tiny_engine_dir)


@pytest.fixture()
def scheduler(runner):
    s = Scheduler(runner, make_drafter(DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2)))
    yield s
    s.close()
    assert all(c == 0 for c in runner.blocks.refcount)


def prompt(seed: int, n: int = 30) -> list[int]:
    base = [(seed * 31 + i * 7) % 400 + 10 for i in range(6)]
    return (base * 10)[:n]


def collect(handle) -> tuple[list[int], str]:
    tokens, reason = [], None
    for ev in handle.events(timeout=120):
        tokens += ev.tokens
        reason = ev.finish_reason
    return tokens, reason


def test_a_request_joins_a_running_batch_and_leaves_first(scheduler, runner):
    order = []
    long = scheduler.submit(GenerationRequest(prompt(1), 200, end_id=10**6))
    first = next(long.events(timeout=120))  # the long request is running
    short = scheduler.submit(GenerationRequest(prompt(2), 5, end_id=10**6))
    short_tokens, reason = collect(short)
    order.append("short")
    assert reason == "length" and len(short_tokens) == 5
    assert long.finish_reason is None  # still generating when the short one finished
    long_tokens, reason = collect(long)
    long_tokens = first.tokens + long_tokens
    assert reason == "length" and len(long_tokens) == 200
    ref = generate(runner, [prompt(1), prompt(2)], max_new_tokens=200, end_id=10**6)
    assert long_tokens == ref[0].output_ids and short_tokens == ref[1].output_ids[:5]
    assert scheduler.stats.sequence_steps > scheduler.stats.batch_steps  # steps were shared


def test_cancel_frees_blocks(scheduler, runner):
    h = scheduler.submit(GenerationRequest(prompt(3), 1000, end_id=10**6))
    next(h.events(timeout=120))
    h.cancel()
    _, reason = collect(h)
    assert reason == "cancelled"
    assert scheduler.wait_idle(60)
    assert all(c == 0 for c in runner.blocks.refcount)
    assert scheduler.stats.requests_cancelled == 1


def test_bad_requests_fail_at_submit(scheduler):
    with pytest.raises(UserError, match="max_input_len"):
        scheduler.submit(GenerationRequest([5] * 2000, 4, end_id=2))
    with pytest.raises(UserError, match="max_seq_len"):
        scheduler.submit(GenerationRequest([5] * 10, 5000, end_id=2))
    with pytest.raises(UserError, match="at least 1"):
        scheduler.submit(GenerationRequest([5] * 10, 0, end_id=2))


@pytest.mark.parametrize("lengths,budget,expected", [
    ([10], 11, [10]),  # one sequence: its whole draft
    ([10, 10], 11, [4, 5]),  # shared: budget - n tokens in all
    ([0, 10, 10], 11, [0, 4, 4]),
    ([2, 10], 11, [2, 7]),  # a short proposal leaves its share to the others
    ([10] * 11, 11, [0] * 11),  # a batch as large as the budget decodes plainly
])
def test_draft_budget(lengths, budget, expected):
    got = allot(lengths, budget)
    assert got == expected
    assert sum(got) <= max(0, budget - len(lengths)) and all(g <= n for g, n in zip(got, lengths))


def test_a_failed_step_fails_its_requests_and_the_loop_goes_on(scheduler, monkeypatch):
    real = scheduler._batch.step_trees
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler._batch, "step_trees", flaky)
    failed = scheduler.submit(GenerationRequest(prompt(4), 5, end_id=10**6))
    events = list(failed.events(timeout=120))
    assert events[-1].finish_reason == "error" and events[-1].error == "boom"
    tokens, reason = collect(scheduler.submit(GenerationRequest(prompt(4), 5, end_id=10**6)))
    assert reason == "length" and len(tokens) == 5
    assert scheduler.stats.requests_failed == 1


def test_allot_by_cost_flat_costs_keep_the_budget_linear_costs_keep_nothing():
    from promptlookup.decoding.draft_budget import allot_by_cost

    lengths, rates = [6, 6, 2], [(0.9, 0.8), (0.3, 0.5), (0.9, 0.9)]
    flat = [0.0] + [1.0] * 20
    assert allot_by_cost(lengths, rates, flat, 11) == allot(lengths, 11)
    linear = [0.0] + [float(q) for q in range(1, 21)]
    assert allot_by_cost(lengths, rates, linear, 11) == [0, 0, 0]
    # between the two: only the likely tokens, each sequence's prefix, most valuable first
    mild = [0.0] + [1.0 + 0.1 * q for q in range(1, 21)]
    got = allot_by_cost(lengths, rates, mild, 11)
    assert got[0] >= got[1] and all(g <= a for g, a in zip(got, allot(lengths, 11)))
    assert allot_by_cost([4] * 5, [(1.0, 1.0)] * 5, [0.0, 1.0, 1.0, 1.0], 20) == [0] * 5  # beyond the table


@pytest.mark.parametrize("costs,drafts", [([0.0] + [1.0] * 30, True), ([0.0] + [float(q) for q in range(1, 31)], False)])
def test_cost_table_decides_whether_a_batch_drafts(runner, costs, drafts):
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=6, max_matching_ngram_size=2))
    s = Scheduler(runner, drafter, step_costs=costs)
    try:
        handles = [s.submit(GenerationRequest(prompt(i), 24, end_id=10**6, request_id=i)) for i in range(3)]
        outs = [collect(h)[0] for h in handles]
    finally:
        s.close()
    ref = generate(runner, [prompt(i) for i in range(3)], max_new_tokens=24, end_id=10**6)
    assert outs == [r.output_ids for r in ref]
    assert (s.stats.drafted > 0) == drafts


def test_allot_by_cost_prices_the_padding_of_a_batch():
    """Every sequence is padded to the longest draft: with 8 live sequences, one long draft
    costs 8 times its length, so a mildly rising table keeps drafts short and even."""
    from promptlookup.decoding.draft_budget import allot_by_cost

    mild = [0.0] + [1.0 + 0.05 * q for q in range(1, 80)]
    sure = [(0.95, 0.95)] + [(0.05, 0.05)] * 7  # one sequence drafts well, seven do not
    got = allot_by_cost([10] + [10] * 7, sure, mild, 80)
    assert max(got) <= 2  # one 10-token draft would pad the step to 88 rows
    alone = allot_by_cost([10], [(0.95, 0.95)], mild, 11)
    assert alone[0] >= 5  # the same draft alone is cheap
