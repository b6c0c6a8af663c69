"""TensorRT-LLM V1's n-gram pool (``PLDPool``), with the same interface as :mod:`.pool`.

The rules are stated in :mod:`.pool_spec` (:class:`~.pool_spec.PLDPoolSpec`); this module
applies them with cheaper data structures and the drafter's conventions:

- a pattern's matches are a bare tuple (one match, the common case) or an insertion-ordered
  ``dict`` used as an ordered set (two or more). Under V1's rule a pattern holds two or
  more matches only once its oldest match is complete (k tokens), and from then on the
  oldest never changes and nothing is removed, so appending is all that ever happens to it;
- :meth:`PLDCursor.propose` returns ``(draft, matched n-gram size)`` like
  :meth:`.pool.PoolCursor.propose`, with an empty draft and size 0 where V1 sends
  ``[end_id]`` (the drafter adds ``[end_id]`` after its other sources, see ``drafter.py``),
  and cuts the draft to ``max_seq_len - 1 - len(text)`` tokens (the drafter's invariant;
  V1 leaves that cut to the engine, so the verified tokens are the same).

Unlike V2, V1 rescans its whole window (the last k + n - 1 tokens plus the new ones) at
every call, because with ``is_keep_all=False`` re-inserting an old match replaces the newer
one. Cost per call: O(n * (k + n + new tokens)) insertions of tuples of at most k tokens,
independent of the text length (the first call indexes the prompt: O(n * len(prompt))).

Size limit: with ``max_patterns`` the pool holds at most that many patterns after every
call, evicting the least recently used first; a pattern is used when the text gains a new
occurrence of it (a position new since the cursor's previous call; re-scanned positions
are not uses, as in :mod:`.pool_index`), when it is created (a re-scanned position may
re-create an evicted one) and when it gives a draft. O(1) per use and per eviction (one :class:`~collections.OrderedDict` for all sizes:
a size-1 key is a bare int, a size-s key an s-tuple, so sizes never collide).

There is no C version of this pool: the V1 rules always run this pure-Python code.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Sequence

from .base import check_max_patterns


class PLDPool:
    """Pattern -> matches maps for sizes 1..n (``maps[s]``; size-1 keys are bare tokens)."""

    def __init__(self, k: int, n: int, is_keep_all: bool, is_use_oldest: bool, max_candidates: int = 1,
                 max_patterns: int | None = None) -> None:
        # max_candidates: accepted for the same signature as NGramPool; V1 offers one draft (no candidates())
        if k < 1 or n < 1:
            raise ValueError(f"k and n must be >= 1, got k={k} n={n}")
        check_max_patterns(max_patterns)
        self.k = k
        self.n = n
        self.is_keep_all = is_keep_all
        self.is_use_oldest = is_use_oldest
        self.max_patterns = max_patterns
        self.evictions = 0
        self.table: OrderedDict = OrderedDict()  # every size, in LRU order
        self.maps: list[OrderedDict] = [self.table] * (n + 1)

    def num_patterns(self) -> int:
        return len(self.table)

    def nbytes(self) -> int:
        """An estimate, as :meth:`.pool_index.NGramPool.nbytes` (extra matches not walked). O(1)."""
        return sys.getsizeof(self.table) + (2 * 56 + 8 * (self.k + self.n) // 2 + 64) * len(self.table)

    def use(self, key: object) -> None:
        """``key`` (present) becomes the most recently used; evict over the limit. O(1) amortised."""
        limit = self.max_patterns
        if limit is None:
            return
        table = self.table
        table.move_to_end(key)
        self.evict_over(limit)

    def evict_over(self, limit: int) -> None:
        """Evict the least recently used patterns while more than ``limit`` are held."""
        table = self.table
        while len(table) > limit:
            table.popitem(last=False)
            self.evictions += 1


class PLDCursor:
    """One request's view of a :class:`PLDPool` (V1's ``start_index`` for that request)."""

    __slots__ = ("pool", "start", "seen")

    def __init__(self, pool: PLDPool) -> None:
        self.pool = pool
        self.start = 0  # where the next update window begins
        self.seen = 0  # text length at the previous update: positions from seen - s on are new

    def propose(self, text: Sequence[int], max_seq_len: int) -> tuple[list[int], int]:
        """V1's ``get_draft_tokens`` for this request: (draft, matched size; 0: no match)."""
        room = max_seq_len - 1 - len(text)
        if room <= 0:  # V1 sends [end_id] here and updates nothing
            return [], 0
        self._update(text)
        return self._lookup(text, room)

    def candidates(self, text: Sequence[int], max_seq_len: int, max_candidates: int) -> list[tuple[list[int], int]]:
        """None beyond :meth:`propose`'s draft: V1's pool offers one draft per pattern
        (``max_candidates`` is accepted for the cursors' common interface). O(1)."""
        return []

    def _update(self, text: Sequence[int]) -> None:
        """Insert every (pattern, match) of the window, sizes n..1, positions ascending."""
        pool = self.pool
        k, keep_all = pool.k, pool.is_keep_all
        length = len(text)
        limit = pool.max_patterns
        for s in range(min(pool.n, length - 1), 0, -1):
            table = pool.maps[s]
            new_from = max(0, self.seen - s)
            for p in range(self.start, length - s):
                key = text[p] if s == 1 else tuple(text[p:p + s])
                m = tuple(text[p + s:p + s + k])
                state = table.get(key)
                if state is None:
                    table[key] = m  # created: the most recent
                    if limit is not None:
                        pool.evict_over(limit)
                    continue
                if limit is not None and p >= new_from:
                    table.move_to_end(key)  # a new occurrence
                if not keep_all:
                    table[key] = m
                elif type(state) is tuple:
                    if len(state) < k:
                        table[key] = m
                    elif state != m:
                        table[key] = {state: None, m: None}
                elif m not in state:  # two or more matches, the oldest complete
                    state[m] = None
        self.start = max(0, length - (k + pool.n - 1))
        self.seen = length

    def _lookup(self, text: Sequence[int], room: int) -> tuple[list[int], int]:
        pool = self.pool
        for s in range(min(pool.n, len(text) - 1), 0, -1):
            state = pool.maps[s].get(text[-1] if s == 1 else tuple(text[-s:]))
            if state is None:
                continue
            pool.use(text[-1] if s == 1 else tuple(text[-s:]))
            if type(state) is not tuple:
                state = next(iter(state)) if pool.is_use_oldest else next(reversed(state))
            return list(state[:room]), s
        return [], 0
