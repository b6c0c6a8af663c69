"""BlockManager against a simple model of it, under long seeded random operation sequences.

The model is what the manager's docstring promises, kept independently of its internals:

- the live sequences, each with the tokens whose K/V its slots hold (the test "computes"
  a token by writing its id into the slot, so the pool's contents can be read back);
- every block's refcount is the number of live block tables that list it;
- every usable block is in exactly one of free, cached (LRU) and in use, and block 0 (the
  scratch block) in none;
- a matched prefix holds exactly the request's tokens, and is never longer than the
  longest common prefix with a sequence released earlier (nor the whole request);
- a registered block holds the tokens it is registered under.

Operations: open a request (``match_prefix`` + ``ensure_capacity``), extend a live sequence
(``ensure_capacity``), share a live sequence's computed prefix (``register_prefix``, as
after its prompt's step: later requests may then map it while it lives), release one
(``release``), with eviction forced by small pools. Every live sequence's slots are
checked after every operation, so a shared block written by another sequence, or
evicted while held, fails the check.
Requests are drawn from a few shared "documents" so that prefixes recur.
"""
from __future__ import annotations

import os
import random

import pytest

from promptlookup.errors import UserError
from promptlookup.runtime.kv_cache import SCRATCH_BLOCK, BlockManager, KVPool


class Model:
    def __init__(self, rng: random.Random, num_blocks: int, block_size: int, reuse: bool) -> None:
        pool = KVPool(num_layers=1, num_kv_heads=1, head_dim=1, block_size=block_size, num_blocks=num_blocks)
        self.m = BlockManager(pool, enable_reuse=reuse)
        self.rng = rng
        self.live: list[tuple[object, list[int]]] = []  # (SequenceBlocks, tokens held)
        self.released: list[list[int]] = []
        self.shared: list[list[int]] = []  # prefixes registered while their sequence lived
        self.live_hits = 0  # matches longer than any released sequence gives: from a live one
        docs = [[rng.randint(1, 4) for _ in range(40)] for _ in range(3)]
        self.docs = docs

    # -- helpers ---------------------------------------------------------------------
    def slot_value(self, seq, pos: int) -> int:
        bs = self.m.block_size
        return int(self.m.pool.k[0][0, seq.blocks[pos // bs] * bs + pos % bs, 0].item())

    def write(self, seq, tokens: list[int], start: int) -> None:
        bs = self.m.block_size
        for pos in range(start, len(tokens)):
            self.m.pool.k[0][0, seq.blocks[pos // bs] * bs + pos % bs, 0] = float(tokens[pos])

    def request(self) -> list[int]:
        doc = self.rng.choice(self.docs)
        tokens = doc[: self.rng.randint(1, len(doc))]
        if self.rng.random() < 0.4:  # diverge somewhere
            tokens = tokens[: self.rng.randint(0, len(tokens))] + [self.rng.randint(1, 4) for _ in range(self.rng.randint(1, 6))]
        return tokens

    @staticmethod
    def lcp(a: list[int], b: list[int]) -> int:
        return len(os.path.commonprefix([a, b]))

    # -- operations ------------------------------------------------------------------
    def open(self) -> None:
        tokens = self.request()
        try:
            seq, cached = self.m.match_prefix(tokens)
        except UserError:
            return  # a full cache, reported as such; the invariants still hold (checked next)
        assert 0 <= cached <= max(len(tokens) - 1, 0)
        assert cached <= max((self.lcp(tokens, r) for r in self.released + self.shared), default=0)
        self.live_hits += cached > max((self.lcp(tokens, r) for r in self.released), default=0)
        assert all(self.slot_value(seq, p) == tokens[p] for p in range(cached))
        try:
            self.m.ensure_capacity(seq, len(tokens))
        except UserError:
            self.m.release(seq, tokens[:cached])  # the matched part is valid and may be kept
            return
        self.write(seq, tokens, cached)
        self.live.append((seq, tokens))

    def extend(self) -> None:
        if not self.live:
            return
        i = self.rng.randrange(len(self.live))
        seq, tokens = self.live[i]
        more = tokens + [self.rng.randint(1, 4) for _ in range(self.rng.randint(1, 7))]
        try:
            self.m.ensure_capacity(seq, len(more))
        except UserError:
            return
        self.write(seq, more, len(tokens))
        self.live[i] = (seq, more)

    def share(self) -> None:
        if not self.live:
            return
        seq, tokens = self.live[self.rng.randrange(len(self.live))]
        length = self.rng.randint(0, len(tokens))
        self.m.register_prefix(seq, tokens, length)
        self.shared.append(tokens[:length])  # now a source of cached prefixes, as a released one

    def release(self) -> None:
        if not self.live:
            return
        seq, tokens = self.live.pop(self.rng.randrange(len(self.live)))
        self.m.release(seq, tokens)
        assert seq.blocks == []
        self.released.append(tokens)

    # -- invariants ------------------------------------------------------------------
    def check(self) -> None:
        m = self.m
        n = m.pool.num_blocks
        expected = [0] * n
        for seq, tokens in self.live:
            assert len(seq.blocks) * m.block_size >= len(tokens)
            for b in seq.blocks:
                expected[b] += 1
            assert all(self.slot_value(seq, p) == tokens[p] for p in range(len(tokens)))
        assert m.refcount == expected
        free, lru = set(m.free), set(m.lru)
        in_use = {b for b in range(n) if m.refcount[b] > 0}
        assert len(free) == len(m.free)  # no block listed twice
        assert not (free & lru) and not (free & in_use) and not (lru & in_use)
        assert free | lru | in_use == set(range(1, n))
        assert SCRATCH_BLOCK not in free | lru | in_use
        assert lru == {b for b in m.reg if m.refcount[b] == 0}  # cached = registered and unreferenced
        assert not (free & set(m.reg))
        bs = m.block_size
        for b, r in m.reg.items():
            assert len(r.tokens) == bs if r.full else 0 < len(r.tokens) < bs
            assert [int(m.pool.k[0][0, b * bs + j, 0].item()) for j in range(len(r.tokens))] == list(r.tokens)
            if r.full:
                assert m.full_index[(r.parent_key, r.tokens)] == b
            assert b in m.children[r.parent_key]
        assert len(m.full_index) == sum(r.full for r in m.reg.values())


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_keep_the_block_manager_consistent(seed):
    rng = random.Random(seed)
    model = Model(rng, num_blocks=rng.choice([4, 7, 12, 40]), block_size=rng.choice([1, 2, 4]),
                  reuse=seed % 6 != 5)
    ops = [model.open, model.open, model.extend, model.share, model.release]
    for _ in range(250):
        rng.choice(ops)()
        model.check()
    while model.live:
        model.release()
        model.check()
    assert model.m.num_available == model.m.pool.num_blocks - 1  # everything came back


def test_the_random_runs_exercise_reuse_and_eviction():
    """A guard against a model so gentle that the checks above test nothing."""
    stats = []
    live_hits = 0
    for seed in range(12):
        rng = random.Random(seed)
        model = Model(rng, num_blocks=rng.choice([4, 7, 12, 40]), block_size=rng.choice([1, 2, 4]), reuse=True)
        for _ in range(250):
            rng.choice([model.open, model.open, model.extend, model.share, model.release])()
        stats.append(model.m.stats)
        live_hits += model.live_hits
    assert sum(s.matched_tokens for s in stats) > 0
    assert sum(s.copied_blocks for s in stats) > 0
    assert sum(s.evicted_blocks for s in stats) > 0
    assert live_hits > 0
