"""TensorRT-LLM's n-gram pool, reproduced exactly and updated incrementally.

What is reproduced
------------------
The pool semantics of TensorRT-LLM's PyTorch-backend n-gram drafter,
``NGramPoolManager.get_draft_tokens`` in ``tensorrt_llm/_torch/speculative/ngram.py``
(read at TensorRT-LLM 1.2.0rc3, commit 0249976575; identical in later commits), configured
by ``NGramDecodingConfig`` (``max_draft_len`` / ``prompt_lookup_num_tokens`` = k,
``max_matching_ngram_size`` = n, ``is_keep_all``, ``is_use_oldest``, ``is_public_pool``).
One call of TensorRT-LLM's ``get_draft_tokens(prefix, request_id, max_sequence_length)``
corresponds to one :meth:`PoolCursor.propose` here. Per call, with ``L = len(prefix)``:

1. If ``max_sequence_length - 1 - L <= 0`` the answer is empty and *nothing* is updated.
2. The pool is updated from the window ``prefix[start:]`` where ``start`` is
   ``max(0, L_prev - (k + n - 1))`` (``L_prev``: length at this request's previous call; 0 on
   its first call). For each size ``s`` from ``min(n, L - 1)`` down to 1 and each window
   position ``p`` (ascending) with ``p + s < L``, the pattern ``prefix[p:p+s]`` receives the
   match ``m = prefix[p+s : min(p+s+k, L)]`` (never empty) by this rule, where ``S`` is the
   pattern's ordered set of matches (insertion order):

   - pattern absent, or ``not is_keep_all and len(m) > len(S[0])``: ``S = [m]``;
   - otherwise, if ``m`` is not in ``S``: every element shorter than ``m`` is removed, *walking
     ``S`` while removing from it* (TensorRT-LLM iterates the ``ordered_set.OrderedSet``'s
     backing list while deleting from it, so the element right after each removed one is
     skipped and survives this pass), then ``m`` is appended.
3. The draft: for ``s`` from ``min(n, L - 1)`` down to 1, the first pattern ``prefix[-s:]``
   present in the pool gives ``S[0]`` (``is_use_oldest``) or ``S[-1]``, cut to
   ``max_sequence_length - 1 - L`` tokens; no hit gives an empty draft.
4. Public pool: one pool for all requests of the process, kept after a request ends.
   Private pool: one per request, dropped when the request finishes (TensorRT-LLM drops it
   when the request reaches GENERATION_COMPLETE).

Incremental equivalent
----------------------
A match of full length k can never be removed or displaced afterwards (removal only takes
strictly shorter matches; with ``is_keep_all=False`` a full ``S[0]`` is never replaced), so
re-inserting it is a no-op. TensorRT-LLM's window therefore only does real work at the
positions whose match was *truncated* at the request's previous call (the last ``k - 1``
positions per size) and at the new positions. This module visits exactly those, in the
same order, and applies the same rule, including the skip-while-removing quirk. Each
:class:`MatchSet` keeps its full matches (permanent, never walked again) apart from its
truncated ones, so the removal walk costs O(truncated matches of that pattern) rather than
O(all matches) as in TensorRT-LLM, whose walk is O(|S|) and grows with the text.

Two further shortcuts change no draft (see :class:`NGramPool`): insertions into a pattern
that already holds several matches are *deferred* and applied, in order, when the pattern
is looked up; and with ``is_use_oldest`` a pattern whose oldest match is full is *settled*
(its draft can never change again), so insertions into it are skipped.

Cost per :meth:`PoolCursor.propose`: O(n * (k + new tokens)) dictionary operations on
tuples of at most k tokens, independent of the text length (the first call indexes the
prompt: O(n * len(prompt))); measured costs are in docs/benchmarks.md. Memory:
O(n * L) patterns, plus deferred insertions (at most :data:`NGramPool.PENDING_LIMIT` per
pattern).

This module is the readable specification. ``native/pool.c`` implements the same two
classes in C (eager insertions in the same order, the same settling); :func:`make_drafter`
uses it wherever it is built, and the
property tests hold both to the brute-force reference.
"""
from __future__ import annotations

from typing import Sequence

Match = tuple  # a continuation: tuple[int, ...]


class MatchSet:
    """The ordered set ``S`` of continuations TensorRT-LLM keeps for one pattern (2+ entries).

    A pattern with a single match is stored as the bare tuple (the common case); it becomes
    a :class:`MatchSet` when a second distinct match has to be kept.

    Representation (``S`` order = insertion order):
    - full matches (length k) in ``full_set``; the first and last with their sequence numbers.
      Full matches are never removed, so only the endpoints matter.
    - truncated matches in ``short`` (insertion-ordered dict), each with its sequence number
      and the number of full matches inserted before it; two consecutive truncated entries
      are adjacent in ``S`` iff no full match lies between them (equal counts).
    """

    __slots__ = ("k", "full_set", "full_first", "full_first_seq", "full_last", "full_last_seq", "short", "seq")

    def __init__(self, k: int, first: Match, second: Match) -> None:
        self.k = k
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
        seq = self.seq
        self.seq = seq + 1
        if len(m) == self.k:
            if self.full_first is None:
                self.full_first, self.full_first_seq = m, seq
            self.full_last, self.full_last_seq = m, seq
            self.full_set.add(m)
        else:
            self.short[m] = (seq, len(self.full_set))

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
        seq = self.seq
        self.seq = seq + 1
        if len(m) == self.k:
            if self.full_first is None:
                self.full_first, self.full_first_seq = m, seq
            self.full_last, self.full_last_seq = m, seq
            self.full_set.add(m)
        else:
            short[m] = (seq, len(self.full_set))

    def __len__(self) -> int:
        return len(self.full_set) + len(self.short)


def _apply(state, m: Match, k: int, keep_all: bool):
    """One TensorRT-LLM insertion of match ``m`` into ``S`` (``None``: pattern absent)."""
    if state is None:
        return m
    if type(state) is tuple:  # S = [state]
        if state == m:
            return state
        if len(state) < len(m):  # replaced (keep_all=False) or removed as shorter
            return m
        return MatchSet(k, state, m)
    if not keep_all and len(m) > len(state.first()):
        return m
    state.add(m)
    return state


def _first_is_full(state, k: int) -> bool:
    if type(state) is tuple:
        return len(state) == k
    return len(state.first()) == k


class NGramPool:
    """Pattern -> matches maps for sizes 1..n (one dict per size; size-1 keys are bare ints).

    Each pattern's record is a list ``[S, pending]``:

    - ``S`` is a bare tuple (a single match) or a :class:`MatchSet`;
    - ``pending`` lists insertions not yet applied, as ``(text, q, r)`` meaning the match
      ``tuple(text[q:r])`` (texts only grow, so the slice is what TensorRT-LLM inserted at
      that moment). They are applied in their original order when the pattern is looked
      up, or when more than :data:`PENDING_LIMIT` wait. Applying costs what eager insertion
      costs; deferring only keeps the work off the per-step path for patterns that are not
      looked up.
    - ``pending is None`` marks a *settled* record: with ``is_use_oldest`` the answer is
      ``S[0]``, and once ``S[0]`` is a full-length match nothing can remove or displace it,
      so later insertions cannot change any draft and are not recorded at all.

    A pattern whose very first match is already full (with ``is_use_oldest``: most patterns
    of a long prompt) is settled from the start and stored as the bare match tuple instead
    of a record, which keeps the number of objects the garbage collector walks small.
    """

    PENDING_LIMIT = 32

    def __init__(self, k: int, n: int, is_keep_all: bool, is_use_oldest: bool) -> None:
        self.k = k
        self.n = n
        self.is_keep_all = is_keep_all
        self.is_use_oldest = is_use_oldest
        self.maps: list[dict] = [{} for _ in range(n + 1)]  # maps[s] for s in 1..n

    def num_patterns(self) -> int:
        return sum(len(m) for m in self.maps)

    def materialize(self, rec: list):
        """Apply ``rec``'s pending insertions in order; return its ``S``."""
        state = rec[0]
        pending = rec[1]
        if pending:
            k = self.k
            keep_all = self.is_keep_all
            for text, q, r in pending:
                m = tuple(text[q:r])
                if type(state) is MatchSet:
                    if keep_all or len(m) <= len(state.first()):
                        state.add(m)
                    else:
                        state = m
                else:
                    state = _apply(state, m, k, keep_all)
            rec[0] = state
            if self.is_use_oldest and _first_is_full(state, k):
                rec[1] = None
            else:
                rec[1] = []
        return state

    def lookup(self, text: Sequence[int], max_size: int) -> tuple[Match, int]:
        """First hit for sizes ``max_size..1`` on the tail of ``text``: (match, size) or ((), 0)."""
        maps = self.maps
        for s in range(max_size, 0, -1):
            key = text[-1] if s == 1 else tuple(text[-s:])
            rec = maps[s].get(key)
            if rec is not None:
                if type(rec) is tuple:  # settled, stored bare
                    return rec, s
                state = self.materialize(rec)
                if type(state) is tuple:
                    return state, s
                return (state.first() if self.is_use_oldest else state.last()), s
        return (), 0


class PoolCursor:
    """One request's view of an :class:`NGramPool` (TensorRT-LLM's ``start_index`` state).

    Keeps, per size, the positions whose match is still truncated and whose record is not
    settled, with their records, so a step revisits them without rebuilding pattern keys.
    """

    __slots__ = ("pool", "prev_len", "tails")

    def __init__(self, pool: NGramPool) -> None:
        self.pool = pool
        self.prev_len = -1  # text length at the previous (updating) call; -1: never called
        self.tails: list[list[tuple[int, list]]] = [[] for _ in range(pool.n + 1)]

    def propose(self, text: Sequence[int], max_seq_len: int) -> tuple[list[int], int]:
        """TensorRT-LLM's ``get_draft_tokens``: (draft, matched n-gram size; 0 on no hit)."""
        length = len(text)
        budget = max_seq_len - 1 - length
        if budget <= 0:
            return [], 0
        pool = self.pool
        k = pool.k
        oldest = pool.is_use_oldest
        limit = pool.PENDING_LIMIT
        materialize = pool.materialize
        top = min(pool.n, length - 1)
        prev = self.prev_len
        tails = self.tails
        for s in range(top, 0, -1):
            # TensorRT-LLM rescans from prev - (k + n - 1); positions before the ones whose
            # match was truncated at the previous call hold full matches (no-op), so only
            # the remembered truncated positions and the new ones are visited, in order.
            keep_from = length - s - k + 1  # positions from here on are still truncated
            kept = []
            for p, rec in tails[s]:
                pending = rec[1]
                if pending is None:  # settled: nothing can change its draft any more
                    continue
                q = p + s
                r = q + k
                if r > length:
                    r = length
                state = rec[0]
                if not pending and type(state) is tuple:
                    # nothing deferred and S holds one match: apply now, it is cheap
                    m = tuple(text[q:r])
                    if len(state) < len(m):
                        rec[0] = m
                        if oldest and r - q == k:
                            rec[1] = None
                    elif state != m:
                        rec[0] = MatchSet(k, state, m)
                else:
                    pending.append((text, q, r))
                    if len(pending) > limit:
                        materialize(rec)
                if p >= keep_from and rec[1] is not None:
                    kept.append((p, rec))
            table = pool.maps[s]
            for p in range(0 if prev < 0 else max(0, prev - s), length - s):
                key = text[p] if s == 1 else tuple(text[p:p + s])
                q = p + s
                r = q + k
                if r > length:
                    r = length
                rec = table.get(key)
                if rec is None:  # pattern absent: S = [m]
                    m = tuple(text[q:r])
                    if oldest and r - q == k:
                        table[key] = m  # settled from the start, stored bare (see NGramPool)
                        continue
                    rec = table[key] = [m, []]
                elif type(rec) is tuple:
                    continue
                else:
                    pending = rec[1]
                    if pending is None:
                        continue
                    state = rec[0]
                    if not pending and type(state) is tuple:
                        m = tuple(text[q:r])
                        if len(state) < len(m):
                            rec[0] = m
                            if oldest and r - q == k:
                                rec[1] = None
                        elif state != m:
                            rec[0] = MatchSet(k, state, m)
                    else:
                        pending.append((text, q, r))
                        if len(pending) > limit:
                            materialize(rec)
                if p >= keep_from and rec[1] is not None:
                    kept.append((p, rec))
            tails[s] = kept
        self.prev_len = length
        if top <= 0:
            return [], 0
        match, size = pool.lookup(text, top)
        return list(match[:budget]), size
