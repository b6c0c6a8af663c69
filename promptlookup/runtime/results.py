"""What a prompt-lookup generation returns, per sequence, and the per-step event stream."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class SequenceResult:
    """One request's outcome.

    Invariants: ``len(draft_flags) == len(output_ids)``; ``accepted <= drafted``;
    ``sum(draft_flags) == accepted`` (a flag is True for a token that came from an
    accepted draft, False for the target's own token).
    """

    output_ids: list[int] = field(default_factory=list)  # generated tokens only
    steps: int = 0  # verification steps (target forward passes for this sequence)
    drafted: int = 0  # draft tokens offered
    accepted: int = 0  # draft tokens kept
    draft_flags: list[bool] = field(default_factory=list)
    finished: bool = False  # ended on end_id or a stop word (else on the length limit)
    tree_tokens: int = 0  # draft-tree nodes fed to the target (Lookahead's window included)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # Lookahead: "window", "prompt", "lookup"

    @property
    def generated_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.generated_tokens / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class StepEvent:
    """Tokens appended to sequence ``index`` by one verification step."""

    index: int
    tokens: list[int]
    accepted: int  # draft tokens kept: the first ``accepted`` of ``tokens`` came from the draft


StepCallback = Callable[[StepEvent], None]
