"""The sweep plot: speedup, tokens per step and acceptance rate against k, one line per drafter.

Rendered headless with matplotlib's Agg backend into PNG bytes (the caller writes them
atomically). Left panel: speedup over plain greedy decoding (dashed line at 1x, the best
setting starred); middle: tokens per verification step; right: accepted/drafted.
Solid lines are the fixed-size drafters, dashed lines their adaptive variants.
"""
from __future__ import annotations

import io
from typing import Any, Sequence


def sweep_plot_png(rows: Sequence[dict[str, Any]], *, best: dict[str, Any] | None = None, title: str = "") -> bytes:
    """PNG bytes of the sweep figure for ``rows`` (as built by :func:`sweep.sweep_row`)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI

    series: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    panels = (("speedup", "speedup over plain (x)"), ("tokens_per_step", "tokens per verification step"),
              ("acceptance_rate", "acceptance (accepted / drafted)"))
    fig = Figure(figsize=(16, 5), dpi=100)
    axes = fig.subplots(1, len(panels))
    for ax, (key, label) in zip(axes, panels):
        for name, points in series.items():
            points = sorted((p for p in points if p.get(key) is not None), key=lambda p: p["k"])
            if not points:
                continue
            ax.plot([p["k"] for p in points], [p[key] for p in points], marker="o",
                    linestyle="--" if points[0]["adaptive"] else "-", label=name)
        if key == "speedup":
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="plain greedy")
            if best is not None and best.get("speedup") is not None:
                ax.plot([best["k"]], [best["speedup"]], marker="*", markersize=18, color="gold",
                        markeredgecolor="black", linestyle="none", label=f"best: {best['label']}")
        ax.set_xlabel("prompt_lookup_num_tokens (k)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ks = sorted({r["k"] for r in rows})
        if ks:
            ax.set_xticks(ks)
    axes[0].legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
