"""merge_candidates builds the prefix tree of the candidate drafts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.drafting.tree import merge_candidates, node_depths


def _path(tokens: list[int], parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def test_a_chain_is_a_path():
    assert merge_candidates([[7, 8, 9]]) == ([7, 8, 9], [-1, 0, 1])
    assert merge_candidates([]) == ([], [])
    assert merge_candidates([[]]) == ([], [])


def test_shared_prefix_appears_once_and_order_is_candidate_order():
    tokens, parents = merge_candidates([[1, 2, 3], [1, 4], [1, 2, 5], [6]])
    assert tokens == [1, 2, 3, 4, 5, 6]
    assert parents == [-1, 0, 1, 0, 1, -1]
    assert node_depths(parents) == [1, 2, 3, 2, 3, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=6))
def test_every_candidate_is_a_path_and_nodes_are_the_distinct_prefixes(candidates):
    tokens, parents = merge_candidates(candidates)
    assert len(tokens) == len(parents)
    assert all(-1 <= p < i for i, p in enumerate(parents))
    paths = [tuple(_path(tokens, parents, i)) for i in range(len(tokens))]
    prefixes = {tuple(c[:j]) for c in candidates for j in range(1, len(c) + 1)}
    assert len(paths) == len(set(paths)) == len(prefixes)
    assert set(paths) == prefixes
    # every prefix of the node list is a tree holding the earliest candidates' prefixes
    first = candidates[0] if candidates else []
    assert paths[: len(first)] == [tuple(first[:j]) for j in range(1, len(first) + 1)]
    depths = node_depths(parents)
    assert depths == [len(p) for p in paths]


def test_node_depths_refuses_a_forward_parent():
    with pytest.raises(ValueError, match="parents\\[1\\]"):
        node_depths([-1, 1])
