"""Acceptance of a step's draft trees by tensor ops on the model's device.

:func:`~.tree.accept_path` walks one tree on the host, from lists of the target's choices.
Here the same walk runs for every sequence of a step at once, on the device that holds
the chosen tokens, so that the step needs exactly **one device-to-host transfer**: the
chosen tokens at every row together with, per sequence, the last node of its accepted
path (:func:`fetch_step`). The host rebuilds the path from that node by following parents
(``O(depth)``), which gives the same path as :func:`~.tree.accept_path`.

The rule, per node ``j`` of a tree (node ``j`` is slot ``j + 1``; slot 0 is the root)::

    ok[j]       = eligible[j] and tokens[j] == choice[parent slot] != end_id
    accepted[j] = ok[j] and ok[every ancestor of j]

``eligible[j]`` is static (known before the forward pass): ``j`` is walkable and no earlier
walkable sibling carries the same token (``accept_path`` takes the first matching child).
Since siblings differ in token, at most one child of a node can be ``ok``; the accepted
nodes form the path, and its last node is the largest accepted index (parents precede
children).

The ancestor conjunction is computed by pointer jumping: ``ceil(log2(max depth))`` rounds
of ``good &= good[jump]; jump = jump[jump]``. Cost: ``O(S * N)`` host work to lay out the
``S`` trees (padded to ``N`` nodes), one host-to-device copy of ``4N + 1`` int64 per tree
(asynchronous on CUDA), and ``O(S * N * log depth)`` device work in a handful of kernels.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .device import to_device
from .tree import DraftTree


def acceptance_layout(trees: Sequence[DraftTree]) -> tuple[torch.Tensor, int, int]:
    """The static inputs of :func:`last_accepted_nodes` on the host: one int64 tensor
    ``[S, 4N + 1]`` holding, per tree, its choice rows ``[N + 1]`` (slot 0 the root), then
    node tokens, parent slots and eligibility ``[N]`` each; with ``N`` (the largest tree)
    and the number of pointer-jumping rounds. Padding nodes are never eligible.
    O(total nodes)."""
    width = max((len(t) for t in trees), default=0)
    flat: list[int] = []
    first_row, max_depth = 0, 0
    for tree in trees:
        n, pad = len(tree), [0] * (width - len(tree))
        eligible = []
        seen: set[tuple[int, int]] = set()  # (parent, token) of the walkable children so far
        for j, (p, t) in enumerate(zip(tree.parents, tree.tokens)):
            walkable = tree.walkable is None or tree.walkable[j]
            eligible.append(int(walkable and (p, t) not in seen))
            if walkable:
                seen.add((p, t))
        flat += range(first_row, first_row + n + 1)
        flat += pad
        flat += tree.tokens
        flat += pad
        flat += [p + 1 for p in tree.parents]
        flat += pad
        flat += eligible
        flat += pad
        first_row += n + 1
        if n:
            max_depth = max(max_depth, max(tree.depths()))
    return torch.tensor(flat, dtype=torch.long).view(len(trees), 4 * width + 1), width, (max_depth - 1).bit_length()


def last_accepted_nodes(trees: Sequence[DraftTree], chosen: torch.Tensor, end_id: int) -> torch.Tensor:
    """Per tree, the last node of the path :func:`~.tree.accept_path` accepts (``-1``: no
    draft node accepted), as an int64 tensor ``[len(trees)]`` on ``chosen``'s device.

    ``chosen``: the target's choices, ``[sum(len(tree) + 1)]`` int64, in the row order of a
    verification step (per tree: the root, then every node). Reads nothing back to the host.
    """
    flat, n, rounds = acceptance_layout(trees)
    if n == 0:
        return torch.full((len(trees),), -1, dtype=torch.long, device=chosen.device)
    flat = to_device(flat, chosen.device)
    rows, tokens, parent_slots, eligible = flat.split([n + 1, n, n, n], dim=1)
    choice = chosen[rows]  # [S, N + 1]: slot 0 the root's choice, slot j + 1 node j's
    at_parent = choice.gather(1, parent_slots)
    ok = (eligible != 0) & (tokens == at_parent) & (at_parent != end_id)
    good = torch.cat([torch.ones_like(ok[:, :1]), ok], dim=1)  # the root slot is always good
    jump = torch.cat([torch.zeros_like(parent_slots[:, :1]), parent_slots], dim=1)
    for _ in range(rounds):  # after r rounds, good[j] covers j and its 2**r - 1 nearest ancestors
        good = good & good.gather(1, jump)
        jump = jump.gather(1, jump)
    nodes = torch.arange(n, device=chosen.device).expand_as(ok)
    return torch.where(good[:, 1:], nodes, -1).amax(dim=1)


def fetch_step(trees: Sequence[DraftTree], chosen: torch.Tensor, end_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per tree, the target's choices (root, then every node) and the accepted path (node
    indices, root's child first): what :func:`~.tree.accept_path` gives, with the walk on
    the device. This is the step's one device-to-host transfer: ``chosen`` and the last
    accepted nodes travel together in a single ``tolist``."""
    last = last_accepted_nodes(trees, chosen, end_id)
    host = torch.cat([chosen.view(-1).long(), last]).tolist()
    choices, row = [], 0
    for tree in trees:
        choices.append(host[row : row + len(tree) + 1])
        row += len(tree) + 1
    return choices, [tree.path_to(node) for tree, node in zip(trees, host[row:])]
