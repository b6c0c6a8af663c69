"""Presenting results: a fixed-width table, the ``--check_accuracy`` verdict, JSON/CSV text.

Nothing here runs a model; it formats :class:`~promptlookup.evaluation.metrics.ContenderReport`
objects (or plain row dicts) so the same numbers reach the terminal, JSON and CSV.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any, Sequence

from .metrics import ContenderReport


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned others, columns padded to their widest cell."""
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


CONTENDER_HEADERS = ("contender", "R-1", "R-2", "R-L", "R-Lsum", "latency s", "tokens", "tok/s", "speedup",
                     "tok/step", "accepted/drafted", "identical")


def contender_row(r: ContenderReport) -> list[str]:
    acceptance = "-"
    if r.accepted is not None and r.drafted is not None and r.drafted > 0:
        acceptance = f"{r.accepted}/{r.drafted} ({100 * r.accepted / r.drafted:.0f}%)"
    elif r.accepted is not None and r.speculative:
        acceptance = f"{r.accepted}/?"
    return [
        r.name,
        _fmt(r.rouge["rouge1"]), _fmt(r.rouge["rouge2"]), _fmt(r.rouge["rougeL"]), _fmt(r.rouge["rougeLsum"]),
        _fmt(r.latency_s, ".3f") if r.timed_batches else "-",
        str(r.generated_tokens) if r.timed_batches else "-",
        _fmt(r.tokens_per_s, ".1f"),
        f"{r.speedup:.2f}x" if r.speedup is not None else "-",
        _fmt(r.tokens_per_step),
        acceptance,
        f"{r.identical}/{r.compared}" if r.compared is not None else "-",
    ]


def contenders_table(reports: Sequence[ContenderReport]) -> str:
    return format_table(CONTENDER_HEADERS, [contender_row(r) for r in reports])


@dataclass(frozen=True)
class AccuracyVerdict:
    """``--check_accuracy``: every checked contender's ROUGE-1 must exceed the threshold."""

    threshold: float
    failures: tuple[tuple[str, float], ...]  # (contender, rouge1) at or under the threshold

    @property
    def passed(self) -> bool:
        return not self.failures

    def message(self) -> str:
        if self.passed:
            return f"accuracy check passed: ROUGE-1 above {self.threshold:g} for every contender"
        worst = ", ".join(f"{name} {score:.2f}" for name, score in self.failures)
        return f"accuracy check failed: ROUGE-1 not above the threshold {self.threshold:g} ({worst})"

    def to_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "passed": self.passed,
                "failures": [{"contender": n, "rouge1": s} for n, s in self.failures]}


def check_accuracy(reports: Sequence[ContenderReport], threshold: float) -> AccuracyVerdict:
    """Like TensorRT-LLM: pass when ROUGE-1 (x100) is strictly greater than ``threshold``."""
    failures = tuple((r.name, r.rouge["rouge1"]) for r in reports if not r.rouge["rouge1"] > threshold)
    return AccuracyVerdict(threshold=threshold, failures=failures)


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """CSV text of ``rows`` restricted to ``columns`` (missing values empty)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    return out.getvalue()
