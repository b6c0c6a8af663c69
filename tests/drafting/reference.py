"""Plain, slow reference implementations of the longest-match drafters.

The pool mode's references are the package's own specification,
:mod:`promptlookup.drafting.pool_spec`.
"""
from __future__ import annotations


def longest_earlier_match(text: list[int], max_len: int) -> tuple[int, int]:
    """(l, e): the longest l <= max_len with text[-l:] also ending at e < len(text) - 1
    (largest such e); (0, -1) if none."""
    n = len(text)
    for length in range(min(max_len, n - 1), 0, -1):
        suffix = text[n - length:]
        for end in range(n - 2, length - 2, -1):
            if text[end - length + 1:end + 1] == suffix:
                return length, end
    return 0, -1


def longest_match_in(corpus: list[int], query: list[int], max_len: int) -> tuple[int, int]:
    """(l, e): the longest suffix of ``query`` (<= max_len) occurring in ``corpus``, most
    recent end e; (0, -1) if none."""
    for length in range(min(max_len, len(query)), 0, -1):
        suffix = query[len(query) - length:]
        for end in range(len(corpus) - 1, length - 2, -1):
            if corpus[end - length + 1:end + 1] == suffix:
                return length, end
    return 0, -1
