"""The n-gram drafter: request context first, then the public pool, then persisted caches.

:func:`make_drafter` builds a process-wide :class:`NgramDrafter`; each request gets a
:class:`NgramRequest` (see ``base.py`` for the protocol and its invariants). The sources of
steps 1 and 2 below are the drafting *mode*, one class per mode behind one interface
(:mod:`.mode`: :mod:`.pool_mode`, :mod:`.longest_mode`, :mod:`.llamacpp_mode`, built by
:func:`make_mode`); :class:`NgramRequest` wraps the mode and applies the rules every mode
shares (the generation-phase timing, the minimum match, the cache fallback, the adaptive
cut, V1's ``[end_id]`` miss, the length limits). Sources, in the order they are consulted
by :meth:`NgramRequest.propose`:

1. **Request context** (prompt + output so far).
   - ``mode="pool"``: TensorRT-LLM's n-gram pool, exactly (rules in :mod:`.pool_spec`):
     V2's ``NGramPoolManager`` (:mod:`.pool`, or its C twin) or V1's ``PLDPool``
     (:mod:`.pool_v1`), chosen by ``pool_rules`` ("auto": the workflow's own). With
     ``is_public_pool`` that pool is shared by all requests of the drafter (as in
     TensorRT-LLM V2, where the public pool *is* the context source), else private.
     V2 timing: no pool draft before the request's first generated token (TensorRT-LLM V2
     drafts only for requests in the generation phase). V1: a request whose sources all
     miss drafts ``[end_id]`` (when the drafter was given ``end_id``), as V1 does.
   - ``mode="longest"``: the longest earlier match of the tail in the request's own text
     (:mod:`.suffix_automaton`), capped at ``max_match_len``, most recent occurrence; the
     draft is what followed it.
   - ``mode="llamacpp"``: llama.cpp's ``llama_ngram_cache_draft`` (:mod:`.llamacpp_draft`):
     the request's context cache, then the dynamic cache, then the static cache, with the
     static cache re-weighting the other two; the caches are part of this mode, so step 3
     below does not apply to it.
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

from ..defaults import DEFAULT_WORKFLOW, WORKFLOWS
from ..errors import UserError
from .adaptive import AdaptiveLength
from .base import DRAFT_MODES, MAX_CANDIDATES, POOL_RULES, DraftConfig
from .cache_file import DEFAULT_MAX_NGRAM, LAX, STRICT, NgramCache, file_format
from .identity import TokenizerIdentity
from .llamacpp_mode import LlamacppMode
from .longest_mode import LongestMode
from .mode import DraftMode, FinishedRequest, Hit, ModeRequest, no_hit
from .native import DraftingClasses, drafting_classes
from .pool_mode import PoolMode
from .pool_v1 import PLDCursor, PLDPool
from .tree import is_covered


POOL_ONLY_FIELDS = ("is_keep_all", "is_use_oldest", "pool_rules")  # DraftConfig fields only the pool mode reads


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
    if not isinstance(config.max_candidates, int) or not 1 <= config.max_candidates <= MAX_CANDIDATES:
        raise UserError(f"max_candidates must be an integer in 1..{MAX_CANDIDATES} (1: one chain draft), "
                        f"got {config.max_candidates!r}")
    for name, mode in (("ngram_pool_max_patterns", "pool"), ("public_text_max_tokens", "longest")):
        v = getattr(config, name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name} must be a positive integer (None: the default), got {v!r}")
        if config.mode != mode:
            raise UserError(f"{name} applies to the {mode} mode only, not {config.mode!r}; drop it")
    defaults = DraftConfig()
    ignored = [name for name in POOL_ONLY_FIELDS + (("is_public_pool",) if config.mode == "llamacpp" else ())
               if config.mode != "pool" and getattr(config, name) != getattr(defaults, name)]
    if ignored:
        raise UserError(f"{', '.join(f'{n}={getattr(config, n)!r}' for n in ignored)}: the {config.mode} mode does "
                        f"not read {'it' if len(ignored) == 1 else 'them'} (the pool mode does); drop "
                        f"{'it' if len(ignored) == 1 else 'them'}")
    if config.mode == "longest" and config.public_text_max_tokens is not None and not config.is_public_pool:
        raise UserError("public_text_max_tokens bounds the public text, which is off (is_public_pool=False); drop it")
    if config.pool_rules not in POOL_RULES:
        raise UserError(f"unknown pool rules {config.pool_rules!r}; choose one of {', '.join(POOL_RULES)}")
    from .concurrency import check_concurrency, normalize_schedule

    check_concurrency(config.max_concurrency, config.draft_len_schedule)
    if config.draft_len_schedule is not None and normalize_schedule(
            config.draft_len_schedule, config.prompt_lookup_num_tokens) != config.draft_len_schedule:
        raise UserError("draft_len_schedule must be sorted (batch_size, draft_len) pairs; build it with "
                        "promptlookup.drafting.concurrency.normalize_schedule")


def resolve_pool_rules(config: DraftConfig, workflow: str) -> str:
    """The TensorRT-LLM pool ("v1" or "v2") that ``config`` reproduces under ``workflow``."""
    if workflow not in WORKFLOWS:
        raise UserError(f"unknown workflow {workflow!r}; choose v1 or v2")
    return workflow if config.pool_rules == "auto" else config.pool_rules


def check_candidates(config: DraftConfig, workflow: str) -> None:
    """Refuse several candidates per step where the drafter can offer only one: V1's pool keeps
    one match per pattern (so ``max_candidates > 1`` would change nothing)."""
    if config.max_candidates > 1 and config.mode == "pool" and resolve_pool_rules(config, workflow) == "v1":
        raise UserError(f"--prompt_lookup_candidates {config.max_candidates} (max_candidates): V1's pool rules keep "
                        "one match per pattern, so it offers one candidate; pass --workflow v2, --pool_rules v2 or "
                        "--drafter_mode longest, or drop it")


def make_mode(config: DraftConfig, pool_rules: str, classes: DraftingClasses,
              dynamic_cache: NgramCache | None, static_cache: NgramCache | None) -> DraftMode:
    """The mode class for ``config.mode`` (the one place a mode is chosen): the pool under
    ``pool_rules`` ("v1" or "v2"), the longest match, or llama.cpp's caches."""
    if config.mode == "pool":
        return PoolMode(config, classes, v1=pool_rules == "v1")
    if config.mode == "llamacpp":
        return LlamacppMode(config.prompt_lookup_num_tokens, dynamic_cache, static_cache)
    return LongestMode(config, classes)


class NgramDrafter:
    """Process-wide drafter: owns the mode's shared state and the persisted caches.

    ``tokenizer`` (a :class:`TokenizerIdentity` or a Hugging Face tokenizer) is required
    when ``static_cache`` or ``dynamic_cache`` is set: cache files built with another
    tokenizer are refused. ``implementation`` picks the C or pure-Python pool and suffix
    automaton (see :func:`.native.drafting_classes`); both give the same drafts. The V1
    pool exists in pure Python only, so with V1 rules ``classes`` names it.

    ``workflow`` ("v1" or "v2") is the decoding workflow the drafter serves: it picks the
    pool rules when ``config.pool_rules`` is "auto". ``end_id`` is the id V1 drafts when
    nothing matches (``None``: draft nothing instead; the output is the same either way).
    """

    def __init__(self, config: DraftConfig, tokenizer: Any = None, implementation: str = "auto",
                 workflow: str = DEFAULT_WORKFLOW, end_id: int | None = None) -> None:
        validate_config(config)
        self.config = config
        self.workflow = workflow
        self.pool_rules = resolve_pool_rules(config, workflow)
        check_candidates(config, workflow)
        self.end_id = None if end_id is None else int(end_id)
        self.classes: DraftingClasses = drafting_classes(implementation)
        v1 = config.mode == "pool" and self.pool_rules == "v1"
        if v1:
            self.classes = self.classes._replace(NGramPool=PLDPool, PoolCursor=PLDCursor,
                                                 implementation={**self.classes.implementation, "pool": "python"})
        # V1: a request whose sources all miss drafts [end_id], as V1 does
        self.miss_draft: list[int] = [self.end_id] if v1 and self.end_id is not None else []
        self.identity: TokenizerIdentity | None = (
            TokenizerIdentity.from_tokenizer(tokenizer) if tokenizer is not None else None
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
        # a dynamic cache is written back in the format it was read in; a new one in the
        # promptlookup format, or llama.cpp's in the llamacpp mode
        self.dynamic_format = "llama.cpp" if config.mode == "llamacpp" else "promptlookup"
        if config.dynamic_cache is not None:
            path = Path(config.dynamic_cache)
            if path.exists():
                self.dynamic_cache, _ = NgramCache.load(path, expect=self.identity)
                self.dynamic_format = file_format(path)
            else:
                self.dynamic_cache = NgramCache(DEFAULT_MAX_NGRAM)
        self.mode: DraftMode = make_mode(config, self.pool_rules, self.classes, self.dynamic_cache, self.static_cache)

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> "NgramRequest":
        return NgramRequest(self, prompt, max_seq_len)

    def public_pool_stats(self) -> dict[str, int]:
        """What the process-wide drafting state holds: ``patterns`` (the pool mode's public
        pool), ``tokens`` (the longest mode's public text), ``bytes`` (exact for the C pool's
        allocations, an estimate otherwise) and ``evictions`` (pool: patterns evicted;
        longest: rebuilds). Zeros where the mode has none (the llama.cpp mode)."""
        if isinstance(self.mode, (PoolMode, LongestMode)):
            return self.mode.public_stats()
        return {"patterns": 0, "tokens": 0, "bytes": 0, "evictions": 0}

    def public_patterns(self) -> int:
        """Distinct n-grams in the pool all requests share (pool mode with ``is_public_pool``), else 0."""
        return self.public_pool_stats()["patterns"]

    def save(self) -> None:
        """Write the dynamic cache (if configured) to its file, atomically."""
        if self.dynamic_cache is not None and self.config.dynamic_cache is not None:
            assert self.identity is not None
            self.dynamic_cache.save(self.config.dynamic_cache, self.identity, self.dynamic_format)

    def _absorb(self, tokens: list[int]) -> None:
        self.finished_requests += 1
        self.mode.absorb(tokens, self.finished_requests)
        if self.dynamic_cache is not None:
            self.dynamic_cache.update(tokens)


class NgramRequest:
    """One request's drafting state (implements ``RequestDrafter``): the mode's request state
    (``mode``) wrapped in the rules every mode shares (see the module docstring)."""

    def __init__(self, drafter: NgramDrafter, prompt: Sequence[int], max_seq_len: int) -> None:
        config = drafter.config
        self.drafter = drafter
        self.config = config
        self.k = config.prompt_lookup_num_tokens
        self.max_seq_len = int(max_seq_len)
        self.tokens: list[int] = [int(t) for t in prompt]
        self.prompt_len = len(self.tokens)
        self.finished = False
        self.last_match_len = 0  # length of the match behind the last proposal (0: none)
        self.last_draft: list[int] = []  # what propose() returned last (candidates()[0])
        self.proposed_len = -1  # text length at the last propose()
        # "context", "public", "dynamic", "static", "llamacpp", "end_id" (V1's miss) or "" (no draft)
        self.last_source = ""
        self.adaptive = AdaptiveLength(self.k) if config.adaptive else None
        self.has_caches = drafter.static_cache is not None or drafter.dynamic_cache is not None
        self.mode: ModeRequest = drafter.mode.new_request(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        if self.finished:
            raise RuntimeError("extend() after finish()")
        new = list(map(int, tokens))
        self.tokens.extend(new)
        self.mode.extend(self.tokens, new)

    def propose(self) -> list[int]:
        if self.finished:
            raise RuntimeError("propose() after finish()")
        tokens = self.tokens
        budget = min(self.k, self.max_seq_len - 1 - len(tokens))
        mode = self.drafter.mode
        hit: Hit
        if mode.generation_phase_only and len(tokens) == self.prompt_len:
            hit = no_hit()  # e.g. TensorRT-LLM V2 drafts from the first generated token on
        else:
            hit = self.mode.propose(tokens, budget, self.max_seq_len)
        draft, match_len, ref, source = hit
        min_len = self.config.min_matching_ngram_size
        if match_len < min_len:  # too short a match (the pool's and automaton's longest hit)
            draft = []
        if not draft and budget > 0 and self.has_caches and mode.falls_back_to_caches:
            draft, match_len, ref, source = self._cache_draft(budget)
            if match_len < min_len:
                draft = []
        if draft and self.adaptive is not None:
            draft = draft[: self.adaptive.length(match_len, ref)]
        if not draft:
            match_len, source = 0, ""
            miss_draft = self.drafter.miss_draft
            if miss_draft and budget > 0:
                draft, source = list(miss_draft), "end_id"  # V1: nothing matched
        self.last_match_len = match_len
        self.last_source = source
        self.last_draft = draft
        self.proposed_len = len(tokens)
        return draft

    def candidates(self, max_candidates: int) -> list[list[int]]:
        """Up to ``max_candidates`` distinct drafts, best first (see ``RequestDrafter``).

        ``[propose()'s draft]`` followed by, from the source that gave it:
        - pool mode: the other matches of the pattern behind the draft, then those of the
          shorter patterns (:meth:`PoolCursor.candidates`; V1's pool keeps one match);
        - longest mode: continuations of other earlier occurrences of the matched suffix,
          then of shorter suffixes, from the request's text and the public pool, longer
          matches first (:meth:`.longest_mode.LongestRequest.candidates`);
        - caches (static/dynamic) and the llama.cpp mode: nothing more: the draft alone.
        Each is cut like the draft (k, ``max_seq_len``, and the adaptive cut for its own
        match length); one equal to or a prefix of an earlier candidate is dropped. Empty
        when the draft was empty. A pure read of the drafting state.

        Cost: pool mode O(n * (n + G * k)); longest mode O(S * (d + G * k)) with S =
        :data:`.longest_mode.SCAN_PER_CANDIDATE` * G earlier occurrences examined at most (d: the
        occurrence records per position, a handful); independent of the text length.
        """
        if self.finished:
            raise RuntimeError("candidates() after finish()")
        if not isinstance(max_candidates, int) or not 1 <= max_candidates <= self.config.max_candidates:
            raise ValueError(f"max_candidates must be in 1..DraftConfig.max_candidates "
                             f"({self.config.max_candidates}), got {max_candidates!r}")
        if self.proposed_len != len(self.tokens):
            raise RuntimeError("candidates() must follow propose() for the same text (extend() came in between)")
        draft = self.last_draft
        if not draft or max_candidates == 1 or self.last_source in ("dynamic", "static"):
            return [draft] if draft else []
        budget = min(self.k, self.max_seq_len - 1 - len(self.tokens))
        # (candidate, match length), best first, deduplicated unless merged (two such lists joined)
        found, ref, merged = self.mode.candidates(self.tokens, budget, self.max_seq_len, max_candidates)
        if self.adaptive is None and not merged and found and found[0][0] == draft:
            return [candidate for candidate, _ in found[:max_candidates]]  # nothing to cut or merge
        out = [draft]
        for candidate, match_len in found:
            if self.adaptive is not None:
                candidate = candidate[: self.adaptive.length(match_len, ref)]
            if not is_covered(candidate, out):
                out.append(candidate)
                if len(out) == max_candidates:
                    break
        return out

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
        self.mode = FinishedRequest()  # the mode's state goes (a private pool with it, as TensorRT-LLM drops it)


def make_drafter(config: DraftConfig, tokenizer: Any = None, implementation: str = "auto", *,
                 workflow: str = DEFAULT_WORKFLOW, end_id: int | None = None) -> NgramDrafter:
    """Build the drafter for ``config``; ``tokenizer`` is needed only with persisted caches.

    ``implementation``: ``"auto"`` (the C pool and automaton where built), ``"c"`` or ``"python"``.
    ``workflow`` and ``end_id``: see :class:`NgramDrafter` (V1 or V2 pool rules, V1's
    ``[end_id]`` draft).
    """
    return NgramDrafter(config, tokenizer, implementation, workflow, end_id)
