"""Draft token trees: what one verification step checks for one sequence.

A :class:`DraftTree` hangs from the sequence's last token, the *root* (the token whose
K/V the step computes first). Node ``j`` holds ``tokens[j]`` and follows ``parents[j]``
(``-1``: the root); ``parents[j] < j``, so every node comes after its ancestors. A node's
position is the root's plus its depth, and it attends to the cached context, the root, its
ancestors and itself. A chain of drafts is the path-shaped tree ``parents = [-1, 0, 1, ...]``.

After the target has chosen a token at the root and at every node (``choices[0]`` at the
root, ``choices[1 + j]`` at node ``j``), :func:`accept_path` walks from the root: while
some *walkable* child of the current node carries the token the target chose there (and
that token is not ``end_id``), it moves to that child. The accepted tokens are the path's
tokens followed by the target's own choice at the path's end, exactly what plain
decoding would produce, since each choice is made with the very prefix of the path.

:func:`accept_path` is the rule's specification, on host lists. The runner applies the
same rule to a whole step's trees with tensor ops on the model's device
(:mod:`.acceptance`), so that a step reads back only its result; the tests check the two
agree on random trees.

Cost: :func:`accept_path` is O(nodes); building children lists is O(nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..drafting.tree import merge_candidates, node_depths


@dataclass
class DraftTree:
    """Draft nodes branching from a sequence's last token (see the module docstring).

    ``walkable[j]`` (default: every node) says whether acceptance may pass through node
    ``j``; Lookahead's window nodes are computed (their outputs feed the window) but never
    accepted. ``sources[j]`` optionally labels where node ``j`` came from, for statistics.
    """

    tokens: list[int]
    parents: list[int]
    walkable: list[bool] | None = None
    sources: list[str] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for j, p in enumerate(self.parents):
            if not -1 <= p < j:
                raise ValueError(f"node {j} has parent {p}; a parent must precede its child")
        if self.walkable is not None and len(self.walkable) != len(self.tokens):
            raise ValueError("walkable must have one flag per node")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == j - 1 for j, p in enumerate(self.parents))

    @property
    def num_walkable(self) -> int:
        return len(self.tokens) if self.walkable is None else sum(self.walkable)

    def depths(self) -> list[int]:
        """Depth of each node (1 for a child of the root)."""
        return node_depths(self.parents)

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root's child down to ``node`` (empty for the root, ``-1``)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def accept_path(tree: DraftTree, choices: Sequence[int], end_id: int) -> tuple[list[int], list[int]]:
    """The accepted path (node indices, root's child first) and the tokens it yields
    (the path's tokens, then the target's own choice at its end); see the module docstring."""
    if len(choices) != len(tree) + 1:
        raise ValueError(f"{len(choices)} choices for a tree of {len(tree)} nodes (need one more)")
    children: dict[int, list[int]] = {}
    for j, p in enumerate(tree.parents):
        if tree.walkable is None or tree.walkable[j]:
            children.setdefault(p, []).append(j)
    path: list[int] = []
    node = -1
    while True:
        want = choices[node + 1]
        if want == end_id:
            break
        nxt = next((c for c in children.get(node, ()) if tree.tokens[c] == want), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path, [tree.tokens[j] for j in path] + [choices[node + 1]]


def merge_chains(chains: Sequence[Sequence[int]], sources: Sequence[str] | None = None) -> DraftTree:
    """Merge candidate continuations of the root into one prefix tree
    (:func:`~promptlookup.drafting.tree.merge_candidates`: a shared prefix is one path, in
    candidate order, so the first candidate is nodes ``0 .. len - 1`` and needs no K/V move
    when accepted). ``sources[c]`` labels the nodes candidate ``c`` adds."""
    tokens, parents = merge_candidates(chains)
    labels = None
    if sources is not None:
        labels = [""] * len(tokens)
        child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
        for chain, label in zip(chains, sources):
            node = -1
            for t in chain:
                node = child[(node, int(t))]
                labels[node] = labels[node] or label
    return DraftTree(tokens, parents, None, labels)
