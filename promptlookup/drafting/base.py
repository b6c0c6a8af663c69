"""The drafter interface shared by every drafting mode and by the decoding loops.

A :class:`Drafter` lives for the whole process (it owns the public pool and any persisted
caches). Each request gets a :class:`RequestDrafter`, which sees the request's text grow
and proposes drafts for it:

    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2))
    req = drafter.new_request(prompt_ids, max_seq_len=engine_max_seq_len)
    while not done:
        draft = req.propose()              # <= k tokens, possibly empty
        accepted_and_bonus = verify(draft)
        req.record(len(draft), accepted)    # feedback, used by adaptive drafting
        req.extend(accepted_and_bonus)      # only the new tail is indexed
    req.finish()                            # lets learning caches absorb the output

Invariants every implementation keeps:
- ``propose()`` never returns more than ``prompt_lookup_num_tokens`` tokens, and never so
  many that the text would pass ``max_seq_len`` (``len(text) + len(draft) + 1 <= max_seq_len``).
- ``extend()`` costs O(len(tokens)) amortised, independent of the text length so far.
- Drafts depend only on the token stream (and shared pools), never on the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from ..defaults import (DEFAULT_DRAFTER_MODE, DEFAULT_IS_KEEP_ALL, DEFAULT_IS_PUBLIC_POOL, DEFAULT_IS_USE_OLDEST,
                        DEFAULT_MAX_DRAFT_LEN, DEFAULT_MAX_MATCHING_NGRAM_SIZE, DEFAULT_MIN_MATCHING_NGRAM_SIZE,
                        DEFAULT_NGRAM_POOL_MAX_PATTERNS, DEFAULT_PUBLIC_TEXT_MAX_TOKENS)

DRAFT_MODES = ("pool", "longest", "llamacpp")
POOL_RULES = ("auto", "v1", "v2")  # which TensorRT-LLM pool the pool mode reproduces
MAX_CANDIDATES = 64  # upper bound on DraftConfig.max_candidates (the C drafters' stack arrays)


class DraftRates:
    """The rates of a count of verification steps, defined once for every such count (a
    request's :class:`~promptlookup.runtime.results.SequenceResult`, the simulator's
    ``SimStats``) from its ``steps``, ``drafted``, ``accepted`` and ``generated_tokens``."""

    steps: int
    drafted: int
    accepted: int

    @property
    def generated_tokens(self) -> int:
        raise NotImplementedError

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.generated_tokens / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class DraftConfig:
    """How drafts are made. Field names follow TensorRT-LLM's ``NGramDecodingConfig``."""

    prompt_lookup_num_tokens: int = DEFAULT_MAX_DRAFT_LEN  # k: the largest draft
    max_matching_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE  # n: longest pattern tried by the pool mode
    # "pool" (TensorRT-LLM semantics), "longest" (longest earlier match) or "llamacpp"
    # (llama.cpp's llama_ngram_cache_draft over context, dynamic and static caches)
    mode: str = DEFAULT_DRAFTER_MODE
    is_keep_all: bool = DEFAULT_IS_KEEP_ALL
    is_use_oldest: bool = DEFAULT_IS_USE_OLDEST
    is_public_pool: bool = DEFAULT_IS_PUBLIC_POOL
    adaptive: bool = False  # size each draft from match length and recent acceptance
    max_match_len: int = 64  # cap on the suffix length searched by the longest mode
    static_cache: str | None = None  # persisted cache built offline from a corpus (read only)
    dynamic_cache: str | None = None  # persisted cache that learns from finished requests
    # G: the most candidate drafts RequestDrafter.candidates() may return per step (1: a
    # chain, exactly today's drafting). The pool keeps up to G matches per pattern and the
    # longest mode records earlier occurrences only when G > 1.
    max_candidates: int = 1
    # pool mode: "v1" (PLDPool of TensorRT-LLM's V1 workflow), "v2" (NGramPoolManager, V2),
    # "auto": the rules of the workflow the drafter is made for (see make_drafter)
    pool_rules: str = "auto"
    # Minimum match length behind a draft (MLX's ngram_min, vLLM's prompt_lookup_min): a
    # draft whose match is shorter (pool: n-gram size; longest: match length; caches:
    # n-gram size) is dropped. 1 keeps every match.
    min_matching_ngram_size: int = DEFAULT_MIN_MATCHING_NGRAM_SIZE
    # Speculation under load (TensorRT-LLM's DecodingBaseConfig names; see .concurrency):
    # off above max_concurrency live requests, or draft lengths by batch size from
    # draft_len_schedule ((batch_size, draft_len) pairs, sorted). None: always k.
    max_concurrency: int | None = None
    draft_len_schedule: tuple[tuple[int, int], ...] | None = None
    # Bounds on what lives for the whole process, least recently used evicted first. None:
    # the default (promptlookup.defaults). Pool mode: patterns per pool (all sizes); longest
    # mode: tokens of the public text. Given for another mode, it is refused.
    ngram_pool_max_patterns: int | None = None
    public_text_max_tokens: int | None = None

    def pool_max_patterns(self) -> int:
        """The pool mode's limit on patterns per pool (the default when not set)."""
        v = self.ngram_pool_max_patterns
        return DEFAULT_NGRAM_POOL_MAX_PATTERNS if v is None else v

    def public_max_tokens(self) -> int:
        """The longest mode's limit on public-text tokens (the default when not set)."""
        v = self.public_text_max_tokens
        return DEFAULT_PUBLIC_TEXT_MAX_TOKENS if v is None else v


class RequestDrafter(Protocol):
    """Per-request drafting state (prompt plus everything generated so far)."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append newly generated tokens to the request's text."""

    def propose(self) -> list[int]:
        """Return the draft for the current text (possibly empty)."""

    def candidates(self, max_candidates: int) -> list[list[int]]:
        """Up to ``max_candidates`` distinct drafts for the current text, best first.

        Called right after :meth:`propose` for the same text; reads, never changes, the
        drafting state. ``candidates[0]`` is the draft ``propose()`` returned (``[]`` when it
        was empty); each candidate obeys propose()'s length invariants, and none equals or
        is a prefix of an earlier one (it would add no node to the token tree, see
        :mod:`.tree`). ``max_candidates`` must not exceed ``DraftConfig.max_candidates``.
        """

    def record(self, drafted: int, accepted: int) -> None:
        """Report how many of the last proposed tokens the target accepted."""

    def finish(self) -> None:
        """The request is over; shared or learning caches may absorb its text."""


class Drafter(Protocol):
    """Process-wide drafter: creates per-request state and owns shared pools/caches."""

    config: DraftConfig

    def new_request(self, prompt: Sequence[int], max_seq_len: int) -> RequestDrafter:
        """Start drafting for a request whose text begins with ``prompt``."""


@runtime_checkable
class WorkflowDrafter(Drafter, Protocol):
    """A drafter made for one decoding ``workflow`` ("v1" or "v2"), whose pool rules
    (``pool_rules="auto"``) are that workflow's (``make_drafter``'s drafters)."""

    workflow: str


def check_max_patterns(max_patterns: int | None) -> None:
    """A pool's pattern limit: a positive integer, or None for no limit."""
    if max_patterns is not None and (isinstance(max_patterns, bool) or not isinstance(max_patterns, int)
                                     or max_patterns < 1):
        raise ValueError(f"max_patterns must be a positive integer or None, got {max_patterns!r}")
