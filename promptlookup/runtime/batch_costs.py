"""The relative cost of a batched step, as measured when the engine was built.

A continuous-batching server feeds ``n`` live sequences in one step, each padded to the
longest draft, so a step with drafts costs what ``n`` sequences of ``q = 1 + longest``
tokens cost. A single-sequence table (``costs[q]`` for one sequence feeding ``q``
tokens) only approximates that: attention runs over each sequence's own context, and
the batched layout pays for padding and per-sequence masks. :class:`BatchStepCosts`
holds the batched figures: ``step(n, q)`` is the cost of a step in which each of ``n``
sequences feeds ``q`` tokens, relative to one sequence feeding one token.

Stored in the engine's ``config.json`` under ``step_costs.<device>.batched`` as
``{"batch_sizes": [1, 2, 4, ...], "costs": [[0.0, c(1), c(2), ...], ...]}``; row ``i`` may
be shorter than the others (steps of more than a set number of rows are not measured),
and a step beyond a row's end is priced as infinitely dear (never chosen).

Invariants: ``batch_sizes`` ascending, starting at 1; ``costs[i][0] == 0``; each row is
non-decreasing in ``q``. Between two measured batch sizes, costs are interpolated linearly
in ``n``; beyond the largest, scaled by ``n / largest`` (every sequence adds its rows).
Cost of ``step``: O(log B).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

PriceFn = Callable[[int, int], float]  # (sequences, tokens each) -> relative step cost


@dataclass(frozen=True)
class BatchStepCosts:
    batch_sizes: tuple[int, ...]
    costs: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.batch_sizes or self.batch_sizes[0] != 1 or list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError(f"batch sizes must ascend from 1, got {list(self.batch_sizes)}")
        if len(self.costs) != len(self.batch_sizes) or any(len(row) < 2 for row in self.costs):
            raise ValueError("one cost row of at least two entries per batch size is needed")

    def _row(self, i: int, q: int) -> float:
        row = self.costs[i]
        return row[q] if q < len(row) else math.inf

    def step(self, n: int, q: int) -> float:
        """The relative cost of a step in which each of ``n >= 1`` sequences feeds ``q >= 1`` tokens."""
        sizes = self.batch_sizes
        i = bisect.bisect_right(sizes, n) - 1  # sizes[i] <= n
        if sizes[i] == n:
            return self._row(i, q)
        if i == len(sizes) - 1:
            return self._row(i, q) * n / sizes[i]
        lo, hi = self._row(i, q), self._row(i + 1, q)
        if math.isinf(lo) or math.isinf(hi):
            return math.inf
        t = (n - sizes[i]) / (sizes[i + 1] - sizes[i])
        return lo + t * (hi - lo)

    def to_json(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.batch_sizes), "costs": [[round(c, 4) for c in row] for row in self.costs]}

    @classmethod
    def from_json(cls, entry: Any) -> "BatchStepCosts | None":
        """The table stored in ``config.json``, or ``None`` if absent or malformed."""
        if not isinstance(entry, dict):
            return None
        try:
            sizes = tuple(int(n) for n in entry["batch_sizes"])
            costs = tuple(tuple(float(c) for c in row) for row in entry["costs"])
            return cls(sizes, costs)
        except (KeyError, TypeError, ValueError):
            return None


def single_sequence_prices(costs: Sequence[float]) -> PriceFn:
    """Batched steps priced from a single-sequence table: ``n`` sequences of ``q`` tokens
    as one sequence of ``n * q`` (an approximation: it misses per-sequence attention)."""
    def price(n: int, q: int) -> float:
        rows = n * q
        return costs[rows] if rows < len(costs) else math.inf

    return price
