"""Acceptance on the device (runtime/acceptance.py) against its specification,
:func:`~promptlookup.runtime.tree.accept_path`, and the one-transfer-per-step invariant.

A CPU has no device-to-host copies to count, so the invariant is checked by proxy: the
logits leave the forward pass as a tensor subclass that propagates through every torch
operation and counts the calls that read a tensor's values back into Python (``tolist``,
``item``, ``bool``, ...). On a GPU each such call on a device tensor is a synchronisation.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.runtime.acceptance import fetch_step, last_accepted_nodes
from promptlookup.runtime.base import EngineLimits, SamplingConfig
from promptlookup.runtime.torch_runner import TorchRunner
from promptlookup.runtime.tree import DraftTree, accept_path, merge_chains
from tests.tiny import tiny_llama

END_ID = 2
ALPHABET = st.integers(2, 5)  # few tokens (END_ID among them): matches, duplicate siblings and ends are common


@st.composite
def trees(draw) -> DraftTree:
    size = draw(st.integers(0, 12))
    parents = [draw(st.integers(-1, j - 1)) for j in range(size)]
    tokens = [draw(ALPHABET) for _ in range(size)]
    walkable = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=size, max_size=size)))
    return DraftTree(tokens, parents, walkable)


@st.composite
def steps(draw) -> tuple[list[DraftTree], list[list[int]]]:
    """Trees of one step and the target's choices at every row (root, then nodes)."""
    batch = draw(st.lists(trees(), min_size=1, max_size=4))
    return batch, [[draw(ALPHABET) for _ in range(len(t) + 1)] for t in batch]


@settings(max_examples=200, deadline=None)
@given(steps())
def test_device_acceptance_equals_accept_path(step):
    batch, choices = step
    flat = torch.tensor([c for row in choices for c in row], dtype=torch.long)
    got_choices, got_paths = fetch_step(batch, flat, END_ID)
    assert got_choices == choices
    for tree, mine, path in zip(batch, choices, got_paths):
        assert path == accept_path(tree, mine, END_ID)[0]


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 40])
def test_long_chains_accept_exactly_the_agreeing_prefix(length):
    """Pointer jumping needs ceil(log2(depth)) rounds: check depths around powers of two."""
    draft = [3 + j % 7 for j in range(length)]
    for agree in range(length + 1):
        choices = draft[:agree] + [99] * (length + 1 - agree)
        last = last_accepted_nodes([DraftTree.chain(draft)], torch.tensor(choices), END_ID)
        assert last.tolist() == [agree - 1]


def test_first_walkable_duplicate_sibling_is_taken():
    # nodes 0 and 1 are both children of the root with token 5; accept_path takes node 0
    tree = DraftTree([5, 5, 6, 7], [-1, -1, 0, 1])
    assert fetch_step([tree], torch.tensor([5, 7, 9, 0, 0]), END_ID)[1] == [[0]]
    # unless node 0 is not walkable: then node 1, and its child 7
    blocked = DraftTree([5, 5, 6, 7], [-1, -1, 0, 1], walkable=[False, True, True, True])
    assert fetch_step([blocked], torch.tensor([5, 6, 7, 0, 0]), END_ID)[1] == [[1, 3]]
    assert accept_path(blocked, [5, 6, 7, 0, 0], END_ID)[0] == [1, 3]


class HostReads(torch.Tensor):
    """A tensor that counts how often its values (or those of anything computed from it)
    are read back into Python."""

    reads = 0
    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.__repr__,
             torch.Tensor.__format__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            HostReads.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


SAMPLERS = {
    "greedy": SamplingConfig(),
    "top-k/top-p sampling": SamplingConfig(temperature=0.8, top_k=40, top_p=0.9, random_seed=3),
    "penalties and bad words": SamplingConfig(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.2,
                                              frequency_penalty=0.1, bad_words=((7, 8), (9,))),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_a_step_reads_back_from_the_device_once(monkeypatch, name):
    runner = TorchRunner(tiny_llama(seed=1), EngineLimits(4, 64, 128, 8, 512), tokens_per_block=8)
    forward = runner.forward
    monkeypatch.setattr(runner, "forward", lambda *a, **k: forward(*a, **k).as_subclass(HostReads))
    batch = runner.open([[1, 11, 12, 13, 11, 12], [1, 40, 41, 42]])
    sampling = SAMPLERS[name]
    steps = [
        [DraftTree.chain([13, 11, 12]), DraftTree.chain([])],  # prefill of both sequences
        [merge_chains([[5, 6], [7, 8, 9]]), DraftTree.chain([41, 42])],
        [DraftTree.chain([]), DraftTree([4, 4, 5], [-1, -1, 0], walkable=[True, False, True])],
    ]
    for trees_ in steps:
        HostReads.reads = 0
        results = batch.step_trees([0, 1], trees_, END_ID, sampling)
        assert HostReads.reads == 1, name
        assert all(type(x) is int for r in results for x in r.tokens + r.choices)
    batch.close()


def test_the_read_counter_sees_reads_of_derived_tensors():
    HostReads.reads = 0
    x = torch.ones(3).as_subclass(HostReads)
    (x * 2).sum().item()
    assert bool(x.argmax(-1) >= 0)
    torch.cat([x, torch.zeros(2)]).tolist()
    assert HostReads.reads == 3
