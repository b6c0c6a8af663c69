"""One verification step over a token tree: layout, logits and commit.

A tree node must see exactly the cached context, the root, its ancestors and itself, at
the root's position plus its depth; the chain step is the path-shaped special case. The
padded (CUDA-graph) layout must compute the eager layout's logits for trees too, and the
accepted path's K/V must end up in the sequence's own consecutive slots.
"""
import random

import pytest
import torch

from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.cuda_graphs import padded_inputs, padded_layout
from promptlookup.runtime.kv_cache import SequenceBlocks
from promptlookup.runtime.paged_llama import build_layout
from promptlookup.runtime.torch_runner import TorchRunner
from promptlookup.runtime.tree import DraftTree, accept_path, merge_chains
from tests.tiny import tiny_llama, zeroed_pool

LIMITS = EngineLimits(max_batch_size=8, max_input_len=256, max_seq_len=400, max_draft_len=24, vocab_size=512)


def random_tree(rng: random.Random, size: int) -> DraftTree:
    parents = [rng.randrange(-1, j) for j in range(size)]
    return DraftTree([rng.randrange(3, 500) for _ in range(size)], parents)


def ancestors_or_self(parents, j):
    out = {j}
    while parents[j] >= 0:
        j = parents[j]
        out.add(j)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_layout_mask_and_positions_follow_the_tree_rule(seed):
    rng = random.Random(seed)
    ctx_before = rng.randrange(1, 40)  # cached tokens, the root among the pending ones
    pending = rng.randrange(1, 4)
    tree = random_tree(rng, rng.randrange(1, 12))
    q = pending + len(tree)
    ctx = ctx_before + q
    rows = list(range(-1, pending - 1)) + [p + pending if p >= 0 else pending - 1 for p in tree.parents]
    table = list(range(1, 1 + -(-ctx // 8)))
    layout = build_layout([[5] * q], [ctx], [table], [len(tree) + 1], 8, torch.device("cpu"), [rows])
    mask = layout.mask[0, 0]
    root_slot = ctx_before + pending - 1
    depths = tree.depths()
    for r in range(q):
        if r < pending:
            want = set(range(ctx_before + r + 1))
            pos = ctx_before + r
        else:
            j = r - pending
            want = set(range(root_slot + 1)) | {root_slot + 1 + a for a in ancestors_or_self(tree.parents, j)}
            pos = root_slot + depths[j]
        assert {k for k in range(ctx) if mask[r, k]} == want
        assert layout.positions[0, r].item() == pos


@pytest.mark.parametrize("in_place", [False, True], ids=["gather", "pool"])
@pytest.mark.parametrize("seed", range(3))
def test_padded_tree_step_equals_eager_tree_step(seed, in_place):
    rng = random.Random(seed)
    runner = TorchRunner(tiny_llama(seed=seed), LIMITS, tokens_per_block=8)
    if in_place:  # as a compiled runner's pool is
        zeroed_pool(runner)
    new, contexts, tables, n_logits, parents = [], [], [], [], []
    for _ in range(rng.randint(1, 4)):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 60))]
        blocks = SequenceBlocks()
        runner.blocks.ensure_capacity(blocks, len(prompt) + 12)
        runner.forward([prompt[:-1]], [len(prompt) - 1], [blocks.blocks], [1])  # the cached context
        tree = random_tree(rng, rng.randint(0, 10))
        base = len(prompt) - 1
        new.append([prompt[-1]] + tree.tokens)
        contexts.append(base + 1 + len(tree))
        tables.append(blocks.blocks)
        n_logits.append(len(tree) + 1)
        parents.append([-1] + [p + 1 if p >= 0 else 0 for p in tree.parents])
    eager = runner.forward(new, contexts, tables, n_logits, parents)
    pool_blocks = runner.pool.num_blocks if in_place else None
    for shape in [(8, 16, 256), (len(new), max(map(len, new)), max(contexts))]:
        flat, rows = padded_inputs(shape, new, contexts, tables, n_logits, runner.pool.block_size, parents)
        padded = runner.model(padded_layout(flat, shape, runner.pool.block_size, pool_blocks), runner.pool).index_select(0, rows)
        torch.testing.assert_close(padded, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_tree_logits_equal_each_paths_chain_logits(seed):
    """Every root-to-node path of a tree gets the logits a chain of that path would get."""
    rng = random.Random(seed)
    model = tiny_llama(seed=seed)
    prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 50))]
    tree = random_tree(rng, rng.randint(2, 12))
    runner = TorchRunner(model, LIMITS, tokens_per_block=8)
    batch = runner.open([prompt])
    tree_choices = batch.step_trees([0], [tree], -1, SamplingConfig())[0].choices
    batch.close()
    for j in range(len(tree)):
        path = tree.path_to(j)
        runner = TorchRunner(model, LIMITS, tokens_per_block=8)
        batch = runner.open([prompt])
        chain = batch.step_trees([0], [DraftTree.chain([tree.tokens[a] for a in path])], -1, SamplingConfig())[0].choices
        batch.close()
        assert chain[0] == tree_choices[0]
        assert chain[-1] == tree_choices[1 + j]


def test_accept_path_follows_the_targets_choices():
    tree = merge_chains([[5, 6, 7], [5, 8], [9, 1]])
    assert tree.tokens == [5, 6, 7, 8, 9, 1] and tree.parents == [-1, 0, 1, 0, -1, 4]
    # root chooses 5, node 5 (index 0) chooses 8, node 8 (index 3) chooses 4
    choices = [5, 8, 0, 0, 4, 0, 0]
    assert accept_path(tree, choices, end_id=2) == ([0, 3], [5, 8, 4])
    assert accept_path(tree, [3] + [0] * 6, end_id=2) == ([], [3])
    # end_id is never walked through: it ends the output
    assert accept_path(DraftTree.chain([2, 5]), [2, 5, 6], end_id=2) == ([], [2])
    # a non-walkable node is computed but never accepted
    blocked = DraftTree([5, 6], [-1, 0], walkable=[False, True])
    assert accept_path(blocked, [5, 6, 7], end_id=2) == ([], [5])


def test_commit_moves_an_accepted_branch_into_consecutive_slots():
    """After accepting a second branch, the next step sees the same K/V as plain decoding."""
    model = tiny_llama(seed=3)
    prompt = [11, 12, 13, 14, 15]
    plain = TorchRunner(model, LIMITS, tokens_per_block=4)
    b = plain.open([prompt])
    want = []
    for _ in range(6):
        want += b.step([0], [[]], end_id=2, sampling=SamplingConfig())[0].tokens
    b.close()
    runner = TorchRunner(model, LIMITS, tokens_per_block=4)
    b = runner.open([prompt])
    # a decoy first branch, then the true continuation as the second branch
    tree = merge_chains([[want[0] + 1, 7, 7], want[:3]])
    res = b.step_trees([0], [tree], end_id=2, sampling=SamplingConfig())[0]
    path, _ = accept_path(tree, res.choices, end_id=2)  # the accepted nodes, from the target's choices
    assert res.tokens == want[:4] and res.accepted == 3 and path == [3, 4, 5]
    got = list(res.tokens)
    while len(got) < len(want):
        got += b.step([0], [[]], end_id=2, sampling=SamplingConfig())[0].tokens
    b.close()
    assert got[: len(want)] == want
