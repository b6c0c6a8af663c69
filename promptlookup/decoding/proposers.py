"""Per-request proposers: what each decoding step verifies for one sequence.

A proposer turns a request's drafting state into the :class:`DraftTree` of one step and
learns from the step's outcome. A step is planned first (``plan``: the proposal and its
cost-policy cut, prepared once), then built once (``tree(cap)``: a chain is cut to the
batch budget's grant, :mod:`.draft_budget`, which reads the public ``rates()``). Three kinds:

- :class:`ChainProposer`: one n-gram draft, cut by the cost policy (the classic prompt
  lookup; a path-shaped tree);
- :class:`CandidateProposer`: several candidate continuations from the n-gram drafter
  (``RequestDrafter.candidates``), merged into a prefix tree within the cost budget;
- :class:`LookaheadProposer`: Lookahead decoding's window and verification branch
  (:mod:`.lookahead`), optionally with a prompt-lookup draft as one more branch.

Every proposer keeps the invariants of a step: the tree's walkable depth never exceeds
``room`` (so the output never passes ``max_new_tokens``) and its node count never exceeds
``space`` (so the sequence never passes the engine's ``max_seq_len`` or ``max_draft_len``).
None changes the output tokens, only how many come per step.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from ..drafting.base import RequestDrafter
from ..drafting.tree import common_prefix_len
from ..runtime.tree import DraftTree, merge_chains
from .draft_policy import DECAY, DraftLengthPolicy
from .lookahead import LOOKUP, WINDOW, LookaheadConfig, LookaheadRequest

PROBE_EVERY = 8  # a skipped Lookahead window still runs every this many steps, to re-measure it


class Proposer(Protocol):
    accepted_by_source: dict[str, int]  # accepted draft tokens by where they came from (Lookahead)

    def plan(self, room: int, space: int) -> int:
        """Prepare the step's tree (walkable depth <= ``room``, at most ``space`` nodes);
        returns the draft tokens it would verify."""

    def tree(self, cap: int | None = None) -> DraftTree:
        """The planned tree; a chain is cut to ``cap`` draft tokens (``None``: as planned).
        Trees of several branches are sized by their proposer and take no cap."""

    def rates(self) -> tuple[float, float] | None:
        """The acceptance estimates ``(p0, p1)`` a cost-aware batch budget prices a chain
        with (:func:`.draft_budget.allot_by_cost`); ``None`` without a cost policy."""

    def observe(self, tree: DraftTree, tokens: Sequence[int], accepted: int, choices: Sequence[int]) -> None:
        """Learn from the step: ``tokens`` appended (``accepted`` from the tree), ``choices``
        the target's choice at the root and every node (empty where the backend gives none)."""

    def finish(self) -> None:
        """The request is over."""


class NoDraft:
    """Plain decoding."""

    def __init__(self) -> None:
        self.accepted_by_source: dict[str, int] = {}

    def plan(self, room: int, space: int) -> int:
        return 0

    def tree(self, cap: int | None = None) -> DraftTree:
        return DraftTree([], [])

    def rates(self) -> tuple[float, float] | None:
        return None

    def observe(self, tree: DraftTree, tokens: Sequence[int], accepted: int, choices: Sequence[int]) -> None:
        pass

    def finish(self) -> None:
        pass


class ChainProposer:
    """One draft per step from ``drafter``, cut to what ``policy`` expects to pay off."""

    def __init__(self, drafter: RequestDrafter, policy: DraftLengthPolicy | None) -> None:
        self.drafter = drafter
        self.policy = policy
        self.proposal: list[int] = []
        self.chosen = 0  # tokens of the proposal the policy keeps
        self.accepted_by_source: dict[str, int] = {}

    def plan(self, room: int, space: int) -> int:
        proposal = self.drafter.propose()[: max(0, min(room, space))]
        self.proposal = proposal
        self.chosen = self.policy.choose(proposal) if self.policy else len(proposal)
        return self.chosen

    def tree(self, cap: int | None = None) -> DraftTree:
        return DraftTree.chain(self.proposal[: self.chosen if cap is None else min(cap, self.chosen)])

    def rates(self) -> tuple[float, float] | None:
        return self.policy.rates if self.policy else None

    def observe(self, tree: DraftTree, tokens: Sequence[int], accepted: int, choices: Sequence[int]) -> None:
        if self.policy:
            self.policy.observe(self.proposal, len(tree), tokens)
        self.drafter.record(tree.num_walkable, accepted)
        self.drafter.extend(tokens)

    def finish(self) -> None:
        self.drafter.finish()


class WholeTree:
    """What the tree proposers share: the tree is built whole when planned (within the
    cost budget) and never cut to a batch budget's grant, so they report no ``rates``."""

    planned: DraftTree

    def plan(self, room: int, space: int) -> int:
        self.planned = self._build(room, space)
        return self.planned.num_walkable

    def tree(self, cap: int | None = None) -> DraftTree:
        return self.planned

    def rates(self) -> tuple[float, float] | None:
        return None

    def _build(self, room: int, space: int) -> DraftTree:
        raise NotImplementedError


class CandidateProposer(WholeTree, ChainProposer):
    """Up to ``max_candidates`` continuations per step, merged into one prefix tree."""

    def __init__(self, drafter: RequestDrafter, policy: DraftLengthPolicy | None, max_candidates: int) -> None:
        super().__init__(drafter, policy)
        self.max_candidates = max_candidates
        self.candidates: list[list[int]] = []
        self.planned = DraftTree([], [])

    def _build(self, room: int, space: int) -> DraftTree:
        cut = max(0, min(room, space))
        first = self.drafter.propose()[:cut]
        self.proposal = first
        found = self.drafter.candidates(self.max_candidates) if first else []
        cands = [list(c[:cut]) for c in found if c[:cut]] or ([first] if first else [])
        self.candidates = cands
        if self.policy:
            cands = self.policy.choose_candidates(cands, space)
        else:
            cands = _within(cands, space)
        return merge_chains(cands)

    def observe(self, tree: DraftTree, tokens: Sequence[int], accepted: int, choices: Sequence[int]) -> None:
        if self.policy:
            self.policy.observe_alternatives(self.candidates, tokens)
        super().observe(tree, tokens, accepted, choices)


def _within(chains: list[list[int]], max_nodes: int) -> list[list[int]]:
    """The leading chains whose merged tree has at most ``max_nodes`` nodes."""
    kept: list[list[int]] = []
    for c in chains:
        if len(merge_chains(kept + [c])) > max_nodes:
            break
        kept.append(c)
    return kept


class LookaheadProposer(WholeTree):
    """Lookahead decoding for one request (:mod:`.lookahead`), optionally with prompt lookup.

    With a cost table, the window runs only while the tokens its n-grams have brought per
    window step pay for its nodes (``(1 + r) / cost[1 + window + rest] >= 1 / cost[1 +
    rest]``); a skipped window still runs every :data:`PROBE_EVERY` steps so that ``r``
    keeps being measured. ``r`` is a decayed average with an optimistic prior of one token.
    """

    def __init__(self, config: LookaheadConfig, prompt: Sequence[int], *, drafter: RequestDrafter | None,
                 costs: Sequence[float] | None, seed: int) -> None:
        self.state = LookaheadRequest(config, prompt, seed=seed, seed_pool_from_text=drafter is not None)
        self.drafter = drafter
        self.costs = list(costs) if costs else None
        self.window_gain = 1.0  # decayed tokens per window step from window n-grams
        self.window_weight = 4.0
        self.skipped = 0
        self.proposal: list[int] = []
        self.planned = DraftTree([], [])
        self.accepted_by_source: dict[str, int] = {}

    def _window_pays(self, window_nodes: int, rest: int) -> bool:
        c = self.costs
        if c is None or window_nodes + rest + 1 >= len(c):
            return c is None
        return (1.0 + self.window_gain) / c[window_nodes + rest + 1] >= 1.0 / c[rest + 1]

    def _build(self, room: int, space: int) -> DraftTree:
        st = self.state
        branches: list[tuple[list[int], str]] = []
        if self.drafter is not None:
            self.proposal = self.drafter.propose()[: max(0, min(room, space))]
            if self.proposal:
                branches.append((self.proposal, LOOKUP))
        limit = max(0, room)
        pool = st.candidates(st.tokens[-1], st.config.max_verification_set_size)
        branches += [(c[:limit], src) for c, src in pool if c[:limit]]
        rest = len(merge_chains([c for c, _ in branches]))
        window_nodes = sum(len(row) for row in st.levels)
        run_window = window_nodes + rest <= space and (
            self._window_pays(window_nodes, rest) or self.skipped + 1 >= PROBE_EVERY
        )
        self.skipped = 0 if run_window else self.skipped + 1
        if not run_window:  # the verification branch alone, within the space left
            kept = _within([c for c, _ in branches], space)
            branches = branches[: len(kept)]
        return st.build_tree(branches, window=run_window)

    def observe(self, tree: DraftTree, tokens: Sequence[int], accepted: int, choices: Sequence[int]) -> None:
        st = self.state
        had_window = bool(st.window_nodes)
        src = _source_of(tree, tokens) if accepted else ""
        if src:
            self.accepted_by_source[src] = self.accepted_by_source.get(src, 0) + accepted
        if had_window:
            gain = accepted if src == WINDOW else 0
            self.window_gain = (self.window_gain * self.window_weight * DECAY + gain) / (self.window_weight * DECAY + 1)
            self.window_weight = self.window_weight * DECAY + 1
        st.observe(choices, tokens)
        if self.drafter is not None:
            # how much of the prompt-lookup draft was accepted (a shared path may go further)
            agree = common_prefix_len(self.proposal[:accepted], tokens)
            self.drafter.record(len(self.proposal), agree)
            self.drafter.extend(tokens)

    def finish(self) -> None:
        if self.drafter is not None:
            self.drafter.finish()


def _source_of(tree: DraftTree, tokens: Sequence[int]) -> str:
    """The label of the walkable root child that the step's first token went through."""
    if tree.sources is None or not tokens:
        return ""
    for j, p in enumerate(tree.parents):
        if p == -1 and (tree.walkable is None or tree.walkable[j]) and tree.tokens[j] == tokens[0]:
            return tree.sources[j]
    return ""
