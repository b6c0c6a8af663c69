"""A grid of prompt-lookup settings run on the same articles with our engine.

The grid is ``prompt_lookup_num_tokens`` (k) x ``max_matching_ngram_size`` (n) for the
pool drafter (TensorRT-LLM's semantics), plus the longest-match drafter (which has no n)
and the adaptive variants of both. Each point is compared with our plain greedy run on
the same articles: speedup (tokens/s ratio, timed batches only), tokens per verification
step, acceptance rate, output identity, ROUGE-1.

The best setting is the fastest one whose outputs all match plain decoding (under greedy
decoding a mismatch means the setting is wrong to deploy); if none qualifies, the fastest.

Cost: one full run over the articles per grid point; ``len(ks) * (len(ns) + 1)`` runs per
adaptive/non-adaptive pair of modes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..defaults import DEFAULT_WORKFLOW
from ..drafting.base import DraftConfig
from ..errors import UserError
from .metrics import ContenderReport

SWEEP_MODES = ("pool", "longest", "pool-adaptive", "longest-adaptive")
DEFAULT_SWEEP_K = (2, 4, 6, 8, 10)
DEFAULT_SWEEP_N = (1, 2, 3)
SWEEP_COLUMNS = ("label", "mode", "adaptive", "k", "n", "tokens_per_s", "speedup", "tokens_per_step",
                 "acceptance_rate", "accepted", "drafted", "identical", "compared", "rouge1", "latency_s")


@dataclass(frozen=True)
class SweepPoint:
    """One grid point; ``n`` is None for the longest-match drafter."""

    mode: str  # "pool", "longest" or "lookahead"
    adaptive: bool
    k: int
    n: int | None
    lookahead: tuple[int, int, int] | None = None  # [W, N, G] of a Lookahead point (mode "lookahead")

    @property
    def label(self) -> str:
        if self.lookahead is not None:
            return "lookahead [{},{},{}]".format(*self.lookahead)
        text = f"{self.mode} k={self.k}" + (f" n={self.n}" if self.n is not None else "")
        return text + (" adaptive" if self.adaptive else "")

    @property
    def series(self) -> str:
        """The plot line this point belongs to (all k of one mode/n/adaptive)."""
        if self.lookahead is not None:
            return "lookahead"
        text = self.mode + (f" n={self.n}" if self.n is not None else "")
        return text + (" adaptive" if self.adaptive else "")

    def draft_config(self, base: DraftConfig = DraftConfig()) -> DraftConfig:
        """``base`` at this point; a point of another mode than the pool keeps the pool's own
        settings at their defaults (that mode does not read them, and refuses others)."""
        if self.mode != "pool":
            from ..drafting.drafter import POOL_ONLY_FIELDS

            base = replace(base, **{name: getattr(DraftConfig(), name) for name in POOL_ONLY_FIELDS})
        return replace(base, prompt_lookup_num_tokens=self.k, mode=self.mode, adaptive=self.adaptive,
                       max_matching_ngram_size=self.n if self.n is not None else base.max_matching_ngram_size)


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"2,4,6"`` -> ``[2, 4, 6]``; positive, de-duplicated, order kept."""
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise UserError(f"{flag} takes comma-separated positive integers, got {text!r}") from None
        if value < 1:
            raise UserError(f"{flag} values must be positive, got {value}")
        if value not in values:
            values.append(value)
    if not values:
        raise UserError(f"{flag} is empty; give comma-separated positive integers such as 2,4,6")
    return values


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in SWEEP_MODES]
    if bad or not modes:
        raise UserError(f"--sweep_modes takes a comma-separated subset of {', '.join(SWEEP_MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


def sweep_grid(ks: Sequence[int], ns: Sequence[int], modes: Sequence[str] = SWEEP_MODES) -> list[SweepPoint]:
    """All grid points, grouped by mode then k then n."""
    points = []
    for mode_name in modes:
        mode, _, suffix = mode_name.partition("-")
        adaptive = suffix == "adaptive"
        for k in ks:
            for n in (ns if mode == "pool" else (None,)):
                points.append(SweepPoint(mode=mode, adaptive=adaptive, k=k, n=n))
    return points


def sweep_row(point: SweepPoint, report: ContenderReport) -> dict[str, Any]:
    return {
        "label": point.label, "mode": point.mode, "adaptive": point.adaptive, "k": point.k, "n": point.n,
        "lookahead": list(point.lookahead) if point.lookahead else None,
        "series": point.series, "tokens_per_s": report.tokens_per_s, "speedup": report.speedup,
        "tokens_per_step": report.tokens_per_step, "acceptance_rate": report.acceptance_rate,
        "accepted": report.accepted, "drafted": report.drafted, "identical": report.identical,
        "compared": report.compared, "rouge1": report.rouge["rouge1"], "latency_s": report.latency_s,
    }


def best_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Fastest row whose outputs all match plain decoding; else the fastest; None if untimed."""
    timed = [r for r in rows if r.get("speedup") is not None]
    exact = [r for r in timed if r.get("compared") and r.get("identical") == r.get("compared")]
    pool = exact or timed
    if not pool:
        return None
    return max(pool, key=lambda r: (r["speedup"], r.get("acceptance_rate") or 0.0))


def deploy_hint(row: dict[str, Any], device_ids: Sequence[int] = (0,), workflow: str = DEFAULT_WORKFLOW) -> str:
    """How to use a sweep row: the run.py/summarize.py flags (``--prompt_lookup_config`` plus
    drafter flags, or ``--lookahead_config``), with ``--workflow`` where the sweep ran another
    loop than the default."""
    prefix = "" if workflow == DEFAULT_WORKFLOW else f"--workflow {workflow} "
    if row.get("lookahead"):
        return prefix + '--lookahead_config "[{},{},{}]"'.format(*row["lookahead"])
    n = row["n"] if row["n"] is not None else DraftConfig().max_matching_ngram_size
    devices = ",".join(str(d) for d in device_ids)
    hint = prefix + f'--prompt_lookup_config "[{row["k"]},{n},[{devices}]]"'
    if row["mode"] != "pool":
        hint += f" --drafter_mode {row['mode']}"
    if row["adaptive"]:
        hint += " --adaptive_draft"
    return hint
