"""Merge candidate drafts into one token tree, so a shared prefix is verified once.

:func:`merge_candidates` turns the drafts of :meth:`RequestDrafter.candidates` (best first)
into a prefix tree given as two parallel lists: ``tokens[i]`` is node ``i``'s token and
``parents[i]`` its parent node, ``-1`` for the root (the sequence's last token, which is
not a node).

Node order: **candidate order** (order of first appearance). Candidate 0 is nodes
``0 .. len(c0) - 1``; every later candidate adds the part not shared with an earlier one
as consecutive nodes. So:

- ``parents[i] < i`` for every node, and every prefix ``tokens[:m], parents[:m]`` of the
  node list is itself a valid tree: a budget of ``m`` tree tokens is met by cutting the
  lists, and what is kept favours the better candidates;
- one candidate gives the chain ``parents == [-1, 0, 1, ...]``;
- each node is one distinct draft prefix: the node count equals the number of distinct
  non-empty prefixes of the candidates, and every candidate is a root-to-node path.

Cost: O(total candidate tokens) dictionary operations.
"""
from __future__ import annotations

from typing import Sequence


def merge_candidates(candidates: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of the prefix tree of ``candidates`` (see the module docstring).

    Empty candidates and repeated prefixes add no node.
    """
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for candidate in candidates:
        node = -1
        for token in candidate:
            token = int(token)
            child = children.get((node, token))
            if child is None:
                child = len(tokens)
                tokens.append(token)
                parents.append(node)
                children[(node, token)] = child
            node = child
    return tokens, parents


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for a child of the root): a node's position is the root's
    position plus its depth. Needs ``parents[i] < i``; O(len(parents))."""
    depths: list[int] = []
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"parents[{i}] = {parent}: a parent must be -1 or an earlier node")
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def is_covered(draft: Sequence[int], chosen: Sequence[Sequence[int]]) -> bool:
    """Whether ``draft`` is empty, equal to or a prefix of a draft in ``chosen``, i.e. adds
    no node to their tree. O(len(chosen) * len(draft))."""
    n = len(draft)
    if n == 0:
        return True
    draft = list(draft)
    for other in chosen:
        if len(other) >= n and list(other[:n]) == draft:
            return True
    return False


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share. O(that length)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
