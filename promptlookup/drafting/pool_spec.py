"""The readable specification of TensorRT-LLM's two n-gram pools (V1 and V2).

This module states, as plainly and slowly as possible, what the pool mode must draft. The
fast implementations are held to it by property tests (``tests/drafting``):

================  ==============================  =========================================
rules             specification (this module)     implementations
================  ==============================  =========================================
V2 (default)      :class:`NGramPoolManagerSpec`   ``native/pool.c`` (C), ``pool.py``
                                                  (its pure-Python fallback)
V1                :class:`PLDPoolSpec`            ``pool_v1.py`` (pure Python only)
================  ==============================  =========================================

Both specifications re-insert the whole update window at every call, keep every pattern's
matches in a plain list, and do nothing clever; they cost O(window * k * |matches|) per
call and exist only to be read and to be tested against.

Vocabulary: *k* is ``prompt_lookup_num_tokens`` (the longest draft), *n* is
``max_matching_ngram_size`` (the longest pattern). A *pattern* is a run of 1..n tokens of
the text, its *matches* are the runs of up to k tokens that followed it. ``prefix`` is the
request's whole text (prompt plus everything generated) at the call, ``L = len(prefix)``.

V2 rules: TensorRT-LLM's PyTorch workflow (``--workflow v2``)
-------------------------------------------------------------
Source: ``NGramPoolManager.get_draft_tokens`` in ``tensorrt_llm/_torch/speculative/ngram.py``,
read at TensorRT-LLM commits ``c4dc529f72b1`` and ``0249976575`` (1.2.0rc3), which apply the
same rules (the later one only renames ``max_draft_tokens`` to ``max_total_draft_tokens``).

1. *Length limit.* With ``room = max_sequence_length - 1 - L``, a call with ``room <= 0``
   drafts nothing and changes nothing.
2. *Window.* Each request remembers where its next update starts (0 at its first call);
   the call walks ``prefix[start:]`` and afterwards sets ``start = max(0, L - (k + n - 1))``,
   so the last k + n - 1 tokens are walked again next time.
3. *Update.* For each size s from ``min(n, L - 1)`` down to 1, and each window position p
   in increasing order with ``p + s < L``: pattern ``prefix[p:p+s]`` gains the match
   ``m = prefix[p+s : min(p+s+k, L)]`` (never empty). With S the pattern's matches in
   insertion order:

   - S is replaced by ``[m]`` when the pattern is new, or when ``is_keep_all`` is off and m
     is longer than ``S[0]``;
   - otherwise, if m is not already in S, the matches shorter than m are removed and m is
     appended. TensorRT-LLM removes them while iterating over the same list, so the entry
     that slides into a removed entry's place is not looked at and survives this pass.
4. *Draft.* For s from ``min(n, L - 1)`` down to 1, the first pattern ``prefix[-s:]`` that
   has matches gives ``S[0]`` (``is_use_oldest``) or ``S[-1]``, cut to ``room`` tokens. No
   such pattern: no draft.
5. *Pools.* ``is_public_pool``: one pool for all requests, kept when they finish; else one
   pool per request, dropped when it finishes.
6. *Timing.* TensorRT-LLM V2 drafts only for requests in the generation phase: the first
   call of a request sees its prompt plus the first generated token. (This belongs to the
   executor, not the pool; the drafter reproduces it, see ``drafter.py``.)

V1 rules: TensorRT-LLM's TensorRT workflow (``--workflow v1``)
---------------------------------------------------------------
Source: class ``PLDPool`` in ``examples/prompt_lookup/run_dtm_pld.py``, read at TensorRT-LLM
commit ``46ea5256715b``. Step 2 (the window) and the lookup order are as in V2; steps 1
and 3-6 differ:

1. *Length limit.* A call with ``L >= max_sequence_length - 1`` sends ``[end_id]`` and
   changes nothing.
3. *Update.* Same window and order, but the insertion rule is: S is replaced by ``[m]``
   when the pattern is new, or ``is_keep_all`` is off, or ``S[0]`` is shorter than k;
   otherwise m is appended unless already in S. Nothing is ever removed.
4. *Draft.* The first pattern found gives ``S[0]`` or ``S[-1]`` whole (V1 does not cut it;
   the engine stops at its own limit). No pattern found: the draft is ``[end_id]``.
5. *Pools.* One pool per request of the ``run_dtm_pld`` call (V1 has no public pool).
6. *Timing.* The first call sees the prompt alone.

:class:`PLDPoolSpec` also accepts ``public=True`` (one pool shared by all requests): that
is this project's extension of V1, selected by ``is_public_pool``.
"""
from __future__ import annotations

from typing import Hashable

Pattern = tuple
Match = tuple


class _WindowedPool:
    """What both pools share: the per-request window (step 2), the walk over it (step 3,
    with the subclass's insertion rule), the lookup (step 4) and the pools (step 5)."""

    def __init__(self, k: int, n: int, keep_all: bool, oldest: bool, public: bool) -> None:
        self.k, self.n, self.keep_all, self.oldest, self.public = k, n, keep_all, oldest, public
        self.pools: dict[Hashable, dict[Pattern, list[Match]]] = {}  # None (public) or request id -> pool
        self.start: dict[Hashable, int] = {}  # request id -> where its next update window begins

    def insert(self, pool: dict[Pattern, list[Match]], pattern: Pattern, match: Match) -> None:
        raise NotImplementedError

    def update_and_find(self, prefix: list[int], request_id: Hashable) -> Match | None:
        """Steps 2-4: walk the window, then the match the draft comes from (``None``: no hit)."""
        length = len(prefix)
        start = self.start.setdefault(request_id, 0)
        pool = self.pools.setdefault(None if self.public else request_id, {})
        sizes = range(min(self.n, length - 1), 0, -1)
        for s in sizes:
            for p in range(start, length - s):
                self.insert(pool, tuple(prefix[p:p + s]), tuple(prefix[p + s:p + s + self.k]))
        self.start[request_id] = max(0, length - (self.k + self.n - 1))
        for s in sizes:
            matches = pool.get(tuple(prefix[length - s:]))
            if matches:
                return matches[0] if self.oldest else matches[-1]
        return None

    def finish(self, request_id: Hashable) -> None:
        """The request completed: a private pool and its window go with it."""
        self.start.pop(request_id, None)
        if not self.public:
            self.pools.pop(request_id, None)


class NGramPoolManagerSpec(_WindowedPool):
    """V2 rules, brute force: one call = one ``get_draft_tokens(prefix, request_id, max_sequence_length)``."""

    def insert(self, pool: dict[Pattern, list[Match]], pattern: Pattern, match: Match) -> None:
        """Rule 3: give ``pattern`` the new match ``match``."""
        matches = pool.get(pattern)
        if matches is None or (not self.keep_all and len(match) > len(matches[0])):
            pool[pattern] = [match]
            return
        if match in matches:
            return
        kept: list[Match] = []
        slid_in = False  # the entry now sitting where a removed one was: not examined
        for entry in matches:
            if slid_in:
                kept.append(entry)
                slid_in = False
            elif len(entry) < len(match):
                slid_in = True
            else:
                kept.append(entry)
        pool[pattern] = kept + [match]

    def get_draft_tokens(self, prefix: list[int], request_id: Hashable, max_sequence_length: int) -> list[int]:
        room = max_sequence_length - 1 - len(prefix)
        if room <= 0:
            return []
        match = self.update_and_find(prefix, request_id)
        return [] if match is None else list(match)[:room]


class PLDPoolSpec(_WindowedPool):
    """V1 rules, brute force: one call = ``PLDPool.get_draft_tokens`` for one request."""

    def __init__(self, k: int, n: int, keep_all: bool, oldest: bool, end_id: int, public: bool = False) -> None:
        super().__init__(k, n, keep_all, oldest, public)
        self.end_id = end_id

    def insert(self, pool: dict[Pattern, list[Match]], pattern: Pattern, match: Match) -> None:
        """V1's rule 3: replace unless all are kept and the oldest match is complete."""
        matches = pool.get(pattern)
        if matches is None or not self.keep_all or len(matches[0]) < self.k:
            pool[pattern] = [match]
        elif match not in matches:
            matches.append(match)

    def get_draft_tokens(self, prefix: list[int], request_id: Hashable, max_sequence_length: int) -> list[int]:
        if len(prefix) >= max_sequence_length - 1:
            return [self.end_id]
        match = self.update_and_find(prefix, request_id)
        return [self.end_id] if match is None else list(match)
