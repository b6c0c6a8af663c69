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


def test_padding_groups_cover_each_sequence_once_and_bound_the_padding():
    import random

    from promptlookup.runtime.torch_runner import PADDING_FREE_ROWS, PADDING_SLACK, padding_groups

    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.choice([1, 2, 5, 11, 33, 200, 700]) for _ in range(rng.randint(1, 12))]
        groups = padding_groups(lengths)
        assert sorted(j for g in groups for j in g) == list(range(len(lengths)))
        for g in groups:
            padded = len(g) * max(lengths[j] for j in g)
            assert len(g) == 1 or padded <= max(PADDING_FREE_ROWS, PADDING_SLACK * sum(lengths[j] for j in g))
    assert padding_groups([1] * 8) == [list(range(8))]  # a decoding step stays one pass
    assert padding_groups([500] + [2] * 7) == [[0], list(range(1, 8))]  # a joining prompt runs apart


def test_a_long_prompt_joining_runs_apart_and_changes_no_token():
    from promptlookup.decoding import generate

    limits = EngineLimits(max_batch_size=3, max_input_len=256, max_seq_len=384, max_draft_len=4, vocab_size=128)
    runner = TorchRunner(tiny_llama(seed=2, vocab_size=128), limits, tokens_per_block=8)
    prompts = [[3, 4, 5, 6], [7, 8, 9]]
    long_prompt = [(i * 7) % 100 + 3 for i in range(150)]
    ref = generate(runner, prompts, max_new_tokens=6, end_id=10**6)
    batch = runner.open(prompts)
    try:
        live = [0, 1]
        for _ in range(2):
            batch.step(live, [[], []], 10**6, SamplingConfig())
        j = batch.add(long_prompt, 2)
        calls = runner.stats.forward_calls
        batch.step(live + [j], [[], [], []], 10**6, SamplingConfig())
        assert runner.stats.forward_calls == calls + 2  # the prompt's 150 rows, then the two decoding rows
        for _ in range(5):
            batch.step(live + [j], [[], [], []], 10**6, SamplingConfig())
        got = [batch.seqs[i].output_ids[:6] for i in (0, 1, 2)]
    finally:
        batch.close()
    solo = generate(runner, [long_prompt], max_new_tokens=6, end_id=10**6)[0].output_ids
    assert got[:2] == [r.output_ids for r in ref[:2]] and got[2] == solo
