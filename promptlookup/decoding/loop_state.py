"""Bookkeeping shared by the V1 and V2 loops: drafts, limits, results and events.

Both loops do the same thing per step for each live sequence: ask its drafter for a draft
(cut so that the output never passes ``max_new_tokens``), have the target verify it, then
commit the accepted tokens plus the target's own. Only *how* the target is called differs
(a re-submission through ``Runner.generate`` in V1, a live :class:`DecodeBatch` in V2).
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter, RequestDrafter
from .draft_policy import DraftLengthPolicy
from .result import SequenceResult, StepCallback, StepEvent


class _NoDraft:
    """Plain decoding: never proposes anything."""

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self) -> list[int]:
        return []

    def record(self, drafted: int, accepted: int) -> None:
        pass

    def finish(self) -> None:
        pass


def stop_cut(history: Sequence[int], tokens: Sequence[int], stop_words: Sequence[Sequence[int]]) -> int | None:
    """How many of ``tokens`` to keep so that the sequence ends with its first stop word.

    ``history`` is the sequence before ``tokens`` (prompt included: as in TensorRT-LLM, a
    stop word may begin in the prompt or in earlier output). Returns ``None`` when no
    prefix of ``tokens`` completes a stop word. Cost: ``O(len(tokens) * sum(len(w)))``.
    """
    longest = max((len(w) for w in stop_words), default=0)
    tail = list(history[max(0, len(history) - longest + 1):]) if longest > 1 else []
    for j, t in enumerate(tokens):
        tail.append(t)
        for w in stop_words:
            if len(tail) >= len(w) and tail[len(tail) - len(w):] == list(w):
                return j + 1
    return None


class LoopState:
    """Live sequences of one generation: ``active`` lists the unfinished ones."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        drafter: Drafter | None,
        max_new_tokens: int,
        max_seq_len: int,
        end_id: int,
        on_step: StepCallback | None,
        step_costs: Sequence[float] | None = None,
        stop_words: Sequence[Sequence[int]] = (),
    ) -> None:
        """``stop_words``: token sequences that end a sequence (kept in its output, as
        ``end_id`` is); whatever a step produced after one is dropped."""
        self.max_new_tokens = max_new_tokens
        self.stop_words = [list(w) for w in stop_words if w]
        self.prompts = prompts
        self.end_id = end_id
        self.on_step = on_step
        self.results = [SequenceResult() for _ in prompts]
        self.drafters: list[RequestDrafter] = [
            drafter.new_request(p, max_seq_len) if drafter is not None else _NoDraft() for p in prompts
        ]
        self.active = list(range(len(prompts)))
        self.policies = [DraftLengthPolicy(step_costs) for _ in prompts] if step_costs else None
        self.proposals: list[list[int]] = [[] for _ in prompts]

    def drafts(self) -> list[list[int]]:
        """One draft per active sequence, cut to leave room for the target's own token and,
        with a cost table, to the length the draft policy expects to pay off."""
        out = []
        for i in self.active:
            room = self.max_new_tokens - len(self.results[i].output_ids) - 1
            proposal = self.drafters[i].propose()[:room] if room > 0 else []
            self.proposals[i] = proposal
            out.append(proposal[: self.policies[i].choose(proposal)] if self.policies else proposal)
        return out

    def commit(self, i: int, drafted: int, tokens: Sequence[int], accepted: int) -> None:
        """Append one step's tokens (``accepted`` draft tokens, then the target's own)."""
        r = self.results[i]
        tokens = list(tokens)[: self.max_new_tokens - len(r.output_ids)]
        stop = None
        if self.stop_words:
            n = max(len(w) for w in self.stop_words)
            history = (list(self.prompts[i][-n:]) + r.output_ids[-n:])[-n:]  # all a match can reach
            stop = stop_cut(history, tokens, self.stop_words)
        if stop is not None:
            tokens = tokens[:stop]
        accepted = min(accepted, len(tokens))
        r.steps += 1
        r.drafted += drafted
        r.accepted += accepted
        r.output_ids.extend(tokens)
        r.draft_flags.extend([True] * accepted + [False] * (len(tokens) - accepted))
        r.finished = stop is not None or (bool(tokens) and tokens[-1] == self.end_id)
        if self.policies:
            self.policies[i].observe(self.proposals[i], drafted, tokens)
        d = self.drafters[i]
        d.record(drafted, accepted)
        d.extend(tokens)
        if self.on_step is not None:
            self.on_step(StepEvent(i, tokens, accepted))

    def retire_finished(self) -> None:
        still = []
        for i in self.active:
            r = self.results[i]
            if r.finished or len(r.output_ids) >= self.max_new_tokens:
                self.drafters[i].finish()
            else:
                still.append(i)
        self.active = still
