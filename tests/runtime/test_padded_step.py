"""The CUDA-graph path's padded step computes the eager step's logits (checked on the CPU).

CUDA graphs replay :func:`padded_layout` over :func:`padded_inputs`: sequences padded to
a power-of-two batch, tokens and attended slots, padding written to the scratch block and
masked away. Both attention routes are checked: the gathered slots under a dense mask, and
FlexAttention reading the pool in place (run eagerly here, densely over the pool). Running that layout eagerly on the CPU must give the same logit rows as the
unpadded step, so CI checks the padding even where no GPU exists.
"""
import random

import pytest
import torch

from promptlookup.runtime.base import EngineLimits
from promptlookup.runtime.cuda_graphs import padded_inputs, padded_layout
from promptlookup.runtime.kv_cache import SequenceBlocks
from promptlookup.runtime.torch_runner import TorchRunner
from tests.tiny import tiny_llama, zeroed_pool


@pytest.mark.parametrize("in_place", [False, True], ids=["gather", "pool"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padded_step_equals_eager_step(seed, in_place):
    rng = random.Random(seed)
    limits = EngineLimits(max_batch_size=8, max_input_len=256, max_seq_len=320, max_draft_len=8, vocab_size=512)
    runner = TorchRunner(tiny_llama(seed=seed), limits, tokens_per_block=8)
    if in_place:  # as a compiled runner's pool is
        zeroed_pool(runner)
    n_seq = rng.randint(1, 5)
    seqs, prompts = [], []
    for _ in range(n_seq):  # prefill each sequence eagerly
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(1, 120))]
        blocks = SequenceBlocks()
        runner.blocks.ensure_capacity(blocks, len(prompt) + 9)
        runner.forward([prompt], [len(prompt)], [blocks.blocks], [1])
        seqs.append(blocks)
        prompts.append(prompt)
    new = [[rng.randrange(3, 500) for _ in range(rng.randint(1, 9))] for _ in range(n_seq)]
    contexts = [len(p) + len(t) for p, t in zip(prompts, new)]
    tables = [s.blocks for s in seqs]
    n_logits = [rng.randint(1, len(t)) for t in new]
    eager = runner.forward(new, contexts, tables, n_logits)
    pool_blocks = runner.pool.num_blocks if in_place else None
    for shape in [(8, 16, 256), (n_seq, max(map(len, new)), max(contexts))]:
        flat, rows = padded_inputs(shape, new, contexts, tables, n_logits, runner.pool.block_size)
        padded = runner.model(padded_layout(flat, shape, runner.pool.block_size, pool_blocks), runner.pool).index_select(0, rows)
        assert padded.shape == eager.shape
        torch.testing.assert_close(padded, eager, rtol=1e-4, atol=1e-4)
        assert torch.equal(padded.argmax(-1), eager.argmax(-1))


@pytest.mark.parametrize("in_place", [False, True], ids=["gather", "pool"])
def test_an_empty_padded_step_writes_only_the_scratch_block(in_place):
    limits = EngineLimits(max_batch_size=2, max_input_len=64, max_seq_len=64, max_draft_len=4, vocab_size=512)
    runner = zeroed_pool(TorchRunner(tiny_llama(seed=0), limits, tokens_per_block=8))
    before = [t.clone() for t in runner.pool.k]
    pool_blocks = runner.pool.num_blocks if in_place else None
    flat, rows = padded_inputs((2, 4, 64), [], [], [], [], runner.pool.block_size)
    assert rows.numel() == 0
    logits = runner.model(padded_layout(flat, (2, 4, 64), runner.pool.block_size, pool_blocks), runner.pool)
    assert torch.isfinite(logits).all()
    for old, new in zip(before, runner.pool.k):
        torch.testing.assert_close(new[:, 8:], old[:, 8:], rtol=0, atol=0, equal_nan=True)
