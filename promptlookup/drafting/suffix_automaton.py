"""Online suffix automaton over token ids that finds the longest earlier match of the tail.

:class:`SuffixAutomaton` indexes a growing token stream. After every appended token it
knows the *longest suffix of the stream that occurred before* (capped at ``max_len``
tokens) and where the *most recent* earlier occurrence ended, so a drafter can propose the
tokens that followed that occurrence. :class:`Matcher` walks another automaton (the
shared text of finished requests) with a request's tokens and tracks the longest suffix
of the request found there.

Construction is the classic online algorithm (Blumer et al.; states are endpos classes,
``link`` is the suffix link, ``length`` the longest string of a state). To know the most
recent occurrence, each state ``v`` keeps ``recent[v] = max(endpos(v))``, maintained only
for states whose shortest string has at most ``max_len`` tokens (the only states ever
queried). A new position updates the suffix-link chain from the state holding the
``max_len``-token suffix up to the root; lengths strictly decrease along that chain, so it
has at most ``max_len + 1`` states, and in practice a handful (one per distinct occurrence
count of the stream's short suffixes). The state holding the ``max_len``-token suffix is
followed with one transition per token, never by walking the chain.

Costs per appended token: O(1) amortised for the automaton, plus O(d) for the ``recent``
refresh, where d <= max_len + 1 is the length of that short chain; independent of the
stream length. Memory: at most 2 * len(stream) states, each with a dict of transitions.
Token ids are arbitrary hashables; callers use negative ints as separators.

Candidates (``occurrences=True``): during that refresh, position ``i`` also records, for
each state ``v`` of the chain, the pair (shortest length of ``v``, the previous
``recent[v]``): for every suffix length ``l`` in ``v``'s range, the previous end of the
``l``-token suffix ending at ``i`` (-1: none). These per-position records, O(d) per token,
link every occurrence of a string to the one before it, so :meth:`SuffixAutomaton.candidates`
and :meth:`Matcher.candidates` walk the earlier occurrences of the matched suffix most
recent first, then those of shorter suffixes (one walk per distinct set of occurrences),
examining at most ``max_scan`` occurrences: O(max_scan * (d + max_candidates * k)) per
call, independent of the stream length. They read the automaton and never change it.

``native/suffix_automaton.c`` implements the same two classes in C for int64 token ids
(about 10x cheaper per token); :func:`make_drafter` uses it wherever it is built.
"""
from __future__ import annotations

from .base import MAX_CANDIDATES
from .tree import is_covered


class SuffixAutomaton:
    """Suffix automaton of ``tokens`` with longest-earlier-match tracking.

    Invariants after each :meth:`append` (``L = len(tokens)``):
    - ``match_len`` is the largest ``l <= max_len`` such that ``tokens[L-l:]`` also ends at
      some position ``e < L - 1``; ``match_end`` is the largest such ``e`` (``-1`` if
      ``match_len == 0``). The draft continuation is ``tokens[match_end + 1:]``, never empty.
    - ``recent[v] == max(endpos(v))`` (0-based end positions) for every state ``v`` whose
      shortest string has at most ``max_len`` tokens.
    """

    __slots__ = ("max_len", "tokens", "link", "length", "trans", "recent", "last", "window", "match_len", "match_end",
                 "occurrences", "occ_lo", "occ_prev", "occ_start")

    def __init__(self, max_len: int, occurrences: bool = False) -> None:
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        self.max_len = max_len
        self.tokens: list = []
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.trans: list[dict] = [{}]
        self.recent: list[int] = [-1]
        self.last = 0
        self.window = 0  # state holding the suffix of length min(max_len, L)
        self.match_len = 0
        self.match_end = -1
        # occurrence records (see the module docstring): position i's are the indices
        # occ_start[i] .. occ_start[i + 1] - 1 of occ_lo / occ_prev, longest range first
        self.occurrences = bool(occurrences)
        self.occ_lo: list[int] = []
        self.occ_prev: list[int] = []
        self.occ_start: list[int] = [0]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_states(self) -> int:
        return len(self.length)

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def append(self, c) -> None:
        link = self.link
        length = self.length
        trans = self.trans
        recent = self.recent
        max_len = self.max_len
        i = len(self.tokens)
        self.tokens.append(c)

        cur = len(length)
        length.append(length[self.last] + 1)
        link.append(0)
        trans.append({})
        recent.append(i)
        p = self.last
        while p != -1 and c not in trans[p]:
            trans[p][c] = cur
            p = link[p]
        if p != -1:
            q = trans[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                trans.append(dict(trans[q]))
                recent.append(recent[q])  # endpos(clone) = endpos(q) (+ i, added below)
                while p != -1 and trans[p].get(c) == q:
                    trans[p][c] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self.last = cur

        # state holding the min(max_len, L)-token suffix, by one transition from the old one
        if i + 1 <= max_len:
            w = cur
        else:
            w = self.window
            while length[link[w]] >= max_len:  # the old window state may have been split
                w = link[w]
            w = trans[w][c]
            if length[link[w]] >= max_len:
                w = link[w]
        self.window = w

        # longest earlier match of the tail, and its most recent occurrence (before i)
        repeated = length[link[cur]]
        if repeated == 0:
            self.match_len, self.match_end = 0, -1
        elif repeated < max_len:
            self.match_len, self.match_end = repeated, recent[link[cur]]
        else:
            self.match_len, self.match_end = max_len, recent[w]

        # position i now ends every string on the chain from the window state to the root
        v = w
        if self.occurrences:
            occ_lo, occ_prev = self.occ_lo, self.occ_prev
            while v > 0:
                occ_lo.append(length[link[v]] + 1)
                occ_prev.append(recent[v] if recent[v] != i else -1)  # i: a new state, no earlier end
                recent[v] = i
                v = link[v]
            self.occ_start.append(len(occ_lo))
        while v > 0:
            recent[v] = i
            v = link[v]

    def continuation(self, k: int) -> list:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the match."""
        if self.match_len == 0:
            return []
        start = self.match_end + 1
        return self.tokens[start:start + k]

    def previous_end(self, end: int, length: int) -> int:
        """The end before ``end`` of the ``length``-token string ending at ``end`` (-1: none);
        needs ``occurrences``. O(records at ``end``)."""
        occ_lo = self.occ_lo
        for j in range(self.occ_start[end], self.occ_start[end + 1]):
            if occ_lo[j] <= length:
                return self.occ_prev[j]
        return -1

    def candidates(self, k: int, max_candidates: int, max_scan: int) -> list[tuple[int, list]]:
        """``(match length, continuation)`` pairs: what followed earlier occurrences of the tail.

        For each suffix of the stream, longest first (``match_len`` down to 1), that has a
        set of earlier ends different from the longer suffix's, those ends most recent
        first; each end ``e`` gives ``tokens[e + 1:e + 1 + k]``, kept unless equal to or a
        prefix of one kept before. Stops at ``max_candidates`` kept or ``max_scan`` ends
        examined (repeats included). The first is :meth:`continuation`'s. Needs
        ``occurrences=True``. Cost: see the module docstring.
        """
        if not self.occurrences:
            raise ValueError("candidates() needs a SuffixAutomaton built with occurrences=True")
        end = len(self.tokens) - 1
        if self.match_len == 0 or k < 1:
            return []
        groups = []
        hi = min(self.max_len, end + 1)
        for j in range(self.occ_start[end], self.occ_start[end + 1]):
            if self.occ_prev[j] >= 0:
                groups.append((hi, self.occ_prev[j]))
            hi = self.occ_lo[j] - 1
        return _walk(self, self.tokens, groups, k, max_candidates, max_scan, False)


class Matcher:
    """Longest suffix of a growing query stream that occurs in an automaton's text.

    The automaton may grow between calls (other requests finishing); the match found for
    each query token is against the text as it was when that token arrived. Cost per query
    token: O(1) amortised.
    """

    __slots__ = ("sam", "state", "matched")

    def __init__(self, sam: SuffixAutomaton) -> None:
        self.sam = sam
        self.state = 0
        self.matched = 0

    def _settle(self) -> int:
        """Re-point ``state`` at the state holding the matched string (states may split)."""
        sam = self.sam
        v = self.state
        while v > 0 and sam.length[sam.link[v]] >= self.matched:
            v = sam.link[v]
        self.state = v
        return v

    def feed(self, tokens) -> None:
        sam = self.sam
        trans, link, length = sam.trans, sam.link, sam.length
        cap = sam.max_len
        v = self._settle()
        matched = self.matched
        for c in tokens:
            while v > 0 and c not in trans[v]:
                v = link[v]
                matched = length[v]
            nxt = trans[v].get(c)
            if nxt is None:
                v, matched = 0, 0
                continue
            v = nxt
            matched += 1
            if matched > cap:
                matched = cap
                if length[link[v]] >= cap:
                    v = link[v]
        self.state, self.matched = v, matched

    def continuation(self, k: int) -> tuple[int, list]:
        """(match length, up to ``k`` tokens after the most recent occurrence of the match),
        cut before the first negative token (the separators between indexed texts)."""
        if self.matched == 0:
            return 0, []
        sam = self.sam
        v = self._settle()
        start = sam.recent[v] + 1
        out = sam.tokens[start:start + k]
        if out and min(out) < 0:
            out = out[: next(j for j, t in enumerate(out) if t < 0)]
        return self.matched, out

    def candidates(self, k: int, max_candidates: int, max_scan: int) -> list[tuple[int, list]]:
        """:meth:`SuffixAutomaton.candidates` for the matched suffix of the query in the
        automaton's text (the automaton needs ``occurrences=True``): the ends of the
        matched string, most recent first, then of its shorter suffixes; continuations are
        cut before the first negative token."""
        sam = self.sam
        if not sam.occurrences:
            raise ValueError("candidates() needs a SuffixAutomaton built with occurrences=True")
        if self.matched == 0 or k < 1:
            return []
        groups = []
        v = self._settle()
        hi = self.matched
        while v > 0:
            groups.append((hi, sam.recent[v]))
            hi = sam.length[sam.link[v]]
            v = sam.link[v]
        return _walk(sam, sam.tokens, groups, k, max_candidates, max_scan, True)


def _walk(sam: SuffixAutomaton, tokens: list, groups: list[tuple[int, int]], k: int, max_candidates: int,
          max_scan: int, cut_negative: bool) -> list[tuple[int, list]]:
    """Follow each group's occurrences (length, most recent end) backwards through the
    occurrence records; keep the continuations that add a tree node."""
    if max_candidates > MAX_CANDIDATES:
        raise ValueError(f"max_candidates must be <= {MAX_CANDIDATES}, got {max_candidates}")
    out: list[tuple[int, list]] = []
    chosen: list[list] = []
    steps = 0
    for length, end in groups:
        while end >= 0:
            if steps >= max_scan or len(out) >= max_candidates:
                return out
            steps += 1
            cont = tokens[end + 1:end + 1 + k]
            if cut_negative and cont and min(cont) < 0:
                cont = cont[: next(j for j, t in enumerate(cont) if t < 0)]
            if not is_covered(cont, chosen):
                chosen.append(cont)
                out.append((length, cont))
            end = sam.previous_end(end, length)
    return out
