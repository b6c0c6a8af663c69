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

Two further shortcuts change no draft (see :class:`~.pool_index.NGramPool`): insertions into a pattern
that already holds several matches are *deferred* and applied, in order, when the pattern
is looked up; and with ``is_use_oldest`` a pattern whose oldest match is full is *settled*
(its draft can never change again), so insertions into it are skipped.

Cost per :meth:`PoolCursor.propose`: O(n * (k + new tokens)) dictionary operations on
tuples of at most k tokens, independent of the text length (the first call indexes the
prompt: O(n * len(prompt))); measured costs are in docs/benchmarks.md. Memory:
O(n * L) patterns, plus deferred insertions (at most :data:`NGramPool.PENDING_LIMIT` per
pattern); with ``max_patterns`` at most that many patterns, the least recently used evicted
first (:mod:`.pool_index` states when a pattern counts as used).

``native/pool.c`` implements the same two classes in C (eager insertions in the same
order, the same settling); :func:`make_drafter` uses it wherever it is built, and this
module where it is not (step costs: docs/benchmarks.md). The property tests hold both to
:class:`~.pool_spec.NGramPoolManagerSpec`. V1's pool is :mod:`.pool_v1`.

Modules: :mod:`.match_set` (one pattern's ``S`` and the insertion rule, written once),
:mod:`.pool_index` (the pattern index, :class:`NGramPool`, and its records) and this one
(:class:`PoolCursor`, a request's walk over the index). ``NGramPool`` and ``MatchSet`` are
re-exported here, the names the C module ``native/_pool`` mirrors.
"""
from __future__ import annotations

from typing import Sequence

from .base import MAX_CANDIDATES
from .match_set import MatchSet, in_order
from .pool_index import NGramPool, PatternRecord
from .tree import is_covered

__all__ = ["MatchSet", "NGramPool", "PoolCursor"]


class PoolCursor:
    """One request's view of an :class:`NGramPool` (TensorRT-LLM's ``start_index`` state).

    Keeps, per size, the positions whose match is still truncated and whose record is not
    settled, with their records, so a step revisits them without rebuilding pattern keys.
    """

    __slots__ = ("pool", "prev_len", "tails")

    def __init__(self, pool: NGramPool) -> None:
        self.pool = pool
        self.prev_len = -1  # text length at the previous (updating) call; -1: never called
        self.tails: list[list[tuple[int, PatternRecord]]] = [[] for _ in range(pool.n + 1)]

    def propose(self, text: Sequence[int], max_seq_len: int) -> tuple[list[int], int]:
        """TensorRT-LLM's ``get_draft_tokens``: (draft, matched n-gram size; 0 on no hit)."""
        length = len(text)
        budget = max_seq_len - 1 - length
        if budget <= 0:
            return [], 0
        pool = self.pool
        k = pool.k
        settle_single = pool.settle_single
        offer = pool.offer
        top = min(pool.n, length - 1)
        prev = self.prev_len
        tails = self.tails
        lru = pool.max_patterns is not None
        for s in range(top, 0, -1):
            # TensorRT-LLM rescans from prev - (k + n - 1); positions before the ones whose
            # match was truncated at the previous call hold full matches (no-op), so only
            # the remembered truncated positions and the new ones are visited, in order.
            keep_from = length - s - k + 1  # positions from here on are still truncated
            kept: list[tuple[int, PatternRecord]] = []
            for p, rec in tails[s]:
                if rec.pending is None:  # settled (nothing can change its draft) or evicted
                    continue
                q = p + s
                offer(rec, text, q, min(q + k, length))
                if p >= keep_from and rec.pending is not None:
                    kept.append((p, rec))
            table = pool.table
            for p in range(0 if prev < 0 else max(0, prev - s), length - s):
                key = text[p] if s == 1 else tuple(text[p:p + s])
                q = p + s
                r = min(q + k, length)
                entry = table.get(key)
                if entry is None:  # pattern absent: S = [m]
                    m = tuple(text[q:r])
                    if settle_single and r - q == k:
                        table[key] = m  # settled from the start, stored bare (see NGramPool)
                        if lru:
                            pool.added()
                        continue
                    rec = table[key] = PatternRecord(m, [])
                    if lru:
                        pool.added()
                else:
                    if lru:
                        table.move_to_end(key)  # a new occurrence: the pattern is used
                    if isinstance(entry, tuple) or entry.pending is None:  # settled
                        continue
                    rec = entry
                    offer(rec, text, q, r)
                if p >= keep_from and rec.pending is not None:
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
            entry = pool.table.get(text[-1] if s == 1 else tuple(text[-s:]))
            if entry is None:
                continue
            for m in in_order(pool.matches(entry), per_pattern):
                draft = list(m[:budget])
                if is_covered(draft, chosen):
                    continue
                chosen.append(draft)
                out.append((draft, s))
                if len(out) == max_candidates:
                    return out
        return out
