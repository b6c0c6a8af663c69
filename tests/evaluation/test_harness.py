"""Timing excludes the warm-up batch but its outputs are still kept (and so scored)."""
from __future__ import annotations

import pytest

from promptlookup.evaluation.harness import Generated, batched, run_batches


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _echo_generator(clock: ManualClock, seconds_per_batch: list[float], calls: list[int]):
    """Returns each prompt reversed; batch i takes seconds_per_batch[i] on the manual clock."""

    def generate(prompts, hook):
        calls.append(len(prompts))
        out = []
        for p in prompts:
            hook(len(p))
            out.append(Generated(list(reversed(p)), steps=len(p), drafted=0, accepted=0))
        clock.now += seconds_per_batch[len(calls) - 1]
        return out

    return generate


def test_warmup_batch_is_scored_but_not_timed():
    clock, calls = ManualClock(), []
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10], [11, 12]]
    batches = batched(prompts, 2)
    assert [len(b) for b in batches] == [2, 2, 1]
    record = run_batches("x", _echo_generator(clock, [50.0, 2.0, 3.0], calls), batches, clock=clock, progress=False)
    assert calls == [2, 2, 1]
    assert [o.output_ids for o in record.outputs] == [list(reversed(p)) for p in prompts]  # all kept, in order
    assert record.batch_seconds == [50.0, 2.0, 3.0]
    assert record.timed_batches == 2
    assert record.timed_seconds == pytest.approx(5.0)  # the 50 s warm-up is excluded
    assert record.timed_tokens == (1 + 4) + 2  # batches 2 and 3 only
    assert record.tokens_per_second == pytest.approx(7 / 5.0)


def test_single_batch_has_no_throughput():
    clock = ManualClock()
    record = run_batches("x", _echo_generator(clock, [1.0], []), [[[1, 2, 3]]], clock=clock, progress=False)
    assert record.timed_batches == 0 and record.tokens_per_second is None
    assert record.outputs[0].output_ids == [3, 2, 1]


def test_progress_bar_runs(capsys):
    clock = ManualClock()
    run_batches("bar", _echo_generator(clock, [1.0, 1.0], []), [[[1]], [[2, 3]]], clock=clock, progress=True)
    assert "tok/s" in capsys.readouterr().err


def test_wrong_output_count_is_an_error():
    with pytest.raises(RuntimeError):
        run_batches("x", lambda prompts, hook: [], [[[1]]], progress=False)


def test_batched_rejects_zero():
    with pytest.raises(ValueError):
        batched([1], 0)
