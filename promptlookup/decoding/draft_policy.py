"""Cost-aware draft length: verify only as much of a draft as is expected to pay off.

A verification step that feeds ``q`` tokens costs ``cost[q]`` (relative to a plain
one-token step; measured once when the engine is built, see
:mod:`promptlookup.engine.step_costs`). On a GPU the table is nearly flat and full drafts
are free; on a CPU a wide step costs a multiple of a one-token step (docs/benchmarks.md),
so a weak draft slows decoding down. For each sequence this policy keeps
two acceptance estimates and picks the draft length ``d`` (a prefix of the drafter's
proposal) that maximises expected tokens per unit of cost::

    E(d) = 1 + p0 * (1 - p1**d) / (1 - p1)          (expected tokens from one step)
    d*   = argmax_{0 <= d <= len(proposal)} E(d) / cost[d + 1]

``p0`` is the chance that the first draft token is right, ``p1`` the chance that a later
one is right given that all before it were (copy runs make ``p1`` much larger than
``p0``). Both are Beta-smoothed, exponentially decayed counts over this sequence's own
history. Feedback comes from every step, including steps that verified nothing: the
target's own token tells whether the proposal's first token was right, so a sequence
whose drafts were switched off sees them recover as soon as they start matching.

The policy never changes *which* tokens are produced, only how many draft tokens each
step verifies. Cost per step: O(len(proposal)).
"""
from __future__ import annotations

from typing import Sequence

from ..drafting.tree import common_prefix_len

DECAY = 0.9  # weight of older observations per new one
PRIOR = (1.0, 1.0)  # Beta(successes, failures) prior for both estimates


class _Rate:
    __slots__ = ("hits", "misses")

    def __init__(self) -> None:
        self.hits, self.misses = PRIOR

    def add(self, hits: float, misses: float) -> None:
        self.hits = self.hits * DECAY + hits
        self.misses = self.misses * DECAY + misses

    @property
    def value(self) -> float:
        return self.hits / (self.hits + self.misses)


class DraftLengthPolicy:
    """Per-sequence draft length choice from a relative step-cost table.

    ``costs[q]`` is the relative cost of a step feeding ``q`` tokens, for ``q >= 1``
    (``costs[0]`` is unused); drafts longer than the table allows are cut.
    """

    def __init__(self, costs: Sequence[float]) -> None:
        if len(costs) < 2:
            raise ValueError("the cost table needs at least costs[1]")
        self.costs = list(costs)
        self.first = _Rate()
        self.later = _Rate()
        self.alt = _Rate()  # chance that another candidate starts right when the first does not

    @property
    def rates(self) -> tuple[float, float]:
        """``(p0, p1)``: the current acceptance estimates (first token; a later one given all
        before it were accepted)."""
        return self.first.value, self.later.value

    def choose(self, proposal: Sequence[int]) -> int:
        """How many leading tokens of ``proposal`` to verify."""
        limit = min(len(proposal), len(self.costs) - 2)
        if limit <= 0:
            return 0
        p0, p1 = self.first.value, self.later.value
        best_d, best = 0, 1.0 / self.costs[1]
        expected, run = 1.0, p0
        for d in range(1, limit + 1):
            expected += run
            run *= p1
            rate = expected / self.costs[d + 1]
            if rate > best:
                best_d, best = d, rate
        return best_d

    def observe(self, proposal: Sequence[int], verified: int, produced: Sequence[int]) -> None:
        """Learn from one step: ``verified`` tokens of ``proposal`` were offered, ``produced``
        (accepted draft tokens, then the target's own) came back."""
        if not proposal or not produced:
            return
        # How far the proposal agrees with what was produced (known up to len(produced)).
        agree = common_prefix_len(proposal, produced)
        known = min(len(produced), len(proposal))  # positions whose outcome we saw
        self.first.add(1.0 if agree >= 1 else 0.0, 0.0 if agree >= 1 else 1.0)
        if agree >= 1:
            later_hits = agree - 1
            later_miss = 1.0 if agree < known else 0.0
            self.later.add(later_hits, later_miss)

    def choose_candidates(self, candidates: Sequence[Sequence[int]], max_nodes: int) -> list[list[int]]:
        """The candidates to verify as one tree, each cut (best first), within ``max_nodes``.

        The first candidate gets the length :meth:`choose` picks. A further candidate that
        shares its first ``b`` tokens with the tree so far is worth something only if the
        target follows those ``b`` tokens and then leaves the tree: probability ``1 - p0``
        for ``b = 0``, else ``p0 * p1**(b-1) * (1 - p1)``; it is then right with the
        probability ``alt`` (how often another candidate starts right when the first does
        not), divided by the number of candidates already branching there, and its ``m``
        new tokens bring ``1 + p1 + ... + p1**(m-1)`` tokens. It joins while the expected
        tokens per unit of step cost rise. Cost: O(total tokens * candidates).
        """
        if not candidates:
            return []
        d = min(self.choose(candidates[0]), max_nodes)
        if d == 0:
            return []
        chosen = [list(candidates[0][:d])]
        prefixes = {tuple(chosen[0][:i]) for i in range(1, d + 1)}
        p0, p1, alt = self.first.value, self.later.value, self.alt.value
        expected = 1.0 + sum(p0 * p1**i for i in range(d))
        nodes = d
        branching: dict[int, int] = {}  # depth -> candidates already branching there
        for cand in candidates[1:]:
            cut = list(cand[:d])
            shared = 0
            while shared < len(cut) and tuple(cut[: shared + 1]) in prefixes:
                shared += 1
            new = len(cut) - shared
            if new == 0 or nodes + new > max_nodes or nodes + new + 1 >= len(self.costs):
                continue
            leave = (1 - p0) if shared == 0 else p0 * p1 ** (shared - 1) * (1 - p1)
            rivals = branching.get(shared, 1)
            gain = leave * alt / rivals * (1 + sum(p1**i for i in range(1, new)))
            if (expected + gain) / self.costs[nodes + new + 1] <= expected / self.costs[nodes + 1]:
                continue
            chosen.append(cut)
            prefixes.update(tuple(cut[:i]) for i in range(1, len(cut) + 1))
            branching[shared] = rivals + 1
            expected += gain
            nodes += new
        return chosen

    def observe_alternatives(self, candidates: Sequence[Sequence[int]], produced: Sequence[int]) -> None:
        """Learn ``alt`` from one step's candidates and the tokens it produced."""
        if len(candidates) < 2 or not produced or not candidates[0]:
            return
        if candidates[0][0] == produced[0]:
            return
        hit = any(c and c[0] == produced[0] for c in candidates[1:])
        self.alt.add(1.0 if hit else 0.0, 0.0 if hit else 1.0)
