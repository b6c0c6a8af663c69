"""DecodeBatch.add/remove (continuous batching): a sequence joining a running batch gets
the tokens it would get alone, indices stay stable, and remove releases every block."""
from __future__ import annotations

from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.torch_runner import TorchRunner
from tests.tiny import tiny_llama

LIMITS = EngineLimits(max_batch_size=3, max_input_len=64, max_seq_len=128, max_draft_len=4, vocab_size=128)


def make_runner() -> TorchRunner:
    return TorchRunner(tiny_llama(seed=2, vocab_size=128), LIMITS, tokens_per_block=8)


def test_join_and_leave_between_steps():
    runner = make_runner()
    a, b, c = [5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23]
    alone = {}
    for name, p in (("a", a), ("b", b), ("c", c)):
        alone[name] = runner.generate([p], max_new_tokens=8, end_id=-1)[0].output_ids
    batch = runner.open([a])
    greedy = SamplingConfig()
    got = {"a": [], "b": [], "c": []}
    got["a"] += batch.step([0], [[]], -1, greedy)[0].tokens
    ib = batch.add(b, request=1)
    assert ib == 1
    for _ in range(3):
        ra, rb = batch.step([0, ib], [[], []], -1, greedy)
        got["a"] += ra.tokens
        got["b"] += rb.tokens
    batch.remove(0)  # a leaves; b keeps its index, c takes a's slot
    ic = batch.add(c, request=2)
    assert ic == 0
    for _ in range(4):
        rb, rc = batch.step([ib, ic], [[], []], -1, greedy)
        got["b"] += rb.tokens
        got["c"] += rc.tokens
    batch.close()
    assert got["a"] == alone["a"][:4]
    assert got["b"] == alone["b"][:7]
    assert got["c"] == alone["c"][:4]
    assert all(r == 0 for r in runner.blocks.refcount)


def test_remove_releases_blocks_and_full_batch_is_refused():
    import pytest

    from promptlookup.errors import UserError

    runner = make_runner()
    batch = runner.open([[1, 2, 3]] * 3)
    with pytest.raises(UserError, match="max_batch_size"):
        batch.add([4, 5], request=3)
    for i in range(3):
        batch.remove(i)
    with pytest.raises(KeyError):
        batch.remove(0)
    assert all(r == 0 for r in runner.blocks.refcount)
    batch.close()
