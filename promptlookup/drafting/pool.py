"""TensorRT-LLM V2's n-gram pool, updated incrementally: the pure-Python fallback of ``native/pool.c``.

What is reproduced
------------------
The V2 rules stated in :mod:`.pool_spec` (:class:`~.pool_spec.NGramPoolManagerSpec`):
``NGramPoolManager.get_draft_tokens`` in ``tensorrt_llm/_torch/speculative/ngram.py``, as
read at TensorRT-LLM commits ``c4dc529f72b1`` and ``0249976575`` (1.2.0rc3), which apply the
same rules. Later TensorRT-LLM versions rebuild ``NGramPoolManager`` (around a suffix
automaton, then a GPU kernel over each request's token history); their drafts differ and
are not what this module reproduces. One call of ``get_draft_tokens(prefix, request_id,
max_sequence_length)`` corresponds to one :meth:`PoolCursor.propose` here, with k =
``prompt_lookup_num_tokens`` and n = ``max_matching_ngram_size``. In short (the
specification has the full statement): each call re-inserts the window
``prefix[max(0, L_prev - (k + n - 1)):]``; a new match replaces a pattern's set when the
pattern is new (or, without ``is_keep_all``, when it is longer than the first match),
else shorter matches are removed (skipping the entry after each removed one, as
TensorRT-LLM's remove-while-iterating does) and it is appended; the draft is the oldest or
newest match of the longest pattern found at the tail, cut to
``max_sequence_length - 1 - L``.

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

``native/pool.c`` implements the same two classes in C (eager insertions in the same
order, the same settling); :func:`make_drafter` uses it wherever it is built, and this
module where it is not (step costs: docs/benchmarks.md). The property tests hold both to
:class:`~.pool_spec.NGramPoolManagerSpec`. V1's pool is :mod:`.pool_v1`.
"""
from __future__ import annotations

from typing import Sequence

from .base import MAX_CANDIDATES
from .tree import is_covered

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
            short[m] = (seq, len(self.full_set))

    def __len__(self) -> int:
        return len(self.full_set) + len(self.short)


def _apply(state, m: Match, k: int, keep_all: bool, keep: int = 1, oldest: bool = True):
    """One TensorRT-LLM insertion of match ``m`` into ``S`` (``None``: pattern absent);
    ``keep``/``oldest``: how a new :class:`MatchSet` keeps full matches for candidates."""
    if state is None:
        return m
    if type(state) is tuple:  # S = [state]
        if state == m:
            return state
        if len(state) < len(m):  # replaced (keep_all=False) or removed as shorter
            return m
        return MatchSet(k, state, m, keep, oldest)
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

    Candidates (``max_candidates = c > 1``, see :meth:`PoolCursor.candidates`): every
    :class:`MatchSet` also keeps its first ``c`` (``is_use_oldest``) or last ``c`` full
    matches in order, so ``S[0:c]`` / ``S[-c:]`` are known; a record settles only once
    ``S[0:c]`` are all full, and none is stored bare. With ``c == 1`` nothing changes.
    Drafts never depend on ``c``: only what :meth:`PoolCursor.candidates` can see does.
    """

    PENDING_LIMIT = 32

    def __init__(self, k: int, n: int, is_keep_all: bool, is_use_oldest: bool, max_candidates: int = 1) -> None:
        if not 1 <= max_candidates <= MAX_CANDIDATES:
            raise ValueError(f"max_candidates must be in 1..{MAX_CANDIDATES}, got {max_candidates}")
        self.k = k
        self.n = n
        self.is_keep_all = is_keep_all
        self.is_use_oldest = is_use_oldest
        # matches kept per pattern for candidates(): S[0:c] (oldest) or S[-c:]. With c > 1 a
        # pattern settles only once S[0:c] are all full, and is never stored bare.
        self.max_candidates = max_candidates
        self.settle_single = is_use_oldest and max_candidates == 1
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
                    state = _apply(state, m, k, keep_all, self.max_candidates, self.is_use_oldest)
            rec[0] = state
            if self.is_settled(state):
                rec[1] = None
            else:
                rec[1] = []
        return state

    def is_settled(self, state) -> bool:
        """With ``is_use_oldest``: the first ``max_candidates`` entries of ``S`` are full."""
        if not self.is_use_oldest:
            return False
        if self.max_candidates == 1:
            return _first_is_full(state, self.k)
        return type(state) is MatchSet and state.prefix_is_full()

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
        settle_single = pool.settle_single
        keep = pool.max_candidates
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
                        if settle_single and r - q == k:
                            rec[1] = None
                    elif state != m:
                        rec[0] = MatchSet(k, state, m, keep, oldest)
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
                    if settle_single and r - q == k:
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
                            if settle_single and r - q == k:
                                rec[1] = None
                        elif state != m:
                            rec[0] = MatchSet(k, state, m, keep, oldest)
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

    def candidates(self, text: Sequence[int], max_seq_len: int, max_candidates: int) -> list[tuple[list[int], int]]:
        """Candidate drafts for ``text`` after :meth:`propose` saw it: ``(draft, n-gram size)``.

        For each size ``s`` from ``min(n, len(text) - 1)`` down to 1 whose pattern
        ``text[-s:]`` is in the pool, its matches in draft priority (``S[0], S[1], ...`` with
        ``is_use_oldest``, else ``S[-1], S[-2], ...``; at most ``min(max_candidates,
        pool.max_candidates)`` per pattern), each cut to ``max_seq_len - 1 - len(text)``
        tokens; a match equal to or a prefix of an earlier candidate is skipped; at most
        ``max_candidates`` in all. The first is :meth:`propose`'s draft.

        A pure read: no draft of any later call changes (deferred insertions of the looked
        up patterns are applied, as a lookup does). Cost: O(n * (n + max_candidates * k)),
        plus the deferred insertions applied; independent of the text length.
        """
        length = len(text)
        budget = max_seq_len - 1 - length
        if budget <= 0 or max_candidates < 1:
            return []
        if max_candidates > MAX_CANDIDATES:
            raise ValueError(f"max_candidates must be <= {MAX_CANDIDATES}, got {max_candidates}")
        if self.prev_len != length:
            raise ValueError(f"candidates() needs propose() for the same text first "
                             f"(text has {length} tokens, the last proposal saw {self.prev_len})")
        pool = self.pool
        per_pattern = min(max_candidates, pool.max_candidates)
        out: list[tuple[list[int], int]] = []
        chosen: list[list[int]] = []
        for s in range(min(pool.n, length - 1), 0, -1):
            rec = pool.maps[s].get(text[-1] if s == 1 else tuple(text[-s:]))
            if rec is None:
                continue
            state = rec if type(rec) is tuple else pool.materialize(rec)
            matches = [state] if type(state) is tuple else state.ordered(per_pattern)
            for m in matches:
                draft = list(m[:budget])
                if is_covered(draft, chosen):
                    continue
                chosen.append(draft)
                out.append((draft, s))
                if len(out) == max_candidates:
                    return out
        return out
