"""``mode="longest"``: the longest earlier match of the text's tail, and what followed it.

The request's own text is indexed by a suffix automaton (:mod:`.suffix_automaton`, or its C
twin); the match is capped at ``max_match_len`` and the most recent occurrence wins. With
``is_public_pool`` the texts of the drafter's finished requests are searched the same way
(the *public* text, one automaton shared by all requests, the texts separated by tokens
that never match); a public match replaces the request's own only when it is strictly
longer, or when the request's own text gives nothing.

The public text is bounded (``config.public_max_tokens()``, T): it keeps the most recent
finished texts. Invariant: after :meth:`LongestMode.absorb` it holds at most T tokens
(separators included). When a finished text takes it over T, the oldest texts are dropped
until at most T/2 tokens remain (the newest text cut to its last T/2 tokens if it alone is
longer) and the shared automaton is rebuilt from them: O(T) per rebuild, at most once per
T/2 tokens absorbed, so amortised O(1) per token. Requests switch to the rebuilt automaton
at their next proposal (their tail is matched again, O(max_match_len)); the old one goes
when the last request using it does.

The hit's ``match_len`` is the match length and its adaptive reference is k. Cost per step:
O(new tokens * d) with d <= max_match_len + 1 (small in practice); candidates: see
:meth:`LongestRequest.candidates`. None depends on the text length.
"""
from __future__ import annotations

from array import array
from collections import deque
from typing import Sequence

from .base import DraftConfig
from .mode import Found, Hit, TextIndex, TextMatcher, no_hit
from .native import DraftingClasses

# earlier occurrences examined per requested candidate (bounds candidates()'s cost)
SCAN_PER_CANDIDATE = 8


class LongestRequest:
    """One request's automaton, and its matcher over the public text (a :class:`~.mode.ModeRequest`)."""

    def __init__(self, mode: "LongestMode", prompt: list[int]) -> None:
        config = mode.config
        self.k = config.prompt_lookup_num_tokens
        self.max_match_len = config.max_match_len
        self.classes = mode.classes
        self.mode = mode
        self.sam: TextIndex = mode.classes.SuffixAutomaton(config.max_match_len, config.max_candidates > 1)
        self.sam.extend(prompt)
        self.shared: TextIndex | None = mode.shared_text
        self.public: TextMatcher | None = None  # the tail's match in the public text (with a shared text)
        self.public_seen = 0  # length of the shared text when ``public`` last caught up with it
        if self.shared is not None:
            self._rematch_public(prompt)

    def _rematch_public(self, text: Sequence[int]) -> None:
        """Match the request's tail against the shared text as it is now.

        A matcher finds each token's match in the text as it was when the token arrived, so
        a request that finishes meanwhile would be missed. Re-walking the last
        ``max_match_len`` tokens from the start (matches are capped at that length) finds
        the longest match in the current text: O(max_match_len) per finished request.
        """
        shared = self.shared
        assert shared is not None
        self.public = self.classes.Matcher(shared)
        self.public.feed(text[-self.max_match_len:])
        self.public_seen = len(shared)

    def extend(self, text: Sequence[int], new: Sequence[int]) -> None:
        self.sam.extend(new)
        if self.public is not None:
            self.public.feed(new)

    def propose(self, text: Sequence[int], budget: int, max_seq_len: int) -> Hit:
        if budget <= 0:
            return no_hit()
        match_len = self.sam.match_len
        draft = self.sam.continuation(budget)
        source = "context"
        if self.public is not None:
            assert self.shared is not None
            if self.mode.shared_text is not self.shared:  # rebuilt over its limit meanwhile
                self.shared = self.mode.shared_text
                self._rematch_public(text)
            elif len(self.shared) != self.public_seen:  # a request finished meanwhile
                self._rematch_public(text)
            public_len, public_draft = self.public.continuation(budget)
            if public_draft and (public_len > match_len or not draft):
                draft, match_len, source = public_draft, public_len, "public"
        return Hit(draft, match_len, self.k, source)

    def candidates(self, text: Sequence[int], budget: int, max_seq_len: int, max_candidates: int) -> Found:
        """Continuations of other earlier occurrences of the matched suffix, then of shorter
        suffixes, from the request's text and the public text, longer matches first.

        Cost: O(S * (d + G * k)) with S = :data:`SCAN_PER_CANDIDATE` * G earlier occurrences
        examined at most (d: the occurrence records per position, a handful)."""
        if budget <= 0:
            return Found([], self.k, False)
        scan = SCAN_PER_CANDIDATE * max_candidates
        found = [(d, m) for m, d in self.sam.candidates(budget, max_candidates, scan)]
        if self.public is not None:
            public = [(d, m) for m, d in self.public.candidates(budget, max_candidates, scan)]
            if public:  # longer matches first; stable: the request's own text first on ties
                return Found(sorted(found + public, key=lambda item: -item[1]), self.k, True)
        return Found(found, self.k, False)


class LongestMode:
    """The longest mode's process-wide part: the public text, if any (a :class:`~.mode.DraftMode`)."""

    generation_phase_only = False
    falls_back_to_caches = True

    def __init__(self, config: DraftConfig, classes: DraftingClasses) -> None:
        self.config = config
        self.classes = classes
        self.max_tokens = config.public_max_tokens()
        # (text as int64 tokens, its number): what shared_text holds, oldest first
        self.texts: deque[tuple[array, int]] = deque()
        self.held = 0  # tokens in shared_text, one separator per text included
        self.rebuilds = 0
        self.shared_text: TextIndex | None = self._new_index() if config.is_public_pool else None

    def _new_index(self) -> TextIndex:
        return self.classes.SuffixAutomaton(self.config.max_match_len, self.config.max_candidates > 1)

    def new_request(self, prompt: list[int]) -> LongestRequest:
        return LongestRequest(self, prompt)

    def absorb(self, text: list[int], number: int) -> None:
        if self.shared_text is None:
            return
        text = array("q", text)
        self.texts.append((text, number))
        self.held += len(text) + 1
        if self.held <= self.max_tokens:
            self.shared_text.extend(text)
            self.shared_text.append(-number)  # separator: never matches a token
            return
        keep = self.max_tokens // 2  # hysteresis: the next rebuild is T/2 tokens away
        while self.texts and self.held > keep:
            if len(self.texts) == 1:  # the newest alone is too long: keep its tail
                newest, num = self.texts[0]
                cut = newest[len(newest) - (keep - 1):] if keep > 1 else array("q")
                self.texts[0] = (cut, num)
                self.held = len(cut) + 1
                break
            dropped, _ = self.texts.popleft()
            self.held -= len(dropped) + 1
        index = self._new_index()
        for kept, num in self.texts:
            index.extend(kept)
            index.append(-num)
        self.shared_text = index
        self.rebuilds += 1

    def public_stats(self) -> dict[str, int]:
        """The public text's tokens and an estimate of its bytes (about 100 bytes a token in
        the C automaton, more in Python, the automaton does not report its size; plus the
        texts kept for rebuilds, 8 bytes a token). O(1)."""
        return {"patterns": 0, "tokens": self.held, "bytes": 108 * self.held + 96 * len(self.texts),
                "evictions": self.rebuilds}
