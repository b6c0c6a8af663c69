"""The sweep grid, best-setting choice, deploy hint, CSV and plot."""
from __future__ import annotations

import csv
import io

import pytest

from promptlookup.drafting.base import DraftConfig
from promptlookup.errors import UserError
from promptlookup.evaluation.plot import sweep_plot_png
from promptlookup.evaluation.report import to_csv
from promptlookup.evaluation.sweep import (SWEEP_COLUMNS, SweepPoint, best_row, deploy_hint, parse_int_list,
                                           parse_modes, sweep_grid)


def test_grid_covers_modes_k_and_n():
    points = sweep_grid([2, 4], [1, 3], ["pool", "longest", "pool-adaptive"])
    assert len(points) == 2 * 2 + 2 + 2 * 2
    assert SweepPoint("pool", False, 4, 3) in points
    assert SweepPoint("longest", False, 2, None) in points
    assert all(p.adaptive for p in points if p.label.endswith("adaptive"))
    cfg = SweepPoint("longest", True, 6, None).draft_config(DraftConfig(max_matching_ngram_size=3))
    assert (cfg.mode, cfg.adaptive, cfg.prompt_lookup_num_tokens, cfg.max_matching_ngram_size) == ("longest", True, 6, 3)


def test_list_parsing():
    assert parse_int_list("2, 4,4,6", "--sweep_k") == [2, 4, 6]
    for bad in ("", "a", "0", "2,-1"):
        with pytest.raises(UserError, match="--sweep_k"):
            parse_int_list(bad, "--sweep_k")
    assert parse_modes("longest,pool") == ["longest", "pool"]
    with pytest.raises(UserError, match="--sweep_modes"):
        parse_modes("pool,fast")


def _row(label, mode, k, n, speedup, identical=5, compared=5, adaptive=False, acc=0.5):
    series = mode + (f" n={n}" if n else "") + (" adaptive" if adaptive else "")
    return {"label": label, "mode": mode, "adaptive": adaptive, "k": k, "n": n, "series": series,
            "tokens_per_s": 10.0 * (speedup or 1), "speedup": speedup, "tokens_per_step": 1.5,
            "acceptance_rate": acc, "accepted": 5, "drafted": 10, "identical": identical, "compared": compared,
            "rouge1": 20.0, "latency_s": 1.0}


def test_best_prefers_exact_outputs_then_speed():
    rows = [_row("a", "pool", 2, 1, 1.4), _row("b", "pool", 4, 2, 1.9, identical=4), _row("c", "longest", 4, None, 1.6)]
    assert best_row(rows)["label"] == "c"  # b is faster but changed an output
    assert best_row([_row("b", "pool", 4, 2, 1.9, identical=4)])["label"] == "b"  # fallback: fastest
    assert best_row([_row("u", "pool", 2, 1, None)]) is None


def test_deploy_hint():
    assert deploy_hint(_row("a", "pool", 6, 3, 1.2)) == '--prompt_lookup_config "[6,3,[0]]"'
    hint = deploy_hint(_row("c", "longest", 8, None, 1.2, adaptive=True), device_ids=[0, 1])
    assert hint == '--prompt_lookup_config "[8,2,[0,1]]" --drafter_mode longest --adaptive_draft'
    lookahead = dict(_row("l", "lookahead", 0, None, 1.3), lookahead=[4, 3, 4])
    assert deploy_hint(lookahead) == '--lookahead_config "[4,3,4]"'
    assert deploy_hint(lookahead, workflow="v1") == '--workflow v1 --lookahead_config "[4,3,4]"'
    assert deploy_hint(_row("a", "pool", 6, 3, 1.2), workflow="v1") == '--workflow v1 --prompt_lookup_config "[6,3,[0]]"'


def test_csv_and_plot():
    rows = [_row(f"pool k={k} n={n}", "pool", k, n, 1 + k / 10 + n / 100) for k in (2, 4) for n in (1, 2)]
    rows += [_row(f"longest k={k} adaptive", "longest", k, None, 1.1, adaptive=True) for k in (2, 4)]
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows, SWEEP_COLUMNS))))
    assert [r["label"] for r in parsed] == [r["label"] for r in rows] and parsed[0]["k"] == "2"
    png = sweep_plot_png(rows, best=best_row(rows), title="t")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
