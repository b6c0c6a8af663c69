"""Block manager: prefix matching, reuse, copy-on-diverge and LRU eviction."""
import pytest
import torch

from promptlookup.errors import UserError
from promptlookup.runtime.kv_cache import SCRATCH_BLOCK, BlockManager, KVPool


def manager(num_blocks=16, block_size=4, reuse=True):
    pool = KVPool(num_layers=1, num_kv_heads=1, head_dim=2, block_size=block_size, num_blocks=num_blocks)
    return BlockManager(pool, enable_reuse=reuse)


def run_sequence(m, tokens):
    """Open, 'compute' (fill slots with the token id), release; return cached count."""
    seq, cached = m.match_prefix(tokens)
    m.ensure_capacity(seq, len(tokens))
    bs = m.block_size
    for pos in range(cached, len(tokens)):
        b = seq.blocks[pos // bs]
        m.pool.k[0][:, b * bs + pos % bs] = float(tokens[pos])
    # The cached part must hold exactly these tokens' values.
    for pos in range(len(tokens)):
        b = seq.blocks[pos // bs]
        assert m.pool.k[0][0, b * bs + pos % bs, 0].item() == float(tokens[pos])
    m.release(seq, tokens)
    return cached


def test_full_prefix_is_reused_and_last_token_left():
    m = manager()
    toks = list(range(10, 22))  # 3 full blocks
    assert run_sequence(m, toks) == 0
    assert run_sequence(m, toks) == 11  # everything but the last token
    assert run_sequence(m, toks + [99, 98]) == 12


def test_partial_tail_is_found_for_v1_resubmission():
    m = manager()
    toks = list(range(10, 17))  # 1 full block + partial tail of 3
    run_sequence(m, toks)
    assert run_sequence(m, toks + [50]) == 7
    assert m.stats.copied_blocks == 0  # the unused tail block was taken over, not copied


def test_diverging_block_is_copied_not_shared():
    m = manager()
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    run_sequence(m, a)
    b = [1, 2, 3, 4, 5, 6, 70, 80, 90]
    assert run_sequence(m, b) == 6
    assert m.stats.copied_blocks == 1
    # The original is intact: a re-run of `a` still reuses all but its last token.
    assert run_sequence(m, a) == 8


def test_no_reuse_when_disabled():
    m = manager(reuse=False)
    toks = list(range(10, 22))
    run_sequence(m, toks)
    assert run_sequence(m, toks) == 0


def test_lru_eviction_keeps_working_under_a_tiny_budget():
    m = manager(num_blocks=5, block_size=4)  # 4 usable blocks
    handed_out: set[int] = set()
    take = m._take_free_block

    def recording() -> int:
        block = take()
        handed_out.add(block)
        return block

    m._take_free_block = recording
    for start in range(1, 200, 13):
        toks = list(range(start, start + 14))  # needs 4 blocks: every sequence evicts
        assert run_sequence(m, toks) == 0
    assert m.stats.evicted_blocks > 0
    assert handed_out == {1, 2, 3, 4}  # every usable block, and never the scratch block
    bs = m.block_size
    scratch = m.pool.k[0][:, SCRATCH_BLOCK * bs : (SCRATCH_BLOCK + 1) * bs]
    assert torch.count_nonzero(scratch) == 0  # no sequence wrote into it


def test_out_of_blocks_is_a_clear_error():
    m = manager(num_blocks=3, block_size=4)
    seq, _ = m.match_prefix([1, 2, 3])
    with pytest.raises(UserError, match=r"KV cache is full \(all 8 tokens, 2 blocks of 4, in use\); raise "
                                        r"--max_tokens_in_paged_kv_cache above it"):
        m.ensure_capacity(seq, 20)


def test_shared_blocks_are_refcounted():
    m = manager()
    toks = list(range(10, 22))
    run_sequence(m, toks)
    s1, c1 = m.match_prefix(toks)
    s2, c2 = m.match_prefix(toks)
    assert c1 == c2 == 11
    assert s1.blocks[:2] == s2.blocks[:2]
    assert m.refcount[s1.blocks[0]] == 2
    m.release(s1, toks[:c1])
    m.release(s2, toks[:c2])
    assert all(m.refcount[b] == 0 for b in s1.blocks + s2.blocks)
    assert torch.is_tensor(m.pool.k[0])
