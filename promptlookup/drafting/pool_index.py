"""The pattern index of TensorRT-LLM V2's n-gram pool: pattern -> its matches ``S``, per size.

:class:`NGramPool` holds one dict per pattern size; a pattern's entry is a
:class:`PatternRecord` (its ``S`` and the insertions deferred into it), or, for a pattern
settled from the start, the bare match itself (see :class:`NGramPool`). Requests walk the
pool through :class:`~.pool.PoolCursor`; the rules are those of :mod:`.pool`.

Cost: :meth:`NGramPool.lookup` is O(n) dict lookups plus the deferred insertions it
applies; applying an insertion costs what :func:`~.match_set.insert` costs.

Size limit (``max_patterns``, least recently used first)
---------------------------------------------------------
A pool that lives for the whole process (the public pool) would grow with every request;
``max_patterns`` bounds it. Invariant: after every call, the pool holds at most
``max_patterns`` patterns (all sizes together). The patterns are kept in one
:class:`~collections.OrderedDict` in order of last use, where a pattern is *used* when

- a cursor's text gains a new occurrence of it (a new window position, see
  :class:`~.pool.PoolCursor`; whether or not the pattern already existed or is settled), or
- it gives a draft (:meth:`NGramPool.lookup`'s hit; :meth:`~.pool.PoolCursor.candidates`,
  a pure read, uses nothing).

Re-offering a longer continuation at a position still truncated since the previous call
is not a use (that position's occurrence was counted when it was new). When a pattern is
created in a full pool, the least recently used one is evicted first: its matches go, and
a cursor that still remembers one of its truncated positions drops it (the record is marked
dead: ``pending = None``). A pattern seen again later starts afresh, as a new pattern
would. ``native/pool.c`` applies the same order and the same moments, so both give the same
drafts. Eviction changes drafts (it forgets matches), never the verified output. Cost: O(1)
per use (``move_to_end``) and per eviction (``popitem``). ``max_patterns=None``: no limit
and no bookkeeping.

One dict serves every size: a size-1 pattern is a bare int and a size-s pattern an s-tuple,
so keys of different sizes never collide, and ``maps[s]`` is the same dict for every s.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Sequence

from .base import MAX_CANDIDATES, check_max_patterns
from .match_set import Match, Matches, first, insert, preferred

Insertion = tuple[Sequence[int], int, int]  # (text, q, r): the match tuple(text[q:r]), deferred
Key = int | tuple[int, ...]  # a pattern: a bare token for size 1, else a tuple of tokens


class PatternRecord:
    """One pattern's ``S`` (:data:`~.match_set.Matches`) and its deferred insertions.

    ``pending`` lists insertions not yet applied to ``matches``, in order, as
    :data:`Insertion` triples (texts only grow, so the slice is what TensorRT-LLM inserted at
    that moment). ``pending is None`` marks a *settled* record: no later insertion can
    change any draft from it (:meth:`NGramPool.is_settled`), so none is recorded; an
    evicted record is marked the same way (it is in no map, so no draft can come from it).
    """

    __slots__ = ("matches", "pending")

    def __init__(self, matches: Matches, pending: list[Insertion] | None) -> None:
        self.matches = matches
        self.pending = pending


Entry = Match | PatternRecord  # a pool entry: a record, or the bare match of a pattern settled from the start


class NGramPool:
    """Pattern -> matches maps for sizes 1..n (one dict per size; size-1 keys are bare ints).

    Each pattern's entry is a :class:`PatternRecord`:

    - its ``S`` is a bare tuple (a single match) or a :class:`~.match_set.MatchSet`;
    - its ``pending`` insertions are applied in their original order when the pattern is
      looked up, or when more than :data:`PENDING_LIMIT` wait. Applying costs what eager
      insertion costs; deferring only keeps the work off the per-step path for patterns
      that are not looked up.
    - ``pending is None`` marks a *settled* record: with ``is_use_oldest`` the answer is
      ``S[0]``, and once ``S[0]`` is a full-length match nothing can remove or displace it,
      so later insertions cannot change any draft and are not recorded at all.

    A pattern whose very first match is already full (with ``is_use_oldest``: most patterns
    of a long prompt) is settled from the start and stored as the bare match tuple instead
    of a record, which keeps the number of objects the garbage collector walks small
    (:data:`Entry`).

    Candidates (``max_candidates = c > 1``, see :meth:`~.pool.PoolCursor.candidates`): every
    :class:`~.match_set.MatchSet` also keeps its first ``c`` (``is_use_oldest``) or last
    ``c`` full matches in order, so ``S[0:c]`` / ``S[-c:]`` are known; a record settles only
    once ``S[0:c]`` are all full, and none is stored bare. With ``c == 1`` nothing changes.
    Drafts never depend on ``c``: only what :meth:`~.pool.PoolCursor.candidates` can see does.
    """

    PENDING_LIMIT = 32

    def __init__(self, k: int, n: int, is_keep_all: bool, is_use_oldest: bool, max_candidates: int = 1,
                 max_patterns: int | None = None) -> None:
        if not 1 <= max_candidates <= MAX_CANDIDATES:
            raise ValueError(f"max_candidates must be in 1..{MAX_CANDIDATES}, got {max_candidates}")
        check_max_patterns(max_patterns)
        self.k = k
        self.n = n
        self.is_keep_all = is_keep_all
        self.is_use_oldest = is_use_oldest
        # matches kept per pattern for candidates(): S[0:c] (oldest) or S[-c:]. With c > 1 a
        # pattern settles only once S[0:c] are all full, and is never stored bare.
        self.max_candidates = max_candidates
        self.settle_single = is_use_oldest and max_candidates == 1
        self.max_patterns = max_patterns  # None: unbounded (no LRU bookkeeping)
        self.evictions = 0  # patterns evicted so far
        # one dict for every size (keys of different sizes never collide), in LRU order
        self.table: OrderedDict[Key, Entry] = OrderedDict()
        self.maps: list[OrderedDict[Key, Entry]] = [self.table] * (n + 1)  # maps[s] for s in 1..n

    def num_patterns(self) -> int:
        return len(self.table)

    def nbytes(self) -> int:
        """An estimate of the bytes the pool holds: the dict plus, per pattern, its key and
        one match tuple (or record). An estimate: matches shared between patterns, extra
        matches of a pattern and deferred insertions are not walked (that would cost
        O(patterns) per call). O(1)."""
        per = 2 * 56 + 8 * (self.k + self.n) // 2 + 64  # key and match tuples, the entry's slot and links
        return sys.getsizeof(self.table) + per * len(self.table)

    def touch(self, key: Key) -> None:
        """``key`` (present) was used: it becomes the most recently used pattern. O(1)."""
        if self.max_patterns is not None:
            self.table.move_to_end(key)

    def added(self) -> None:
        """A pattern was just created (it is the most recent): evict the least recently used
        ones while the pool holds more than ``max_patterns``. O(1) per eviction."""
        limit = self.max_patterns
        if limit is None:
            return
        table = self.table
        while len(table) > limit:
            _, entry = table.popitem(last=False)
            if isinstance(entry, PatternRecord):
                entry.pending = None  # dead: cursors that remember it drop it
            self.evictions += 1

    def apply(self, rec: PatternRecord, m: Match) -> None:
        """Insert ``m`` into ``rec``'s ``S`` now (nothing may be pending); settle it if it can."""
        rec.matches = matches = insert(rec.matches, m, self.k, self.is_keep_all, self.max_candidates,
                                       self.is_use_oldest)
        if self.is_settled(matches):
            rec.pending = None

    def offer(self, rec: PatternRecord, text: Sequence[int], q: int, r: int) -> None:
        """TensorRT-LLM's insertion of ``tuple(text[q:r])`` into an unsettled ``rec``: applied at
        once when nothing is deferred and ``S`` is a single match (cheap), else deferred."""
        pending = rec.pending
        assert pending is not None, "a settled record takes no insertions"
        if not pending and isinstance(rec.matches, tuple):
            self.apply(rec, tuple(text[q:r]))
        else:
            pending.append((text, q, r))
            if len(pending) > self.PENDING_LIMIT:
                self.materialize(rec)

    def materialize(self, rec: PatternRecord) -> Matches:
        """Apply ``rec``'s pending insertions in order; return its ``S``."""
        pending = rec.pending
        if pending:
            matches = rec.matches
            k, keep_all, keep, oldest = self.k, self.is_keep_all, self.max_candidates, self.is_use_oldest
            for text, q, r in pending:
                matches = insert(matches, tuple(text[q:r]), k, keep_all, keep, oldest)
            rec.matches = matches
            rec.pending = None if self.is_settled(matches) else []
        return rec.matches

    def matches(self, entry: Entry) -> Matches:
        """The ``S`` of a pool entry, its deferred insertions applied."""
        return entry if isinstance(entry, tuple) else self.materialize(entry)

    def is_settled(self, matches: Matches) -> bool:
        """With ``is_use_oldest``: the first ``max_candidates`` entries of ``S`` are full."""
        if not self.is_use_oldest:
            return False
        if self.max_candidates == 1:
            return len(first(matches)) == self.k
        return not isinstance(matches, tuple) and matches.prefix_is_full()

    def lookup(self, text: Sequence[int], max_size: int) -> tuple[Match, int]:
        """First hit for sizes ``max_size..1`` on the tail of ``text``: (match, size) or ((), 0)."""
        table = self.table
        for s in range(max_size, 0, -1):
            key = text[-1] if s == 1 else tuple(text[-s:])
            entry = table.get(key)
            if entry is not None:
                self.touch(key)
                return preferred(self.matches(entry), self.is_use_oldest), s
        return (), 0
