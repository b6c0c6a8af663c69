"""``mode="llamacpp"``: llama.cpp's ``llama_ngram_cache_draft`` (:mod:`.llamacpp_draft`).

The request's context cache, then the dynamic cache, then the static cache, with the static
cache re-weighting the other two. The persisted caches are part of this mode, so the
drafter does not fall back to them on a miss. Like llama.cpp's lookup, it drafts only after
the first sampled token. The hit's ``match_len`` and adaptive reference are the draft's
length. Cost per step: O(k * max_ngram) cache lookups plus the context cache's update.
"""
from __future__ import annotations

from typing import Sequence

from .cache_file import NgramCache
from .llamacpp_draft import NGRAM_MAX, llamacpp_draft
from .mode import Found, Hit, no_hit


class LlamacppRequest:
    """One request's context cache (a :class:`~.mode.ModeRequest`)."""

    def __init__(self, mode: "LlamacppMode", prompt: list[int]) -> None:
        self.mode = mode
        self.context = NgramCache(NGRAM_MAX)
        self.context.update(prompt)

    def extend(self, text: Sequence[int], new: Sequence[int]) -> None:
        self.context.update(text, len(text) - len(new))

    def propose(self, text: Sequence[int], budget: int, max_seq_len: int) -> Hit:
        if budget <= 0:
            return no_hit()
        draft = llamacpp_draft(text, budget, self.context, self.mode.dynamic_cache, self.mode.static_cache)
        return Hit(draft, len(draft), len(draft), "llamacpp")

    def candidates(self, text: Sequence[int], budget: int, max_seq_len: int, max_candidates: int) -> Found:
        return Found([], self.mode.k, False)  # the draft alone


class LlamacppMode:
    """The llama.cpp mode's process-wide part: the persisted caches (a :class:`~.mode.DraftMode`)."""

    generation_phase_only = True  # llama.cpp's lookup drafts after the first sampled token
    falls_back_to_caches = False  # the caches are this mode's own sources

    def __init__(self, k: int, dynamic_cache: NgramCache | None, static_cache: NgramCache | None) -> None:
        self.k = k
        self.dynamic_cache = dynamic_cache
        self.static_cache = static_cache

    def new_request(self, prompt: list[int]) -> LlamacppRequest:
        return LlamacppRequest(self, prompt)

    def absorb(self, text: list[int], number: int) -> None:
        pass  # the drafter updates the dynamic cache
