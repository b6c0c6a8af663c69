"""One pattern's matches ``S`` in TensorRT-LLM V2's n-gram pool, and the rule that inserts into it.

``S`` (:data:`Matches`) is a bare :data:`Match` tuple while the pattern has one match (the
common case, kept small) and a :class:`MatchSet` from the second distinct match on. The
functions below are the only places that tell the two apart:

- :func:`insert` is TensorRT-LLM's insertion rule, written once (see :mod:`.pool` for the
  statement and :mod:`.pool_spec` for the specification);
- :func:`first` / :func:`preferred` / :func:`in_order` read ``S[0]``, the draft's match,
  and the first entries in draft order.

Cost: :func:`insert` is O(1) on a bare match and O(truncated matches of the pattern) on a
:class:`MatchSet` (full matches are never walked); the readers are O(1), except
:func:`in_order`, O(count + truncated matches).
"""
from __future__ import annotations

Match = tuple[int, ...]  # a continuation (at most k tokens)


class MatchSet:
    """The ordered set ``S`` of continuations TensorRT-LLM keeps for one pattern (2+ entries).

    A pattern with a single match is stored as the bare tuple (the common case); it becomes
    a :class:`MatchSet` when a second distinct match has to be kept (:func:`insert`).

    Representation (``S`` order = insertion order):
    - full matches (length k) in ``full_set``; the first and last with their sequence numbers.
      Full matches are never removed, so only the endpoints matter.
    - truncated matches in ``short`` (insertion-ordered dict), each with its sequence number
      and the number of full matches inserted before it; two consecutive truncated entries
      are adjacent in ``S`` iff no full match lies between them (equal counts).
    """

    __slots__ = ("k", "full_set", "full_first", "full_first_seq", "full_last", "full_last_seq", "short", "seq",
                 "keep", "oldest", "full_keep")

    def __init__(self, k: int, first: Match, second: Match, keep: int = 1, oldest: bool = True) -> None:
        self.k = k
        # candidates: with keep > 1, the first (oldest) or last keep full matches, (seq, m)
        self.keep = keep
        self.oldest = oldest
        self.full_keep: list[tuple[int, Match]] = []
        self.full_set: set[Match] = set()
        self.full_first: Match | None = None
        self.full_first_seq = -1
        self.full_last: Match | None = None
        self.full_last_seq = -1
        self.short: dict[Match, tuple[int, int]] = {}
        self.seq = 0
        self._append(first)
        self._append(second)

    def _append(self, m: Match) -> None:
        """Put ``m`` at the end of ``S`` (the caller has removed what TensorRT-LLM removes)."""
        seq = self.seq
        self.seq = seq + 1
        if len(m) == self.k:
            if self.full_first is None:
                self.full_first, self.full_first_seq = m, seq
            self.full_last, self.full_last_seq = m, seq
            self.full_set.add(m)
            if self.keep > 1:
                self._keep_full(seq, m)
        else:
            self.short[m] = (seq, len(self.full_set))

    def _keep_full(self, seq: int, m: Match) -> None:
        full_keep = self.full_keep
        if not self.oldest:
            full_keep.append((seq, m))
            if len(full_keep) > self.keep:
                del full_keep[0]
        elif len(full_keep) < self.keep:
            full_keep.append((seq, m))

    def ordered(self, count: int) -> list[Match]:
        """The first ``count`` entries of ``S`` (``S[0], S[1], ...``) with ``oldest``, else the
        last ones (``S[-1], S[-2], ...``); ``count <= keep`` (only those full matches are kept)."""
        if count <= 1:
            return [self.first() if self.oldest else self.last()]
        if self.oldest:
            shorts = [(seq, m) for m, (seq, _) in self.short.items()]
            fulls = self.full_keep
            before = int.__lt__
        else:
            shorts = [(seq, m) for m, (seq, _) in reversed(self.short.items())]
            fulls = self.full_keep[::-1]
            before = int.__gt__
        out: list[Match] = []
        i = j = 0
        while len(out) < count and (i < len(shorts) or j < len(fulls)):
            if j == len(fulls) or (i < len(shorts) and before(shorts[i][0], fulls[j][0])):
                out.append(shorts[i][1])
                i += 1
            else:
                out.append(fulls[j][1])
                j += 1
        return out

    def prefix_is_full(self) -> bool:
        """With ``oldest``: ``S[0:keep]`` are all full matches, so they can never change."""
        full_keep = self.full_keep
        if len(full_keep) < self.keep:
            return False
        short = self.short
        return not short or short[next(iter(short))][0] > full_keep[-1][0]

    def first(self) -> Match:
        short = self.short
        if short:
            m = next(iter(short))
            if self.full_first is None or short[m][0] < self.full_first_seq:
                return m
        return self.full_first  # type: ignore[return-value]

    def last(self) -> Match:
        short = self.short
        if short:
            m = next(reversed(short))
            if self.full_last is None or short[m][0] > self.full_last_seq:
                return m
        return self.full_last  # type: ignore[return-value]

    def add(self, m: Match) -> None:
        """``S.add(m)`` after removing shorter entries the way TensorRT-LLM's loop does."""
        short = self.short
        if m in short or m in self.full_set:
            return
        if short:
            b = len(m)
            if len(short) == 1:
                e = next(iter(short))
                if len(e) < b:
                    short.clear()
            else:
                dead = []
                prev_removed = False
                prev_nfull = -1
                for e, (_, nfull) in short.items():
                    if prev_removed and nfull == prev_nfull:
                        prev_removed = False  # directly after a removed entry: skipped by the walk
                    elif len(e) < b:
                        dead.append(e)
                        prev_removed = True
                    else:
                        prev_removed = False
                    prev_nfull = nfull
                for e in dead:
                    del short[e]
        self._append(m)

    def __len__(self) -> int:
        return len(self.full_set) + len(self.short)


Matches = Match | MatchSet  # S: one bare match, or a MatchSet of two or more


def insert(matches: Matches | None, m: Match, k: int, keep_all: bool, keep: int = 1, oldest: bool = True) -> Matches:
    """``S`` after one TensorRT-LLM insertion of match ``m`` (``matches``: ``S`` before, ``None``:
    the pattern is new). A new pattern gets ``S = [m]``; a longer match replaces a single
    shorter one (it would remove it) and, without ``keep_all``, replaces ``S`` whenever it is
    longer than ``S[0]``; otherwise shorter truncated matches are removed and ``m`` appended
    (:meth:`MatchSet.add`). ``keep``/``oldest``: how a new :class:`MatchSet` keeps full
    matches for candidates. May update ``matches`` in place; returns the new ``S``."""
    if matches is None:
        return m
    if isinstance(matches, tuple):  # S = [matches]
        if matches == m:
            return matches
        if len(matches) < len(m):  # replaced (keep_all=False) or removed as shorter
            return m
        return MatchSet(k, matches, m, keep, oldest)
    if not keep_all and len(m) > len(matches.first()):
        return m
    matches.add(m)
    return matches


def first(matches: Matches) -> Match:
    """``S[0]``."""
    return matches if isinstance(matches, tuple) else matches.first()


def preferred(matches: Matches, oldest: bool) -> Match:
    """The match a draft is cut from: ``S[0]`` with ``oldest`` (``is_use_oldest``), else ``S[-1]``."""
    if isinstance(matches, tuple):
        return matches
    return matches.first() if oldest else matches.last()


def in_order(matches: Matches, count: int) -> list[Match]:
    """Up to ``count`` entries of ``S`` in draft order (see :meth:`MatchSet.ordered`)."""
    return [matches] if isinstance(matches, tuple) else matches.ordered(count)
