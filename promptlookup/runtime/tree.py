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

Cost: :func:`accept_path` is O(nodes); building children lists is O(nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


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
        d: list[int] = []
        for p in self.parents:
            d.append(d[p] + 1 if p >= 0 else 1)
        return d

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
    """Merge candidate continuations of the root into one prefix tree.

    A prefix shared by several candidates becomes one path, so it is verified once.
    Nodes are in depth-first order with the candidates in the given order: the first
    candidate's tokens are nodes ``0 .. len - 1`` (a plain chain when it is the only one),
    so when it is accepted no K/V needs moving. ``sources[c]`` labels candidate ``c``'s
    nodes (a node shared by several keeps the first label). Cost: O(total tokens).
    """
    tokens: list[int] = []
    parents: list[int] = []
    labels: list[str] = []
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for c, chain in enumerate(chains):
        node = -1
        for t in chain:
            nxt = child.get((node, t))
            if nxt is None:
                nxt = len(tokens)
                child[(node, t)] = nxt
                tokens.append(int(t))
                parents.append(node)
                labels.append(sources[c] if sources is not None else "")
            node = nxt
    return DraftTree(tokens, parents, None, labels if sources is not None else None)
