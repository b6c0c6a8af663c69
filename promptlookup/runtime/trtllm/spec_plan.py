"""Which TensorRT-LLM speculative config runs a request's drafting, or a one-line refusal.

:func:`plan_speculation` maps this project's :class:`DraftConfig` (or a Lookahead triple)
onto the installed release (:class:`~.releases.Release`):

1. TensorRT-LLM's own ``NGramDecodingConfig`` when the settings are exactly its pool
   (pool mode, V2 rules, no adaptive sizing, no persisted caches, no minimum match);
2. ``SADecodingConfig`` (suffix automaton, longest match) for ``mode="longest"`` where the
   release has it;
3. otherwise ``UserProvidedDecodingConfig`` with this project's drafter running inside
   TensorRT-LLM (:mod:`.user_drafter`), where the release has it: every drafting mode keeps
   its meaning there;
4. ``LookaheadDecodingConfig`` on the TensorRT-engine ``LLM`` only (never the PyTorch one,
   whose ``supports_backend`` rejects it), where the release has that LLM.

Invariants: no setting is accepted and then dropped, so anything no route can honour
(several candidates per step: TensorRT-LLM verifies chains only) is a one-line
:class:`UserError`; the plan holds only upstream keyword names, so a fake with
``extra="forbid"`` catches a renamed field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...drafting.base import DraftConfig
from ...drafting.concurrency import schedule_as_dict
from ...errors import UserError
from .releases import Release

DEFAULT_MAX_MATCH_LEN = DraftConfig().max_match_len

NGRAM = "NGramDecodingConfig"
SA = "SADecodingConfig"
USER_PROVIDED = "UserProvidedDecodingConfig"
LOOKAHEAD = "LookaheadDecodingConfig"


@dataclass(frozen=True)
class SpecPlan:
    """One speculative config: its upstream class name (in ``tensorrt_llm.llmapi``), its
    keyword arguments, which ``LLM`` runs it (``"pytorch"`` or ``"engine"``) and, for
    ``UserProvidedDecodingConfig``, the settings that made this project's drafter necessary."""

    config_class: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    llm: str = "pytorch"
    needs_own_drafter: tuple[str, ...] = ()


def own_drafter_settings(draft: DraftConfig) -> list[str]:
    """The settings of ``draft`` that TensorRT-LLM's NGram drafter does not have (as flags)."""
    found = []
    if draft.mode != "pool":
        found.append(f"--drafter_mode {draft.mode}")
    if draft.mode == "pool" and draft.pool_rules == "v1":
        found.append("--pool_rules v1")
    if draft.adaptive:
        found.append("--adaptive_draft")
    if draft.static_cache is not None:
        found.append("--ngram_static_cache")
    if draft.dynamic_cache is not None:
        found.append("--ngram_dynamic_cache")
    if draft.min_matching_ngram_size > 1:
        found.append(f"--prompt_lookup_min_ngram {draft.min_matching_ngram_size}")
    if draft.mode == "longest" and draft.max_match_len != DEFAULT_MAX_MATCH_LEN:
        found.append(f"max_match_len {draft.max_match_len}")
    if draft.ngram_pool_max_patterns is not None:
        found.append(f"--ngram_pool_max_patterns {draft.ngram_pool_max_patterns}")
    if draft.public_text_max_tokens is not None:
        found.append(f"--public_text_max_tokens {draft.public_text_max_tokens}")
    return found


def _concurrency_kwargs(draft: DraftConfig, release: Release) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if draft.max_concurrency is not None:
        release.require("max_concurrency", "max_concurrency")
        kwargs["max_concurrency"] = draft.max_concurrency
    if draft.draft_len_schedule is not None:
        release.require("draft_len_schedule", "draft_len_schedule")
        kwargs["draft_len_schedule"] = schedule_as_dict(draft.draft_len_schedule)
    return kwargs


def _draft_len_kwargs(k: int, release: Release) -> dict[str, Any]:
    if release.has("max_draft_len"):
        return {"max_draft_len": k}
    return {"prompt_lookup_num_tokens": k}  # 0.1x/0.2x releases


def plan_speculation(draft: DraftConfig | None, lookahead: Any, release: Release) -> SpecPlan:
    """The speculative config for ``draft`` (prompt lookup) or ``lookahead`` (a
    :class:`~promptlookup.decoding.lookahead.LookaheadConfig`) on ``release``; exactly one of
    the two must be given. Raises a one-line :class:`UserError` for anything no route keeps."""
    if lookahead is not None and draft is not None:
        raise UserError("TensorRT-LLM takes one speculative_config: Lookahead or NGram, not both; "
                        "drop --prompt_lookup_config or --lookahead_config (or use --backend torch)")
    if lookahead is None and draft is None:
        raise UserError("V2 on TensorRT-LLM needs --prompt_lookup_config or --lookahead_config")
    if lookahead is not None:
        w, n, g = lookahead.triple
        if g < 1:
            raise UserError("TensorRT-LLM's LookaheadDecodingConfig needs max_verification_set_size >= 1; "
                            "pass G >= 1 in --lookahead_config (or use --backend torch)")
        release.require("engine_llm", "--lookahead_config on --backend trtllm")
        return SpecPlan(LOOKAHEAD, dict(max_window_size=w, max_ngram_size=n, max_verification_set_size=g),
                        llm="engine")
    assert draft is not None
    if draft.prompt_lookup_num_tokens < 1 or draft.max_matching_ngram_size < 1:
        raise UserError(
            "NGramDecodingConfig needs prompt_lookup_num_tokens >= 1 and max_matching_ngram_size >= 1, "
            f"got {draft.prompt_lookup_num_tokens} and {draft.max_matching_ngram_size}"
        )
    if draft.max_candidates > 1:
        raise UserError(f"--prompt_lookup_candidates {draft.max_candidates}: TensorRT-LLM verifies one draft chain per "
                        "step (its user-provided drafters are linear trees); use 1, or --backend torch for token trees")
    k = draft.prompt_lookup_num_tokens
    load = _concurrency_kwargs(draft, release)
    own = own_drafter_settings(draft)
    if not own:
        return SpecPlan(NGRAM, dict(**_draft_len_kwargs(k, release), max_matching_ngram_size=draft.max_matching_ngram_size,
                                    is_keep_all=draft.is_keep_all, is_use_oldest=draft.is_use_oldest,
                                    is_public_pool=draft.is_public_pool, **load))
    if own == ["--drafter_mode longest"] and release.has("sa_decoding"):
        # the longest mode also searches the public pool of other requests' text: SA's global pool
        return SpecPlan(SA, dict(max_draft_len=k, max_matching_ngram_size=-1, enable_global_pool=draft.is_public_pool,
                                 **load))
    release.require("user_provided_drafter", " and ".join(own) + " on --backend trtllm --workflow v2")
    return SpecPlan(USER_PROVIDED, dict(max_draft_len=k, **load), needs_own_drafter=tuple(own))


__all__ = ["LOOKAHEAD", "NGRAM", "SA", "USER_PROVIDED", "SpecPlan", "own_drafter_settings", "plan_speculation"]
