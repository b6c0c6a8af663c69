"""The interface every drafting mode implements, below the rules all modes share.

A mode is where drafts come from in a request's own context: TensorRT-LLM's n-gram pool
(:mod:`.pool_mode`), the longest earlier match (:mod:`.longest_mode`) or llama.cpp's
n-gram caches (:mod:`.llamacpp_mode`). Each is one process-wide :class:`DraftMode` (what
requests share: a public pool, the finished requests' texts) that makes one
:class:`ModeRequest` per request. The rules every mode obeys the same way (the minimum
match length, the fallback to persisted caches, the adaptive cut, V1's ``[end_id]`` miss,
the length limits) are applied once, above the modes, by
:class:`~.drafter.NgramRequest`; a mode only reports what it found (:class:`Hit`).

Invariants of a :class:`ModeRequest`: a hit's draft has at most ``budget`` tokens (cut to
``max_seq_len - 1 - len(text)`` too); ``match_len`` is the length of the match behind it
(0: none), and no shorter match is preferred to a longer one, so filtering hits by
``match_len`` equals searching only long enough matches. ``candidates`` is a pure read of
the drafting state.

The protocols at the end type the classes the modes are built from, which come from the C
modules or their pure-Python twins (:func:`.native.drafting_classes`).
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence


class Hit(NamedTuple):
    """What a mode found for the current text."""

    draft: list[int]
    match_len: int  # length of the match behind the draft (0: none)
    ref: int  # the match length the adaptive cut compares ``match_len`` with
    source: str  # "context", "public" or "llamacpp" (meaningful when ``draft`` is not empty)


class Found(NamedTuple):
    """A mode's candidate drafts: ``(draft, match length)`` pairs, best first."""

    items: list[tuple[list[int], int]]
    ref: int  # as in :class:`Hit`
    merged: bool  # items join two deduplicated lists (may hold a duplicate or the draft further down)


def no_hit() -> Hit:
    """The empty hit (a new list each time: the caller owns the draft it returns)."""
    return Hit([], 0, 0, "")


class ModeRequest(Protocol):
    """One request's state in one mode."""

    def extend(self, text: Sequence[int], new: Sequence[int]) -> None:
        """``new`` was appended to the request's text (``text`` already ends with it)."""

    def propose(self, text: Sequence[int], budget: int, max_seq_len: int) -> Hit:
        """The mode's draft for ``text``, at most ``budget`` tokens."""

    def candidates(self, text: Sequence[int], budget: int, max_seq_len: int, max_candidates: int) -> Found:
        """Up to ``max_candidates`` candidate drafts for ``text``, after :meth:`propose` saw it."""


class DraftMode(Protocol):
    """A mode's process-wide part: makes request states, learns from finished requests."""

    generation_phase_only: bool  # no draft before the request's first generated token
    falls_back_to_caches: bool  # the persisted caches are tried when the mode finds nothing

    def new_request(self, prompt: list[int]) -> ModeRequest:
        """The state of a request whose text begins with ``prompt``."""

    def absorb(self, text: list[int], number: int) -> None:
        """A request finished with ``text``; ``number`` counts the finished requests (1, 2, ...)."""


class FinishedRequest:
    """Stands in for a finished request's mode state (which is dropped); every call is refused."""

    def extend(self, text: Sequence[int], new: Sequence[int]) -> None:
        raise RuntimeError("the request is finished")

    def propose(self, text: Sequence[int], budget: int, max_seq_len: int) -> Hit:
        raise RuntimeError("the request is finished")

    def candidates(self, text: Sequence[int], budget: int, max_seq_len: int, max_candidates: int) -> Found:
        raise RuntimeError("the request is finished")


# --- the classes the modes are built from (C or pure Python, see .native)


class PoolCursorLike(Protocol):
    """:class:`.pool.PoolCursor`, its C twin, or V1's :class:`.pool_v1.PLDCursor`."""

    def propose(self, text: Sequence[int], max_seq_len: int) -> tuple[list[int], int]: ...

    def candidates(self, text: Sequence[int], max_seq_len: int, max_candidates: int) -> list[tuple[list[int], int]]: ...


class TextIndex(Protocol):
    """:class:`.suffix_automaton.SuffixAutomaton` or its C twin."""

    match_len: int

    def __len__(self) -> int: ...

    def extend(self, tokens: Sequence[int]) -> None: ...

    def append(self, c: int) -> None: ...

    def continuation(self, k: int) -> list[int]: ...

    def candidates(self, k: int, max_candidates: int, max_scan: int) -> list[tuple[int, list[int]]]: ...


class TextMatcher(Protocol):
    """:class:`.suffix_automaton.Matcher` or its C twin: another text's matches of a tail."""

    def feed(self, tokens: Sequence[int]) -> None: ...

    def continuation(self, k: int) -> tuple[int, list[int]]: ...

    def candidates(self, k: int, max_candidates: int, max_scan: int) -> list[tuple[int, list[int]]]: ...
