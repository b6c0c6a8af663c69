"""The n-gram drafter: request context first, then the public pool, then persisted caches.

:func:`make_drafter` builds a process-wide :class:`NgramDrafter`; each request gets a
:class:`NgramRequest` (see ``base.py`` for the protocol and its invariants). Sources, in
the order they are consulted by :meth:`NgramRequest.propose`:

1. **Request context** (prompt + output so far).
   - ``mode="pool"``: TensorRT-LLM's n-gram pool (:mod:`.pool`), exactly; with
     ``is_public_pool`` that pool is shared by all requests of the drafter (as in
     TensorRT-LLM, where the public pool *is* the context source), else private.
   - ``mode="longest"``: the longest earlier match of the tail in the request's own text
     (:mod:`.suffix_automaton`), capped at ``max_match_len``, most recent occurrence; the
     draft is what followed it.
2. **Public pool** (``mode="longest"`` with ``is_public_pool``): the texts of this drafter's
   finished requests, searched the same way; it replaces the request's own match only
   when its match is strictly longer.
3. **Caches** (only when the sources above give nothing): the dynamic cache (learns from
   finished requests, llama.cpp's strict thresholds), then the static cache (built
   offline, lax thresholds), drafting token by token (:mod:`.cache_file`).

A draft backed by a match shorter than ``min_matching_ngram_size`` is dropped; this filter
sits here, above the C and Python pools and automata: both report the length of their
longest hit, and no shorter hit is ever preferred, so filtering the result equals
searching only the long enough matches.

Every draft is cut to ``prompt_lookup_num_tokens`` and to ``max_seq_len - 1 - len(text)``;
with ``adaptive`` it is cut further by :mod:`.adaptive`.

Per-step cost: pool mode O(n * (k + new tokens)); longest mode O(new tokens * d) with
d <= max_match_len + 1 (small in practice); caches O(k * max_ngram). None depends on the
text length.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import UserError
from .adaptive import AdaptiveLength
from .base import DRAFT_MODES, DraftConfig
from .cache_file import DEFAULT_MAX_NGRAM, LAX, STRICT, NgramCache
from .identity import TokenizerIdentity
from .native import DraftingClasses, drafting_classes


def validate_config(config: DraftConfig) -> None:
    """Raise :class:`UserError` for option values no drafter can honour."""
    if not isinstance(config, DraftConfig):
        raise UserError(f"expected a DraftConfig, got {type(config).__name__}")
    if config.mode not in DRAFT_MODES:
        raise UserError(f"unknown drafting mode {config.mode!r}; choose one of {', '.join(DRAFT_MODES)}")
    if not isinstance(config.prompt_lookup_num_tokens, int) or config.prompt_lookup_num_tokens < 1:
        raise UserError(f"prompt_lookup_num_tokens must be a positive integer, got {config.prompt_lookup_num_tokens!r}")
    if not isinstance(config.max_matching_ngram_size, int) or config.max_matching_ngram_size < 1:
        raise UserError(f"max_matching_ngram_size must be a positive integer, got {config.max_matching_ngram_size!r}")
    m = config.min_matching_ngram_size
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise UserError(f"min_matching_ngram_size (ngram_min) must be a positive integer, got {m!r}")
    if config.mode == "pool" and m > config.max_matching_ngram_size:
        raise UserError(f"min_matching_ngram_size {m} exceeds max_matching_ngram_size "
                        f"{config.max_matching_ngram_size}; no pool match could ever be used")
    if not isinstance(config.max_match_len, int) or config.max_match_len < 1:
        raise UserError(f"max_match_len must be a positive integer, got {config.max_match_len!r}")


class NgramDrafter:
    """Process-wide drafter: owns the public pool and the persisted caches.

    ``tokenizer`` (a :class:`TokenizerIdentity` or a Hugging Face tokenizer) is required
    when ``static_cache`` or ``dynamic_cache`` is set: cache files built with another
    tokenizer are refused. ``implementation`` picks the C or pure-Python pool and suffix
    automaton (see :func:`.native.drafting_classes`); both give the same drafts.
    """

    def __init__(self, config: DraftConfig, tokenizer: Any = None, implementation: str = "auto") -> None:
        validate_config(config)
        self.config = config
        self.classes: DraftingClasses = drafting_classes(implementation)
        NGramPool, SuffixAutomaton = self.classes.NGramPool, self.classes.SuffixAutomaton
        self.identity: TokenizerIdentity | None = (
            TokenizerIdentity.from_tokenizer(tokenizer) if tokenizer is not None else None
        )
        k, n = config.prompt_lookup_num_tokens, config.max_matching_ngram_size
        self.public_pool = (
            NGramPool(k, n, config.is_keep_all, config.is_use_oldest)
            if config.mode == "pool" and config.is_public_pool
            else None
        )
        self.shared_text = (
            SuffixAutomaton(config.max_match_len) if config.mode == "longest" and config.is_public_pool else None
        )
        self.finished_requests = 0
        self.static_cache: NgramCache | None = None
        self.dynamic_cache: NgramCache | None = None
        if config.static_cache is not None or config.dynamic_cache is not None:
            if self.identity is None:
                raise UserError(
                    "static_cache/dynamic_cache need the tokenizer to check the cache was built with it; "
                    "pass tokenizer= to make_drafter"
                )
        if config.static_cache is not None:
            self.static_cache, _ = NgramCache.load(config.static_cache, expect=self.identity)
        if config.dynamic_cache is not None:
            path = Path(config.dynamic_cache)
            if path.exists():
                self.dynamic_cache, _ = NgramCache.load(path, expect=self.identity)
            else:
                self.dynamic_cache = NgramCache(DEFAULT_MAX_NGRAM)

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> "NgramRequest":
        return NgramRequest(self, prompt, max_seq_len)

    def save(self) -> None:
        """Write the dynamic cache (if configured) to its file, atomically."""
        if self.dynamic_cache is not None and self.config.dynamic_cache is not None:
            assert self.identity is not None
            self.dynamic_cache.save(self.config.dynamic_cache, self.identity)

    def _absorb(self, tokens: list[int]) -> None:
        self.finished_requests += 1
        if self.shared_text is not None:
            self.shared_text.extend(tokens)
            self.shared_text.append(-self.finished_requests)  # separator: never matches a token
        if self.dynamic_cache is not None:
            self.dynamic_cache.update(tokens)


class NgramRequest:
    """One request's drafting state (implements ``RequestDrafter``)."""

    def __init__(self, drafter: NgramDrafter, prompt: Sequence[int], max_seq_len: int) -> None:
        config = drafter.config
        self.drafter = drafter
        self.config = config
        self.k = config.prompt_lookup_num_tokens
        self.max_seq_len = int(max_seq_len)
        self.tokens: list[int] = [int(t) for t in prompt]
        self.finished = False
        self.last_match_len = 0  # length of the match behind the last proposal (0: none)
        self.last_source = ""  # "context", "public", "dynamic", "static" or "" (no draft)
        self.adaptive = AdaptiveLength(self.k) if config.adaptive else None
        self.has_caches = drafter.static_cache is not None or drafter.dynamic_cache is not None
        classes = drafter.classes
        self.cursor: Any = None  # PoolCursor (pool mode)
        self.sam: Any = None  # SuffixAutomaton of the request's text (longest mode)
        self.public: Any = None  # Matcher over the finished requests' texts (longest mode)
        if config.mode == "pool":
            pool = drafter.public_pool
            if pool is None:
                pool = classes.NGramPool(self.k, config.max_matching_ngram_size, config.is_keep_all,
                                         config.is_use_oldest)
            self.cursor = classes.PoolCursor(pool)
        else:
            self.sam = classes.SuffixAutomaton(config.max_match_len)
            self.sam.extend(self.tokens)
            if drafter.shared_text is not None:
                self.public = classes.Matcher(drafter.shared_text)
                self.public.feed(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        if self.finished:
            raise RuntimeError("extend() after finish()")
        new = list(map(int, tokens))
        self.tokens.extend(new)
        if self.sam is not None:
            self.sam.extend(new)
            if self.public is not None:
                self.public.feed(new)

    def propose(self) -> list[int]:
        if self.finished:
            raise RuntimeError("propose() after finish()")
        tokens = self.tokens
        budget = min(self.k, self.max_seq_len - 1 - len(tokens))
        draft: list[int] = []
        match_len = ref = 0
        source = ""
        if self.cursor is not None:
            # always called: TensorRT-LLM updates its pool on every call
            draft, match_len = self.cursor.propose(tokens, self.max_seq_len)
            ref = self.config.max_matching_ngram_size
            source = "context"
        elif budget > 0:
            assert self.sam is not None
            match_len = self.sam.match_len
            draft = self.sam.continuation(budget)
            ref = self.k
            source = "context"
            if self.public is not None:
                public_len, public_draft = self.public.continuation(budget)
                if public_draft and (public_len > match_len or not draft):
                    draft, match_len, source = public_draft, public_len, "public"
        min_len = self.config.min_matching_ngram_size
        if match_len < min_len:  # too short a match (the pool's and automaton's longest hit)
            draft = []
        if not draft and budget > 0 and self.has_caches:
            draft, match_len, ref, source = self._cache_draft(budget)
            if match_len < min_len:
                draft = []
        if draft and self.adaptive is not None:
            draft = draft[: self.adaptive.length(match_len, ref)]
        if not draft:
            match_len, source = 0, ""
        self.last_match_len = match_len
        self.last_source = source
        return draft

    def _cache_draft(self, budget: int) -> tuple[list[int], int, int, str]:
        sources = []
        if self.drafter.dynamic_cache is not None:
            sources.append((self.drafter.dynamic_cache, STRICT, "dynamic"))
        if self.drafter.static_cache is not None:
            sources.append((self.drafter.static_cache, LAX, "static"))
        if not sources:
            return [], 0, 0, ""
        width = max(cache.max_ngram for cache, _, _ in sources)
        context = self.tokens[-width:]
        out: list[int] = []
        first_len = ref = 0
        first_source = ""
        while len(out) < budget:
            for cache, thresholds, name in sources:
                hit = cache.predict(context, thresholds)
                if hit is not None:
                    break
            else:
                break
            token, size = hit
            if not out:
                first_len, ref, first_source = size, cache.max_ngram, name
            out.append(token)
            context.append(token)
            if len(context) > width:
                del context[0]
        return out, first_len, ref, first_source

    def record(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"record() needs 0 <= accepted <= drafted, got drafted={drafted} accepted={accepted}")
        if self.adaptive is not None:
            self.adaptive.record(drafted, accepted)

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.drafter._absorb(self.tokens)
        self.cursor = None  # a private pool goes with the request (TensorRT-LLM drops it)
        self.sam = None
        self.public = None


def make_drafter(config: DraftConfig, tokenizer: Any = None, implementation: str = "auto") -> NgramDrafter:
    """Build the drafter for ``config``; ``tokenizer`` is needed only with persisted caches.

    ``implementation``: ``"auto"`` (the C pool and automaton where built), ``"c"`` or ``"python"``.
    """
    return NgramDrafter(config, tokenizer, implementation)
