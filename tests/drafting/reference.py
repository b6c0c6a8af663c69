"""Plain, slow reference implementations of the longest-match drafters.

The pool mode's references are the package's own specification,
:mod:`promptlookup.drafting.pool_spec`.
"""
from __future__ import annotations

from promptlookup.drafting.pool_spec import NGramPoolManagerSpec


class TrtPoolReference(NGramPoolManagerSpec):
    """The V2 pool specification plus the candidates it implies (for ``candidates()`` tests)."""

    def candidates(self, prefix: list[int], request_id: int, max_sequence_length: int, keep: int,
                   max_candidates: int) -> list[list[int]]:
        """After get_draft_tokens(prefix, ...): for sizes n..1, each hit pattern's matches in
        draft priority (S[0], S[1], ... or S[-1], S[-2], ...), at most min(keep,
        max_candidates) per pattern, cut to the room left; one equal to or a prefix of an
        earlier candidate is skipped; at most max_candidates."""
        length = len(prefix)
        room = max_sequence_length - 1 - length
        table = self.pools.get(None if self.public else request_id, {})
        out: list[list[int]] = []
        if room <= 0:
            return out
        for size in range(min(self.n, length - 1), 0, -1):
            matches = table.get(tuple(prefix[length - size:]))
            if not matches:
                continue
            ordered = matches if self.oldest else matches[::-1]
            for match in ordered[:min(keep, max_candidates)]:
                draft = list(match)[:room]
                if not covered(draft, out):
                    out.append(draft)
                if len(out) == max_candidates:
                    return out
        return out


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


def covered(draft: list[int], chosen: list[list[int]]) -> bool:
    """``draft`` is empty, or equal to or a prefix of one of ``chosen``."""
    return not draft or any(other[:len(draft)] == draft for other in chosen)


def earlier_occurrence_candidates(text: list[int], max_len: int, budget: int, max_candidates: int,
                                  max_scan: int) -> list[tuple[int, list[int]]]:
    """Longest-mode candidates by brute force: (match length, continuation) pairs.

    For l = min(max_len, len(text) - 1) .. 1, the earlier ends e < len(text) - 1 of the
    length-l suffix, most recent first; a length whose set of ends equals that of l + 1
    (or is empty) is skipped. Walking every set from its most recent end, each end
    examined counts one step (at most max_scan in all); its continuation
    text[e + 1:e + 1 + budget] is kept unless covered by an earlier one.
    """
    n = len(text)
    return _occurrence_walk(text, [
        (l, [e for e in range(n - 2, l - 2, -1) if text[e - l + 1:e + 1] == text[n - l:]])
        for l in range(min(max_len, n - 1), 0, -1)
    ], budget, max_candidates, max_scan)


def corpus_occurrence_candidates(corpus: list[int], query: list[int], matched: int, budget: int,
                                 max_candidates: int, max_scan: int) -> list[tuple[int, list[int]]]:
    """The same walk over the ends of the query's length-l suffixes (l = matched .. 1) in a
    corpus; continuations are cut before the first negative token (a separator)."""
    groups = [
        (l, [e for e in range(len(corpus) - 1, l - 2, -1) if corpus[e - l + 1:e + 1] == query[len(query) - l:]])
        for l in range(matched, 0, -1)
    ]
    return _occurrence_walk(corpus, groups, budget, max_candidates, max_scan, cut_negative=True)


def _occurrence_walk(text, groups, budget, max_candidates, max_scan, cut_negative=False):
    out: list[tuple[int, list[int]]] = []
    steps = 0
    previous = None
    for length, ends in groups:
        if not ends or ends == previous:
            previous = ends
            continue
        previous = ends
        for e in ends:
            if steps == max_scan or len(out) == max_candidates:
                return out
            steps += 1
            cont = text[e + 1:e + 1 + budget]
            if cut_negative:
                cont = cont[:next((j for j, t in enumerate(cont) if t < 0), len(cont))]
            if not covered(cont, [c for _, c in out]):
                out.append((length, cont))
    return out
