"""One request being decoded: its proposer, its result so far and its stop rules.

Every loop (V2's single call, the scheduler's continuous batching, V1's orchestrator)
holds one :class:`RequestState` per request and does the same per step for it:
``plan()`` the step (the proposer prepares its draft tree, within the output and engine
limits), ``tree(cap)`` (the tree to verify, a chain cut to a batch budget's grant), have
the target verify it, then ``commit()`` the tokens that came back (the one commit rule:
``max_new_tokens``, stop words, ``end_id``). Only *how* the target is called differs (a
re-submission through ``Runner.generate`` in V1, a live batch in V2 and the scheduler).
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.base import Drafter
from ..runtime.base import EngineLimits, SamplingConfig
from ..runtime.results import SequenceResult, StepEvent, TokenLogprob
from ..runtime.tree import DraftTree
from .draft_policy import DraftLengthPolicy
from .lookahead import LookaheadConfig
from .proposers import CandidateProposer, ChainProposer, LookaheadProposer, NoDraft, Proposer

FINISH_STOP, FINISH_LENGTH = "stop", "length"


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


def make_proposer(
    prompt: Sequence[int],
    drafter: Drafter | None,
    max_seq_len: int,
    *,
    step_costs: Sequence[float] | None = None,
    max_candidates: int = 1,
    lookahead: LookaheadConfig | None = None,
    seed: int = 0,
) -> Proposer:
    """The proposer of one request: plain decoding, a prompt-lookup chain, several
    candidates (``max_candidates > 1``) or Lookahead (with prompt lookup too when a drafter
    is given). ``step_costs`` (relative step cost by tokens fed; ``None``: verify everything
    proposed) lets it size its trees. ``seed`` seeds Lookahead's window (the request's number)."""
    req = drafter.new_request(prompt, max_seq_len) if drafter is not None else None
    if lookahead is not None:
        return LookaheadProposer(lookahead, prompt, drafter=req, costs=step_costs, seed=seed)
    if req is None:
        return NoDraft()
    policy = DraftLengthPolicy(step_costs) if step_costs else None
    if max_candidates > 1:
        return CandidateProposer(req, policy, max_candidates)
    return ChainProposer(req, policy)


class RequestState:
    """A live request: ``index`` (its number, in events), ``prompt``, its ``proposer``, its
    ``result`` so far, its stop rules (``max_new_tokens``, ``end_id``, the sampling's stop
    words) and ``slot`` (its index in a live batch, where it has one).

    Invariants: ``result.output_ids`` never passes ``max_new_tokens``, the sequence never
    passes ``max_seq_len``, and a step's tree has at most ``max_tree_nodes`` nodes.
    """

    def __init__(
        self,
        index: int,
        prompt: Sequence[int],
        proposer: Proposer,
        *,
        max_new_tokens: int,
        end_id: int,
        max_seq_len: int,
        sampling: SamplingConfig = SamplingConfig(),
        max_tree_nodes: int | None = None,
        slot: int | None = None,
    ) -> None:
        """Stop words (``sampling.stop_words``) and stop tokens (``sampling.stop_token_ids``)
        end the request and stay in its output, as ``end_id`` does; whatever a step produced
        after one is dropped."""
        self.index = index
        self.prompt = list(prompt)
        self.proposer = proposer
        self.max_new_tokens = max_new_tokens
        self.end_id = end_id
        self.max_seq_len = max_seq_len
        self.sampling = sampling
        self.stop_words = [list(w) for w in sampling.stop_words if w] + [[t] for t in sampling.stop_token_ids]
        self.max_tree_nodes = max_tree_nodes
        self.slot = slot
        self.result = SequenceResult()
        self.result.accepted_by_source = proposer.accepted_by_source  # the proposer keeps it up to date
        if sampling.logprobs is not None:
            self.result.token_logprobs = []  # one entry per output id from here on
        self._tree: DraftTree | None = None

    @property
    def done(self) -> bool:
        """Finished (``end_id`` or a stop word) or at ``max_new_tokens``."""
        return self.result.finished or len(self.result.output_ids) >= self.max_new_tokens

    @property
    def finish_reason(self) -> str:
        return FINISH_STOP if self.result.finished else FINISH_LENGTH

    def plan(self) -> int:
        """Prepare this step's tree within the limits; returns the draft tokens it would
        verify (what a batch budget may cut, for a chain)."""
        out = self.result.output_ids
        room = self.max_new_tokens - len(out) - 1
        space = self.max_seq_len - len(self.prompt) - len(out)
        if self.max_tree_nodes is not None:
            space = min(space, self.max_tree_nodes)
        return self.proposer.plan(max(0, room), max(0, space))

    def tree(self, cap: int | None = None) -> DraftTree:
        """The planned tree, built once: a chain cut to ``cap`` draft tokens (a batch
        budget's grant; ``None``: as planned). It is what :meth:`commit` learns from."""
        self._tree = self.proposer.tree(cap)
        return self._tree

    def commit(self, tokens: Sequence[int], accepted: int, choices: Sequence[int] = (),
               logprobs: Sequence[TokenLogprob] | None = None) -> StepEvent:
        """Append one step's tokens (``accepted`` draft tokens, then the target's own), cut
        at ``max_new_tokens`` and after the first stop word or stop token; returns the step's event.
        ``logprobs`` (one per token, where the request asked) are cut with the tokens."""
        r = self.result
        tokens = list(tokens)[: self.max_new_tokens - len(r.output_ids)]
        stop = None
        if self.stop_words:
            n = max(len(w) for w in self.stop_words)
            history = (self.prompt[-n:] + r.output_ids[-n:])[-n:]  # all a match can reach
            stop = stop_cut(history, tokens, self.stop_words)
        if stop is not None:
            tokens = tokens[:stop]
        tree = self._tree if self._tree is not None else DraftTree([], [])
        self._tree = None
        lps = None
        if self.sampling.logprobs is not None:
            if logprobs is None:
                raise RuntimeError("the step asked for log-probabilities and the runner returned none")
            lps = list(logprobs)[: len(tokens)]
        event = StepEvent(self.index, tokens, min(accepted, len(tokens)), tree.num_walkable, token_logprobs=lps)
        r.add(event)
        r.finished = stop is not None or (bool(tokens) and tokens[-1] == self.end_id)
        r.tree_tokens += len(tree)
        self.proposer.observe(tree, tokens, event.accepted, choices)
        return event

    def finish(self) -> None:
        """The request is over (done, cancelled or failed): its drafter state is released."""
        self.proposer.finish()


def request_states(
    prompts: Sequence[Sequence[int]],
    drafter: Drafter | None,
    limits: EngineLimits,
    *,
    max_new_tokens: int,
    end_id: int,
    sampling: SamplingConfig,
    step_costs: Sequence[float] | None,
    max_candidates: int,
    lookahead: LookaheadConfig | None,
    trees: bool,
    live: bool,
) -> list[RequestState]:
    """One state per prompt, as a whole-batch loop (V1's orchestrator, V2's single call)
    starts them: request ``i`` is prompt ``i`` (its proposer seeded with ``i``); ``trees``:
    a step's tree is bounded by the engine's ``max_draft_len``; ``live``: request ``i``
    holds slot ``i`` of a live batch opened on ``prompts``."""
    return [
        RequestState(i, p, make_proposer(p, drafter, limits.max_seq_len, step_costs=step_costs,
                                          max_candidates=max_candidates, lookahead=lookahead, seed=i),
                     max_new_tokens=max_new_tokens, end_id=end_id, max_seq_len=limits.max_seq_len,
                     sampling=sampling, max_tree_nodes=limits.max_draft_len if trees else None,
                     slot=i if live else None)
        for i, p in enumerate(prompts)
    ]
