"""Bookkeeping shared by the V1 and V2 loops: drafts, limits, results and events.

Both loops do the same thing per step for each live sequence: ask its drafter for a draft
(cut so that the output never passes ``max_new_tokens``), have the target verify it, then
commit the accepted tokens plus the target's own. Only *how* the target is called differs
(a re-submission through ``Runner.generate`` in V1, a live :class:`DecodeBatch` in V2).
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.tree import DraftTree
from .draft_policy import DraftLengthPolicy
from .lookahead import LookaheadConfig
from .proposers import CandidateProposer, ChainProposer, LookaheadProposer, NoDraft, Proposer
from ..runtime.results import SequenceResult, StepCallback, StepEvent


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
    """Live sequences of one generation: ``active`` lists the unfinished ones.

    Each sequence has a :class:`~.proposers.Proposer` that builds its step's tree:
    plain decoding, a prompt-lookup chain, several prompt-lookup candidates
    (``max_candidates > 1``) or Lookahead (``lookahead``, with prompt lookup too when a
    drafter is given). ``step_costs`` (relative step cost by tokens fed; ``None``: verify
    everything proposed) lets the proposers size their trees.
    """

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        drafter: Drafter | None,
        max_new_tokens: int,
        max_seq_len: int,
        end_id: int,
        on_step: StepCallback | None,
        step_costs: Sequence[float] | None = None,
        *,
        max_candidates: int = 1,
        lookahead: LookaheadConfig | None = None,
        max_tree_nodes: int | None = None,
        stop_words: Sequence[Sequence[int]] = (),
    ) -> None:
        """``stop_words``: token sequences that end a sequence (kept in its output, as
        ``end_id`` is); whatever a step produced after one is dropped."""
        self.max_new_tokens = max_new_tokens
        self.max_seq_len = max_seq_len
        self.max_tree_nodes = max_tree_nodes
        self.stop_words = [list(w) for w in stop_words if w]
        self.prompts = prompts
        self.end_id = end_id
        self.on_step = on_step
        self.results = [SequenceResult() for _ in prompts]
        self.proposers: list[Proposer] = [
            self._proposer(i, p, drafter, step_costs, max_candidates, lookahead) for i, p in enumerate(prompts)
        ]
        for r, proposer in zip(self.results, self.proposers):
            r.accepted_by_source = proposer.accepted_by_source  # the proposer keeps it up to date
        self.active = list(range(len(prompts)))
        self.last_trees: dict[int, DraftTree] = {}

    def _proposer(self, i, prompt, drafter, costs, max_candidates, lookahead) -> Proposer:
        req = drafter.new_request(prompt, self.max_seq_len) if drafter is not None else None
        if lookahead is not None:
            return LookaheadProposer(lookahead, prompt, drafter=req, costs=costs, seed=i)
        if req is None:
            return NoDraft()
        policy = DraftLengthPolicy(costs) if costs else None
        if max_candidates > 1:
            return CandidateProposer(req, policy, max_candidates)
        return ChainProposer(req, policy)

    def trees(self) -> list[DraftTree]:
        """One tree per active sequence, within the output and engine limits."""
        out = []
        for i in self.active:
            room = self.max_new_tokens - len(self.results[i].output_ids) - 1
            space = self.max_seq_len - len(self.prompts[i]) - len(self.results[i].output_ids)
            if self.max_tree_nodes is not None:
                space = min(space, self.max_tree_nodes)
            tree = self.proposers[i].tree(max(0, room), max(0, space))
            self.last_trees[i] = tree
            out.append(tree)
        return out

    def drafts(self) -> list[list[int]]:
        """Chain drafts, for backends that verify one chain per sequence (V1)."""
        trees = self.trees()
        if not all(t.is_chain for t in trees):
            raise ValueError("this loop verifies chains only")
        return [t.tokens for t in trees]

    def commit(self, i: int, drafted: int, tokens: Sequence[int], accepted: int,
               choices: Sequence[int] = ()) -> None:
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
        tree = self.last_trees.pop(i, None)
        if tree is None:
            tree = DraftTree([], [])
        r.tree_tokens += len(tree)
        self.proposers[i].observe(tree, tokens, accepted, choices)
        if self.on_step is not None:
            self.on_step(StepEvent(i, tokens, accepted))

    def retire_finished(self) -> None:
        still = []
        for i in self.active:
            r = self.results[i]
            if r.finished or len(r.output_ids) >= self.max_new_tokens:
                self.proposers[i].finish()
            else:
                still.append(i)
        self.active = still
