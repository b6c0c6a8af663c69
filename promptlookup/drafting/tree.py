"""The draft tree: candidate drafts merged into one token tree, and the rule that accepts a path of it.

A draft tree hangs from the sequence's last token, the *root* (not a node; its K/V are
computed first in a step). It is given as two parallel lists: ``tokens[j]`` is node
``j``'s token and ``parents[j]`` its parent node, ``-1`` for the root. The one invariant
every tree here keeps, checked by :func:`check_parents` (and only there):
``parents[j] < j``, so every node comes after its ancestors. A node's position is the
root's plus its depth, and it attends to the cached context, the root, its ancestors and
itself. A chain of drafts is the path-shaped tree ``parents = [-1, 0, 1, ...]``.

Merging (:func:`merge_candidates`) turns the drafts of :meth:`RequestDrafter.candidates`
(best first) into a prefix tree, so a shared prefix is verified once. Node order:
**candidate order** (order of first appearance). Candidate 0 is nodes
``0 .. len(c0) - 1``; every later candidate adds the part not shared with an earlier one
as consecutive nodes. So:

- every prefix ``tokens[:m], parents[:m]`` of the node list is itself a valid tree: a
  budget of ``m`` tree tokens is met by cutting the lists, and what is kept favours the
  better candidates;
- one candidate gives the chain ``parents == [-1, 0, 1, ...]``;
- each node is one distinct draft prefix: the node count equals the number of distinct
  non-empty prefixes of the candidates, and every candidate is a root-to-node path.

Acceptance: after the target has chosen a token at the root and at every node
(``choices[0]`` at the root, ``choices[1 + j]`` at node ``j``), :func:`accept_path` walks
from the root: while some *walkable* child of the current node carries the token the
target chose there (and that token is not ``end_id``), it moves to that child. The
accepted tokens are the path's tokens followed by the target's own choice at the path's
end, exactly what plain decoding would produce, since each choice is made with the very
prefix of the path. :func:`accept_path` is the rule's specification, on host lists; the
runner applies the same rule to a whole step's trees with tensor ops on the model's
device (:mod:`promptlookup.runtime.acceptance`), and the tests check the two agree.

Cost: merging is O(total candidate tokens) dictionary operations; :func:`check_parents`,
:func:`node_depths` and :func:`accept_path` are O(nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
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


def check_parents(parents: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``-1 <= parents[j] < j`` for every node ``j`` (the tree
    invariant, see the module docstring). O(len(parents))."""
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"parents[{j}] = {parent}: a parent must be -1 or an earlier node")


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (1 for a child of the root): a node's position is the root's
    position plus its depth. Checks ``parents`` (:func:`check_parents`); O(len(parents))."""
    check_parents(parents)
    depths: list[int] = []
    for parent in parents:
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
        check_parents(self.parents)
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
    (:func:`merge_candidates`: a shared prefix is one path, in
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
