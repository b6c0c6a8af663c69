"""The LLM API's configuration classes, with TensorRT-LLM's names.

- :class:`NGramDecodingConfig`: prompt lookup (TensorRT-LLM's ``NGramDecodingConfig``),
  plus ``min_matching_ngram_size`` (MLX's ``ngram_min``) and this project's drafter modes.
- :class:`LookaheadDecodingConfig`: Jacobi lookahead decoding (window W, n-gram N,
  verification set G), validated here; run by :mod:`promptlookup.decoding.lookahead`.
- :class:`KvCacheConfig`: block reuse and the paged KV budget (defined by the runtime,
  :mod:`promptlookup.runtime.options`, which takes it whole).
- :class:`SamplingParams`: per-request generation settings.

Every class validates itself on construction and raises :class:`UserError` naming the
bad field and value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..drafting.base import DraftConfig
from ..errors import UserError
from ..runtime.base import SamplingConfig
from ..runtime.options import KvCacheConfig  # the runtime's own, passed whole to load_runner


def _int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise UserError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class NGramDecodingConfig:
    """Prompt lookup: drafts of up to ``max_draft_len`` tokens from n-gram matches of up to
    ``max_matching_ngram_size`` tokens (TensorRT-LLM's pool semantics by default)."""

    max_draft_len: int = 10
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True
    min_matching_ngram_size: int = 1  # MLX's ngram_min
    mode: str = "pool"  # "pool" (TensorRT-LLM) or "longest" (longest earlier match)
    adaptive: bool = False
    static_cache: str | None = None  # persisted n-gram cache built offline (read only)
    dynamic_cache: str | None = None  # persisted n-gram cache that learns from finished requests
    # TensorRT-LLM's DecodingBaseConfig knobs, same names and semantics (drafting.concurrency):
    # speculation off above max_concurrency live requests; draft_len_schedule {batch_size: draft_len}
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None

    def __post_init__(self) -> None:
        from ..drafting.concurrency import normalize_schedule
        from ..drafting.drafter import validate_config

        _int("max_draft_len", self.max_draft_len, 1)
        object.__setattr__(self, "draft_len_schedule", None if self.draft_len_schedule is None else
                           dict(normalize_schedule(self.draft_len_schedule, self.max_draft_len)))
        for name in ("is_keep_all", "is_use_oldest", "is_public_pool", "adaptive"):
            _bool(name, getattr(self, name))
        validate_config(self.draft_config())  # the drafter's own rules (sizes, mode, min <= max)

    def draft_config(self) -> DraftConfig:
        return DraftConfig(
            prompt_lookup_num_tokens=self.max_draft_len,
            max_matching_ngram_size=self.max_matching_ngram_size,
            mode=self.mode,
            is_keep_all=self.is_keep_all,
            is_use_oldest=self.is_use_oldest,
            is_public_pool=self.is_public_pool,
            adaptive=self.adaptive,
            min_matching_ngram_size=self.min_matching_ngram_size,
            static_cache=self.static_cache,
            dynamic_cache=self.dynamic_cache,
            max_concurrency=self.max_concurrency,
            draft_len_schedule=None if self.draft_len_schedule is None else tuple(sorted(self.draft_len_schedule.items())),
        )


@dataclass(frozen=True)
class LookaheadDecodingConfig:
    """Lookahead decoding: window size W, n-gram size N, verification set size G
    (TensorRT-LLM's ``LookaheadDecodingConfig`` names)."""

    max_window_size: int = 4
    max_ngram_size: int = 3
    max_verification_set_size: int = 4

    def __post_init__(self) -> None:
        self.lookahead_config()  # validates, with one-line errors

    def lookahead_config(self):
        """The runtime's :class:`~promptlookup.decoding.lookahead.LookaheadConfig`."""
        from ..decoding.lookahead import LookaheadConfig

        return LookaheadConfig(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)

    @property
    def max_draft_len(self) -> int:
        """TensorRT-LLM's ``max_draft_len`` rule for this config: ``(N-2) + (W-1+G)*(N-1)``.
        This project's engine needs :func:`~promptlookup.decoding.lookahead.step_tokens`."""
        from ..decoding.lookahead import trtllm_draft_len

        return trtllm_draft_len(self.lookahead_config())


@dataclass(frozen=True)
class SamplingParams:
    """Per-request settings. ``temperature == 0`` (default) is greedy; sampling is exact
    and reproducible from ``seed`` (see docs/sampling.md). ``end_id`` defaults to the
    tokenizer's end-of-sequence token; generation also stops at the first of the ``stop``
    strings, which is cut from the text."""

    max_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    end_id: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = field(default=None)
    # logits processors (runtime/logits_processors.py; neutral defaults): the three penalties
    # with TensorRT-LLM's semantics, OpenAI's logit_bias {token id: bias}, and min_tokens
    # (neither end_id nor a stop string ends the request before that many tokens)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | tuple[tuple[int, float], ...] | None = None
    min_tokens: int = 0
    logprobs: int | None = None  # each token's log-probability with this many top alternatives (None: none)

    def __post_init__(self) -> None:
        _int("max_tokens", self.max_tokens, 1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise UserError(f"temperature must be a number >= 0, got {self.temperature!r}")
        _int("top_k", self.top_k, 0)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p!r}")
        _int("seed", self.seed, 0)
        if self.end_id is not None:
            _int("end_id", self.end_id, 0)
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None:
            if not all(isinstance(s, str) and s for s in stop):
                raise UserError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
            object.__setattr__(self, "stop", tuple(stop))
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(f"{name} must be a finite number, got {value!r}")
        if self.repetition_penalty <= 0:
            raise UserError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        bias = dict(self.logit_bias or {})
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise UserError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(f"logit_bias[{token}] must be a finite number, got {value!r}")
        object.__setattr__(self, "logit_bias", tuple(sorted((t, float(b)) for t, b in bias.items())) or None)
        _int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise UserError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0)
            if self.logprobs > 20:
                raise UserError(f"logprobs must be in [0, 20] (top alternatives per token), got {self.logprobs}")

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(float(self.temperature), self.top_k, float(self.top_p), self.seed,
                              repetition_penalty=float(self.repetition_penalty),
                              presence_penalty=float(self.presence_penalty),
                              frequency_penalty=float(self.frequency_penalty),
                              logit_bias=self.logit_bias or (), min_tokens=self.min_tokens,
                              logprobs=self.logprobs)
