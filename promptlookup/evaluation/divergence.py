"""Where a speculative run departs from plain decoding, and whether that is a near-tie.

In float32 greedy prompt lookup is token-identical to plain greedy decoding (the tests
check it). In bfloat16 or float16 it need not be: a verification step scores a position
in a forward pass over several tokens, plain decoding in a pass over one, and the two
passes round differently. Write ``z`` for the plain run's logits at some position and
``z' = z + e`` for the speculative run's logits at the same position with the same
prefix. Plain picks ``a = argmax z``; if the speculative run picks ``b != a``, then::

    z_a - z_b <= (z_a - z'_a) + (z'_b - z_b) <= 2 * max|e|

so the plain run's top-2 gap there, ``z_a - max_{c != a} z_c <= z_a - z_b``, is at most
``2 * max|e|``: the runs can part only at a *near-tie*. :func:`first_divergence` reports
the first position where two runs differ, the plain run's top-2 gap there, and the
largest ``max|e|`` seen at the positions before it (where both runs had the same prefix),
measured in units in the last place (ulps) of the run's dtype at the position's largest
logit magnitude. docs/sampling.md gives the bound the tests hold bfloat16 runs to.

:func:`record_run` records the logits a single-sequence run chose each of its tokens
from. It wraps the runner's ``forward`` for the duration of the run (one forward pass per
step of one sequence, checked) and copies every logit row to the host: a tool for tests
and analysis, not for timed runs.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from ..decoding import StepEvent, generate
from ..runtime.torch_runner import TorchRunner


@dataclass
class RecordedRun:
    """A one-sequence run: its tokens and, for each, the logits it was chosen from.

    ``logits[i]`` (float32, ``[vocab]``) is the row that chose ``tokens[i]``; its prefix is
    the prompt plus ``tokens[:i]``. ``verified[i]``: that row was a draft position of a
    verification step (not the first row of a step). ``accepted``: draft tokens kept.
    """

    tokens: list[int]
    logits: list[torch.Tensor]
    verified: list[bool]
    accepted: int
    dtype: torch.dtype


@contextmanager
def _recorded_forward(runner: TorchRunner) -> Iterator[list[torch.Tensor]]:
    """Every logits tensor ``runner.forward`` returns, copied to the host, while inside."""
    calls: list[torch.Tensor] = []
    forward = runner.forward

    def recording(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = forward(*args, **kwargs)
        calls.append(out.detach().float().cpu())
        return out

    runner.forward = recording  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del runner.forward  # back to the class's method


def record_run(runner: TorchRunner, prompt: Sequence[int], **generate_kwargs: Any) -> RecordedRun:
    """Run :func:`~promptlookup.decoding.generate` on one prompt (same keyword arguments)
    and return its tokens with the logits each was chosen from. Raises ``ValueError`` if
    the run did not take exactly one forward pass per step (e.g. the V1 workflow's plain
    steps), since rows could then not be matched to positions."""
    events: list[StepEvent] = []
    with _recorded_forward(runner) as calls:
        (result,) = generate(runner, [list(prompt)], on_step=events.append, **generate_kwargs)
    if len(calls) != len(events):
        raise ValueError(f"{len(calls)} forward passes for {len(events)} steps; record_run needs one per step")
    logits: list[torch.Tensor] = []
    verified: list[bool] = []
    for rows, event in zip(calls, events):
        # Row j scores the position after the step's first j tokens; for j <= accepted
        # those tokens were accepted, so the row's prefix is the run's own output.
        for j in range(len(event.tokens)):
            logits.append(rows[j])
            verified.append(j > 0)
    return RecordedRun(result.output_ids, logits, verified, result.accepted, runner.model.dtype)


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers at ``|value|`` (its unit in the last place)."""
    tiny = torch.finfo(dtype).tiny
    magnitude = max(abs(value), tiny)
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


def top2_gap(row: torch.Tensor) -> float:
    """Largest logit minus the second largest."""
    top = torch.topk(row.float(), 2).values
    return float(top[0] - top[1])


@dataclass
class Comparison:
    """Two runs of one prompt compared position by position (see the module docstring).

    ``position``: the first index where the tokens differ (``None``: identical outputs,
    up to the shorter length). ``gap_ulps``: the plain run's top-2 gap there, in ulps of
    its largest logit magnitude. ``compared``: positions before ``position`` scored by
    both runs with the same prefix; ``compared_verified``: of those, how many the second
    run scored in a verification step's draft rows. ``max_error_ulps``: the largest
    ``max|z - z'|`` over those positions, each in ulps of that position's largest logit.
    """

    position: int | None
    plain_token: int | None = None
    other_token: int | None = None
    gap: float | None = None
    gap_ulps: float | None = None
    compared: int = 0
    compared_verified: int = 0
    max_error_ulps: float = 0.0
    max_pair_error_ulps: float = 0.0
    errors_ulps: list[float] = field(default_factory=list, repr=False)
    pair_errors_ulps: list[float] = field(default_factory=list, repr=False)

    def describe(self) -> str:
        where = "identical" if self.position is None else (
            f"first divergence at {self.position}: plain {self.plain_token}, other {self.other_token}, "
            f"plain top-2 gap {self.gap:.4g} ({self.gap_ulps:.2f} ulps)")
        return (f"{where}; {self.compared} positions compared ({self.compared_verified} verified), "
                f"largest logit difference {self.max_error_ulps:.2f} ulps")


def first_divergence(plain: RecordedRun, other: RecordedRun) -> Comparison:
    """Compare ``other`` (e.g. a speculative run) with ``plain`` decoding of the same prompt."""
    n = min(len(plain.tokens), len(other.tokens))
    position = next((i for i in range(n) if plain.tokens[i] != other.tokens[i]), None)
    errors: list[float] = []
    pair_errors: list[float] = []
    verified = 0
    for i in range(n if position is None else position):
        z, z2 = plain.logits[i], other.logits[i]
        unit = ulp(float(z.abs().max()), plain.dtype)
        e = (z2 - z).abs()
        errors.append(float(e.max()) / unit)
        pair_errors.append(float(e[torch.topk(z, 2).indices].sum()) / unit)
        verified += other.verified[i]
    out = Comparison(position, compared=len(errors), compared_verified=verified,
                     max_error_ulps=max(errors, default=0.0), max_pair_error_ulps=max(pair_errors, default=0.0),
                     errors_ulps=errors, pair_errors_ulps=pair_errors)
    if position is not None:
        row = plain.logits[position]
        out.plain_token, out.other_token = plain.tokens[position], other.tokens[position]
        out.gap = top2_gap(row)
        out.gap_ulps = out.gap / ulp(float(row.abs().max()), plain.dtype)
    return out
