"""``mode="pool"``: TensorRT-LLM's n-gram pool over the request's context, exactly.

The rules are in :mod:`.pool_spec`: V2's ``NGramPoolManager`` (:mod:`.pool`, or its C twin)
or V1's ``PLDPool`` (:mod:`.pool_v1`), chosen by the drafter's pool rules. With
``is_public_pool`` one pool is shared by all requests of the drafter (as in TensorRT-LLM
V2, where the public pool *is* the context source), else each request has its own, which
goes with it. Every pool holds at most ``config.pool_max_patterns()`` patterns, the least
recently used evicted first (:mod:`.pool_index`). V2 timing: no draft before the request's first generated token (TensorRT-LLM
V2 drafts only for requests in the generation phase); V1 drafts from the first call.

The hit's ``match_len`` is the matched n-gram size and its adaptive reference is n
(``max_matching_ngram_size``). Cost per step: O(n * (k + new tokens)) (see :mod:`.pool`).
"""
from __future__ import annotations

from typing import Sequence

from .base import DraftConfig
from .mode import Found, Hit, PoolCursorLike
from .native import DraftingClasses


class PoolRequest:
    """One request's cursor over the shared or its private pool (a :class:`~.mode.ModeRequest`)."""

    __slots__ = ("cursor", "n")

    def __init__(self, cursor: PoolCursorLike, n: int) -> None:
        self.cursor = cursor
        self.n = n

    def extend(self, text: Sequence[int], new: Sequence[int]) -> None:
        pass  # the cursor reads the new tokens from the text at the next proposal

    def propose(self, text: Sequence[int], budget: int, max_seq_len: int) -> Hit:
        # always called (even without room): TensorRT-LLM updates its pool on every call
        draft, size = self.cursor.propose(text, max_seq_len)
        return Hit(draft, size, self.n, "context")

    def candidates(self, text: Sequence[int], budget: int, max_seq_len: int, max_candidates: int) -> Found:
        return Found(self.cursor.candidates(text, max_seq_len, max_candidates), self.n, False)


class PoolMode:
    """The pool mode's process-wide part: the public pool, if any (a :class:`~.mode.DraftMode`)."""

    falls_back_to_caches = True

    def __init__(self, config: DraftConfig, classes: DraftingClasses, v1: bool) -> None:
        self.config = config
        self.classes = classes
        self.generation_phase_only = not v1  # V2 timing
        self.public_pool: object | None = self._new_pool() if config.is_public_pool else None

    def _new_pool(self) -> object:
        c = self.config
        return self.classes.NGramPool(c.prompt_lookup_num_tokens, c.max_matching_ngram_size, c.is_keep_all,
                                      c.is_use_oldest, c.max_candidates, c.pool_max_patterns())

    def new_request(self, prompt: list[int]) -> PoolRequest:
        pool = self.public_pool if self.public_pool is not None else self._new_pool()
        return PoolRequest(self.classes.PoolCursor(pool), self.config.max_matching_ngram_size)

    def absorb(self, text: list[int], number: int) -> None:
        pass  # the pool already holds the request's text

    def public_stats(self) -> dict[str, int]:
        """The public pool's patterns, bytes (C: its allocations; Python: an estimate) and
        evictions so far; zeros without one. O(pattern slots) for the C pool's bytes."""
        pool = self.public_pool
        if pool is None:
            return {"patterns": 0, "tokens": 0, "bytes": 0, "evictions": 0}
        return {"patterns": int(pool.num_patterns()), "tokens": 0, "bytes": int(pool.nbytes()),
                "evictions": int(pool.evictions)}
