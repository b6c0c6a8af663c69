"""The LLM API's configuration classes, with TensorRT-LLM's names.

- :class:`NGramDecodingConfig`: prompt lookup (TensorRT-LLM's ``NGramDecodingConfig``),
  plus ``min_matching_ngram_size`` (MLX's ``ngram_min``) and this project's drafter modes.
- :class:`LookaheadDecodingConfig`: Jacobi lookahead decoding (window W, n-gram N,
  verification set G), validated here; run by :mod:`promptlookup.decoding.lookahead`.
- :class:`KvCacheConfig`: block reuse and the paged KV budget (defined by the runtime,
  :mod:`promptlookup.runtime.options`, which takes it whole).
- :class:`SamplingParams`: per-request generation settings.

Every class validates itself on construction and raises :class:`UserError` naming the
bad field and value (``SamplingParams``: also a ``TypeError``/``ValueError``, :mod:`.validation`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..defaults import (DEFAULT_DRAFTER_MODE, DEFAULT_IS_KEEP_ALL, DEFAULT_IS_PUBLIC_POOL, DEFAULT_IS_USE_OLDEST,
                        DEFAULT_LOOKAHEAD, DEFAULT_MAX_DRAFT_LEN, DEFAULT_MAX_MATCHING_NGRAM_SIZE,
                        DEFAULT_MIN_MATCHING_NGRAM_SIZE)
from ..drafting.base import DraftConfig
from ..errors import UserError
from ..runtime.base import SamplingConfig
from ..runtime.options import KvCacheConfig, RuntimeConfig  # the runtime's own, passed whole to load_runner
from ..runtime.options import require_bool as _bool, require_int as _int  # the one set of type checks
from .validation import ParamTypeError, ParamValueError, check_float, check_int, check_logprobs


@dataclass(frozen=True)
class NGramDecodingConfig:
    """Prompt lookup: drafts of up to ``max_draft_len`` tokens from n-gram matches of up to
    ``max_matching_ngram_size`` tokens (TensorRT-LLM's pool semantics by default)."""

    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    max_matching_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE
    is_keep_all: bool = DEFAULT_IS_KEEP_ALL
    is_use_oldest: bool = DEFAULT_IS_USE_OLDEST
    is_public_pool: bool = DEFAULT_IS_PUBLIC_POOL
    min_matching_ngram_size: int = DEFAULT_MIN_MATCHING_NGRAM_SIZE  # MLX's ngram_min
    mode: str = DEFAULT_DRAFTER_MODE  # "pool" (TensorRT-LLM) or "longest" (longest earlier match)
    adaptive: bool = False
    static_cache: str | None = None  # persisted n-gram cache built offline (read only)
    dynamic_cache: str | None = None  # persisted n-gram cache that learns from finished requests
    # TensorRT-LLM's DecodingBaseConfig knobs, same names and semantics (drafting.concurrency):
    # speculation off above max_concurrency live requests; draft_len_schedule {batch_size: draft_len}
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    # bounds on the drafter's process-wide state, least recently used evicted first (None:
    # promptlookup.defaults): the pool mode's patterns, the longest mode's public-text tokens
    ngram_pool_max_patterns: int | None = None
    public_text_max_tokens: int | None = None

    def __post_init__(self) -> None:
        from ..drafting.concurrency import normalize_schedule
        from ..drafting.drafter import validate_config

        _int("max_draft_len", self.max_draft_len, 1)
        object.__setattr__(self, "draft_len_schedule", None if self.draft_len_schedule is None else
                           dict(normalize_schedule(self.draft_len_schedule, self.max_draft_len)))
        for name in ("is_keep_all", "is_use_oldest", "is_public_pool", "adaptive"):
            _bool(name, getattr(self, name))
        for name in ("static_cache", "dynamic_cache"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise UserError(f"{name} must be a path to an n-gram cache file (or None), got "
                                f"{type(path).__name__} {path!r}")
            object.__setattr__(self, name, None if path is None else os.fspath(path))
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
            ngram_pool_max_patterns=self.ngram_pool_max_patterns,
            public_text_max_tokens=self.public_text_max_tokens,
        )


@dataclass(frozen=True)
class LookaheadDecodingConfig:
    """Lookahead decoding: window size W, n-gram size N, verification set size G
    (TensorRT-LLM's ``LookaheadDecodingConfig`` names)."""

    max_window_size: int = DEFAULT_LOOKAHEAD[0]
    max_ngram_size: int = DEFAULT_LOOKAHEAD[1]
    max_verification_set_size: int = DEFAULT_LOOKAHEAD[2]

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
    """Per-request settings. ``temperature == 0`` (default) is greedy, where ``top_k``, ``top_p``
    and ``seed`` change nothing (as in vLLM and OpenAI's API, whose clients send them along;
    the CLIs, whose users come from TensorRT-LLM's sampling defaults, refuse top_k/top_p
    there); sampling is exact
    and reproducible from ``seed`` (see docs/sampling.md). ``end_id`` defaults to the
    tokenizer's end-of-sequence token; generation also stops at the first of the ``stop``
    strings, which is cut from the text.

    ``presence_penalty``, ``frequency_penalty`` (neutral 0) and ``repetition_penalty``
    (neutral 1, > 0) are run.py's, applied at every verified position over the prompt and
    the output so far (:mod:`promptlookup.runtime.logits_processors`), so speculative output
    still equals plain output; so are OpenAI's ``logit_bias`` ({token id: bias}) and
    ``min_tokens`` (neither end_id nor a stop string ends the request before that many).
    ``n``: samples of each prompt (``generate``/``chat``), each its own request with its own
    request id and the same seed, so each is reproducible alone (:mod:`.samples`); greedy
    ``n > 1`` gives ``n`` identical outputs, as vLLM.
    ``ignore_eos``: no end token (vLLM's). ``stop_token_ids``: more end tokens (vLLM's and
    TensorRT-LLM's), each kept in ``token_ids`` (its text not in ``text``) as ``end_id`` is and named by
    ``stop_reason`` (``None`` where it is the end token);
    they end the request even with ``ignore_eos``, and ``min_tokens`` holds them back too. ``logprobs`` (0..20): each output token's
    log-probability and that many most likely alternatives, the raw model's
    (:mod:`promptlookup.runtime.logprobs`), as ``CompletionOutput.logprobs``.
    Bad values raise :class:`~.validation.ParamTypeError` / :class:`~.validation.ParamValueError`
    (``TypeError``/``ValueError``, and :class:`UserError`) naming the field.
    """

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
    n: int = 1  # samples of each prompt (.samples)
    logprobs: int | None = None  # each token's log-probability and this many top alternatives (None: none)
    ignore_eos: bool = False  # vLLM's: no end token at all (generate max_tokens unless a stop string ends it)
    # vLLM's and TensorRT-LLM's: more end tokens (kept in token_ids, as end_id is); with ignore_eos they still end
    stop_token_ids: tuple[int, ...] | list[int] | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)  # normalized (numpy numbers become int/float)

        put("max_tokens", check_int("max_tokens", self.max_tokens, 1))
        put("temperature", check_float("temperature", self.temperature, ">= 0", lambda v: v >= 0))
        put("top_k", check_int("top_k", self.top_k, 0))
        put("top_p", check_float("top_p", self.top_p, "in (0, 1]", lambda v: 0 < v <= 1))
        put("seed", check_int("seed", self.seed, 0))
        if self.end_id is not None:
            put("end_id", check_int("end_id", self.end_id, 0))
        put("n", check_int("n", self.n, 1))
        for name in ("presence_penalty", "frequency_penalty"):
            put(name, check_float(name, getattr(self, name), "(0 is neutral)", lambda v: True))
        put("repetition_penalty",
            check_float("repetition_penalty", self.repetition_penalty, "> 0 (1 is neutral)", lambda v: v > 0))
        put("logprobs", check_logprobs(self.logprobs))
        if not isinstance(self.ignore_eos, bool):
            raise ParamTypeError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.ignore_eos and self.end_id is not None:
            raise ParamValueError(f"ignore_eos=True and end_id={self.end_id}: with ignore_eos no token ends the "
                                  "sequence; give one of them")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None:
            if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
                raise ParamTypeError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
            if not all(stop):
                raise ParamValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
            put("stop", tuple(stop))
        bias = self.logit_bias if self.logit_bias is not None else {}
        if not isinstance(bias, (dict, tuple, list)):
            raise ParamTypeError(f"logit_bias must be a dict {{token id: bias}}, got {type(bias).__name__}")
        try:
            bias = dict(bias)
        except (TypeError, ValueError):
            raise ParamTypeError(f"logit_bias must be a dict {{token id: bias}}, got {self.logit_bias!r}") from None
        for token, value in bias.items():
            check_int("logit_bias keys (token ids)", token, 0)
            bias[token] = check_float(f"logit_bias[{token}]", value, "", lambda v: True)
        put("logit_bias", tuple(sorted((int(t), b) for t, b in bias.items())) or None)
        put("min_tokens", check_int("min_tokens", self.min_tokens, 0))
        if self.min_tokens > self.max_tokens:
            raise ParamValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        stops = self.stop_token_ids
        if stops is not None and (isinstance(stops, (str, bytes)) or not isinstance(stops, (list, tuple))):
            raise ParamTypeError(f"stop_token_ids must be a list of token ids, got {type(stops).__name__}")
        put("stop_token_ids", tuple(dict.fromkeys(check_int("stop_token_ids", t, 0) for t in stops or ())) or None)

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p, self.seed,
                              repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias or (),
                              min_tokens=self.min_tokens, logprobs=self.logprobs,
                              stop_token_ids=self.stop_token_ids or ())
