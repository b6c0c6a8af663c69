"""The two result types of decoding, one per level, with one set of counter names
(``tokens``/``output_ids``, ``drafted``, ``accepted``):

- :class:`StepEvent`: what one verification step gave one request (the per-step outcome);
  ``decoding.generate``'s ``on_step``, the scheduler's request streams and the LLM API's
  updates all carry it.
- :class:`SequenceResult`: one request's whole outcome, the sum of its steps; the LLM API's
  ``CompletionOutput`` and the server's ``usage`` are views of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..drafting.base import DraftRates


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability (:mod:`.logprobs`: the target's raw logits at its
    position), and the ``top`` most likely tokens there as ``(token, logprob)`` pairs, most
    likely first (as many as the request asked; the token itself may be among them or not).
    ``rank``: 1 + the number of tokens more likely than it there (vLLM's rank; None: unknown)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass
class SequenceResult(DraftRates):
    """One request's outcome.

    Invariants: ``len(draft_flags) == len(output_ids)``; ``accepted <= drafted``;
    ``sum(draft_flags) == accepted`` (a flag is True for a token that came from an
    accepted draft, False for the target's own token); where log-probabilities were asked
    for, ``len(token_logprobs) == len(output_ids)`` (else ``token_logprobs`` is None).
    """

    output_ids: list[int] = field(default_factory=list)  # generated tokens only
    steps: int = 0  # verification steps (target forward passes for this sequence)
    drafted: int = 0  # draft tokens offered
    accepted: int = 0  # draft tokens kept
    draft_flags: list[bool] = field(default_factory=list)
    finished: bool = False  # ended on end_id or a stop word (else on the length limit)
    tree_tokens: int = 0  # draft-tree nodes fed to the target (Lookahead's window included)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # Lookahead: "window", "prompt", "lookup"
    token_logprobs: list[TokenLogprob] | None = None  # one per output id, where asked (runtime.logprobs)

    def add(self, event: StepEvent) -> None:
        """Fold one step in (the one place a request's counters grow)."""
        self.steps += 1
        self.drafted += event.drafted
        self.accepted += event.accepted
        self.output_ids.extend(event.tokens)
        self.draft_flags.extend(event.draft_flags)
        if event.token_logprobs is not None:
            if self.token_logprobs is None:
                self.token_logprobs = []
            self.token_logprobs.extend(event.token_logprobs)

    @property
    def generated_tokens(self) -> int:
        return len(self.output_ids)


@dataclass(frozen=True)
class StepEvent:
    """Tokens appended to sequence ``index`` by one verification step (the per-step outcome).

    Invariant: ``accepted <= min(drafted, len(tokens))``; ``token_logprobs``, where the
    request asked for them, has one entry per token. A request's last event on a
    stream (the scheduler's) has ``finish_reason`` set and may carry no tokens.
    """

    index: int
    tokens: list[int]
    accepted: int  # draft tokens kept: the first ``accepted`` of ``tokens`` came from the draft
    drafted: int = 0  # draft tokens offered in the step (the walkable nodes of its tree)
    finish_reason: str | None = None  # stop (end_id or a stop word), length, cancelled or error
    error: str | None = None  # with finish_reason "error": what failed, one line
    token_logprobs: list[TokenLogprob] | None = None  # per token, where the request asked (runtime.logprobs)

    @property
    def draft_flags(self) -> list[bool]:
        """Per token: whether it came from an accepted draft."""
        return [True] * self.accepted + [False] * (len(self.tokens) - self.accepted)


StepCallback = Callable[[StepEvent], None]
