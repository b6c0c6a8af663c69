"""Batch-aware draft budget: drafts shrink as the live batch grows.

Prompt lookup pays off when a step's extra draft tokens are nearly free. With one
sequence that is true on any device (one token and eleven cost almost the same); with
many sequences in the batch, every draft token is extra work in a step that already
feeds one token per sequence, so full drafts for everyone make a loaded server slower
than plain decoding (llama.cpp measured 0.77x at 8 slots).

The rule: one step feeds at most ``max(token_budget, n)`` tokens, where ``n`` is the
number of live sequences and ``token_budget`` defaults to ``k + 1`` (what a single
sequence with a full draft of the configured ``prompt_lookup_num_tokens`` k feeds). So the batch shares ``token_budget - n`` draft
tokens: one sequence gets its whole draft, ``n`` sequences get about
``token_budget / n - 1`` each, and from ``n >= token_budget`` on the server decodes
plainly, costing exactly what plain decoding costs. The shared tokens are water-filled:
sequences proposing less than an equal share keep their whole proposal and the rest is
split among the others, so no budget is wasted on empty proposals.

With a step-cost table (``draft_length_policy="cost"``, :func:`allot_by_cost`), the
granted tokens are cut further to those expected to pay for themselves on this device:
the most valuable draft tokens (by each sequence's acceptance estimates) are kept while
they raise the expected tokens per unit of step cost above plain decoding's. On a GPU,
where a step's cost is nearly flat in the tokens it feeds, that keeps the whole budget;
on a CPU with a full batch it usually keeps nothing.

Cost: O(n log n) per step. The rule only shortens drafts, so it never changes output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..drafting.concurrency import Schedule, draft_len_for
from ..runtime.batch_costs import BatchStepCosts, single_sequence_prices


MARGIN = 1.1  # drafts must promise this many times plain decoding's tokens per unit of cost


def default_token_budget(k: int) -> int:
    """Tokens one step may feed by default: one sequence's full draft plus its own token."""
    return k + 1


def allot(proposal_lengths: Sequence[int], token_budget: int) -> list[int]:
    """Draft tokens granted per sequence, ``granted[i] <= proposal_lengths[i]``, with
    ``sum(granted) <= max(0, token_budget - len(proposal_lengths))``."""
    n = len(proposal_lengths)
    remaining = max(0, token_budget - n)
    granted = [0] * n
    order = sorted(range(n), key=lambda i: proposal_lengths[i])
    for j, i in enumerate(order):
        share = remaining // (n - j)
        granted[i] = min(proposal_lengths[i], share)
        remaining -= granted[i]
    return granted


def allot_by_cost(
    proposal_lengths: Sequence[int],
    rates: Sequence[tuple[float, float]],
    costs: Sequence[float],
    token_budget: int,
    batch_costs: BatchStepCosts | None = None,
    ragged: bool = False,
) -> list[int]:
    """The budget rule, then only the draft tokens expected to pay for themselves.

    ``rates[i] = (p0, p1)``: sequence i's chance that its first draft token is accepted,
    and that a later one is given all before it were (``decoding.draft_policy``'s
    estimates); draft token j (1-based) of sequence i is thus worth ``p0 * p1**(j-1)``
    expected tokens. ``costs[q]`` is the relative cost of a step feeding q tokens
    (the engine's step-cost table). Of the tokens :func:`allot` grants, the most valuable
    ``d`` are kept, ``d`` maximising ``(n + value of the d tokens) / step cost``, the
    expected tokens per unit of step cost; ``d = 0`` is plain decoding, and any ``d > 0``
    must beat it by :data:`MARGIN`, so the choice is expected to be faster than plain
    decoding on the same batch by that much or to be plain decoding. (The margin absorbs
    the errors of the estimates: acceptance rates start from a prior, and the table is
    one machine's measurement.) A step computes
    every sequence padded to the longest draft, so it costs what ``n`` sequences of
    ``1 + longest`` tokens cost, not what ``n + d`` tokens cost: one long draft in a full
    batch is priced as what it costs. That price comes from ``batch_costs`` (measured on
    batched steps) when given, else from ``costs[n * (1 + longest)]``. ``ragged``: the
    runner computes a batch's real rows only, not the padding (the CPU's C route), so a step
    of ``n + d`` rows in all is priced as the table's steps of that many rows (interpolated
    between the two whole numbers of rows per sequence around ``(n + d) / n``). Steps the
    table does not cover are not taken. Cost O(T log T), T the tokens granted by the budget rule.
    """
    n = len(proposal_lengths)
    granted = allot(proposal_lengths, token_budget)
    price = batch_costs.step if batch_costs is not None else single_sequence_prices(costs)
    if n == 0 or math.isinf(price(n, 1)):
        return [0] * n
    candidates: list[tuple[float, int]] = []
    for i, (length, (p0, p1)) in enumerate(zip(granted, rates)):
        value = p0
        for _ in range(length):
            candidates.append((value, i))
            value *= p1
    candidates.sort(key=lambda c: -c[0])  # stable: each sequence's tokens stay in order
    best_d, best_rate, gain = 0, MARGIN * n / price(n, 1), float(n)
    counts = [0] * n
    longest = 0
    for d, (value, i) in enumerate(candidates, 1):
        counts[i] += 1
        longest = max(longest, counts[i])
        cost = price(n, 1 + longest)  # the step pads every sequence to the longest draft
        if math.isinf(cost):
            break
        if ragged:  # it computes n + d rows
            per_seq = (n + d) / n
            lo = price(n, math.floor(per_seq))
            cost = lo + (per_seq - math.floor(per_seq)) * (price(n, math.ceil(per_seq)) - lo)
        gain += value
        rate = gain / cost
        if rate > best_rate:
            best_d, best_rate = d, rate
    out = [0] * n
    for _, i in candidates[:best_d]:
        out[i] += 1
    return out


@dataclass(frozen=True)
class BatchBudget:
    """The scheduler's per-step rule for chain drafts, passed into tree building
    (:func:`.step.step` asks each request what it plans, grants, then builds each tree once).

    ``token_budget``: :func:`allot`'s; with ``step_costs`` (and every request's proposer
    holding acceptance estimates) :func:`allot_by_cost` instead, priced by ``batch_costs``
    when given. ``max_concurrency``/``draft_len_schedule`` (TensorRT-LLM's speculation
    under load, :mod:`promptlookup.drafting.concurrency`) then cap every grant at the
    draft length for the live batch size, ``k`` being the configured one.
    """

    token_budget: int
    step_costs: Sequence[float] | None = None
    batch_costs: BatchStepCosts | None = None
    k: int = 0
    max_concurrency: int | None = None
    draft_len_schedule: Schedule | None = None
    ragged: bool = False  # the runner skips a batch's padding rows (allot_by_cost)

    def grant(self, wanted: Sequence[int], rates: Sequence[tuple[float, float] | None]) -> list[int]:
        """Draft tokens granted per request, ``granted[i] <= wanted[i]``. O(n log n)."""
        if self.step_costs and all(r is not None for r in rates):  # the budget, then what pays off here
            granted = allot_by_cost(wanted, rates, self.step_costs, self.token_budget,  # type: ignore[arg-type]
                                    self.batch_costs, self.ragged)
        else:
            granted = allot(wanted, self.token_budget)
        if self.max_concurrency is not None or self.draft_len_schedule is not None:
            cap = draft_len_for(len(wanted), self.k, self.max_concurrency, self.draft_len_schedule)
            granted = [min(g, cap) for g in granted]
        return granted
