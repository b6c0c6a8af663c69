"""FlexAttention over the KV pool in place equals attention over the gathered context.

:func:`pool_block_mask` turns block tables, context lengths and row visibility into a
block mask over the whole pool; :func:`pool_attention` must then give, for every real row,
what SDPA gives over that sequence's slots gathered in logical order under the step's
rule (cached context, then ancestors and self among the step's rows). The cases mix
what the mask must get right: blocks in any physical order and shared between sequences,
contexts ending mid-block and on a block edge, a step that starts a sequence (no full
block) or starts on a block edge, token trees, more rows than one query block, and
padded sequences. Run eagerly (densely over the pool); the compiled kernel is checked
against the eager step in ``test_compiled.py``.
"""
import random

import pytest
import torch
import torch.nn.functional as F

from promptlookup.runtime.paged_attention import Q_BLOCK, pool_attention, pool_block_mask

H, KVH, D, BS, NUM_BLOCKS = 6, 2, 16, 8, 128


def _tree(rng: random.Random, q: int) -> list[int]:
    return [-1] + [rng.randrange(-1, r) if rng.random() < 0.3 else r - 1 for r in range(1, q)]


def _visible(parents: list[int]) -> torch.Tensor:
    q = len(parents)
    vis = torch.zeros(q, q, dtype=torch.long)
    for r, p in enumerate(parents):
        vis[r] = vis[p] if p >= 0 else 0
        vis[r, r] = 1
    return vis


def _case(rng: random.Random, batch: int, q: int):
    """Tables, contexts, bases, visibility (padded to ``q`` rows) and each real row count."""
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    shared = [free.pop() for _ in range(2)]  # a prefix two sequences share
    width = 6 + -(-q // BS)
    tables = torch.zeros(batch, width, dtype=torch.long)
    ctx, base = torch.ones(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    visible = torch.zeros(batch, q, q, dtype=torch.long)
    visible[:, :, 0] = 1
    rows = []
    for b in range(batch - 1):  # the last sequence is padding
        n = rng.randint(1, q)
        start = rng.choice([0, BS, 2 * BS, rng.randint(1, (width - 1) * BS - n)])
        c = start + n
        used = -(-c // BS)
        blocks = (shared[: min(used, 2)] if b < 2 and start >= 2 * BS else []) + [free.pop() for _ in range(used)]
        tables[b, :used] = torch.tensor(blocks[:used])
        ctx[b], base[b] = c, start
        visible[b, :n, :n] = _visible(_tree(rng, n))
        rows.append(n)
    return tables, ctx, base, visible, rows


def _reference(q, k, v, tables, ctx, base, visible, rows):
    out = []
    for b, n in enumerate(rows):
        c, s = int(ctx[b]), int(base[b])
        pos = torch.arange(c)
        slots = tables[b][pos // BS] * BS + pos % BS
        mask = torch.zeros(n, c, dtype=torch.bool)
        mask[:, :s] = True
        mask[:, s:] = visible[b, :n, :n].bool()
        out.append(F.scaled_dot_product_attention(q[b : b + 1, :, :n], k[:, slots].unsqueeze(0), v[:, slots].unsqueeze(0),
                                                  attn_mask=mask, enable_gqa=True)[0])
    return out


@pytest.mark.parametrize("q", [1, 4, 16, Q_BLOCK + 5])
@pytest.mark.parametrize("seed", range(3))
def test_pool_attention_equals_attention_over_the_gathered_context(seed, q):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    batch = 4
    k = torch.randn(KVH, NUM_BLOCKS * BS, D)
    v = torch.randn(KVH, NUM_BLOCKS * BS, D)
    queries = torch.randn(batch, H, q, D)
    tables, ctx, base, visible, rows = _case(rng, batch, q)
    mask = pool_block_mask(tables, ctx, base, visible, BS, NUM_BLOCKS)
    got = pool_attention(queries, k, v, mask, D**-0.5)
    assert got.shape == queries.shape and torch.isfinite(got).all()  # padded rows included
    for b, want in enumerate(_reference(queries, k, v, tables, ctx, base, visible, rows)):
        torch.testing.assert_close(got[b, :, : rows[b]], want, rtol=1e-5, atol=1e-5)


def test_the_mask_visits_only_a_sequences_own_blocks_and_skips_the_mask_before_its_rows():
    tables = torch.tensor([[5, 9, 3, 0], [7, 0, 0, 0]])
    ctx, base = torch.tensor([20, 3]), torch.tensor([17, 0])  # 2 full blocks + 1 partial; 1 partial
    visible = torch.ones(2, 4, 4, dtype=torch.long).tril()
    mask = pool_block_mask(tables, ctx, base, visible, BS, 16)
    assert mask.full_kv_num_blocks.view(-1).tolist() == [2, 0]
    assert mask.full_kv_indices[0, 0, 0, :2].tolist() == [5, 9]
    assert mask.kv_num_blocks.view(-1).tolist() == [1, 1]
    assert mask.kv_indices[0, 0, 0, 0].item() == 3 and mask.kv_indices[1, 0, 0, 0].item() == 7
