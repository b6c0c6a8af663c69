"""Loading articles from local files and the hub, and the one-line errors for bad input."""
from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest

from promptlookup.errors import UserError
from promptlookup.evaluation.dataset import Article, load_articles

from .conftest import ARTICLES, article_rows, write_jsonl

EXPECTED = [Article(i, a, h) for i, a, h in ARTICLES]


def _csv(path: Path, rows: list[dict], fields=("id", "article", "highlights")) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_formats_load_in_file_order_without_seed(tmp_path, fmt):
    writer = {"jsonl": write_jsonl, "csv": _csv, "parquet": _parquet}[fmt]
    path = writer(tmp_path / f"d.{fmt}", article_rows())
    assert load_articles(str(path), seed=None) == EXPECTED


def test_shuffle_is_seeded_and_limit_applies(jsonl_dataset):
    a = load_articles(str(jsonl_dataset), seed=3)
    b = load_articles(str(jsonl_dataset), seed=3)
    assert a == b and sorted(x.id for x in a) == sorted(x.id for x in EXPECTED)
    assert load_articles(str(jsonl_dataset), seed=3, limit=2) == a[:2]


def test_missing_id_column_gets_row_numbers(tmp_path):
    path = _csv(tmp_path / "d.csv", article_rows(), fields=("article", "highlights"))
    assert [a.id for a in load_articles(str(path), seed=None)] == ["0", "1", "2", "3"]


def test_missing_column(tmp_path):
    path = _csv(tmp_path / "d.csv", article_rows(), fields=("id", "article"))
    with pytest.raises(UserError, match="highlights"):
        load_articles(str(path))


@pytest.mark.parametrize("content", ["", "id,article,highlights\n"])
def test_empty_dataset(tmp_path, content):
    path = tmp_path / ("d.jsonl" if not content else "d.csv")
    path.write_text(content)
    with pytest.raises(UserError, match="no rows"):
        load_articles(str(path))


def test_missing_file_and_bad_extension(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_articles(str(tmp_path / "absent.jsonl"))
    bad = tmp_path / "d.txt"
    bad.write_text("x")
    with pytest.raises(UserError, match="extension"):
        load_articles(str(bad))


def test_unparsable_file(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(UserError, match="cannot read"):
        load_articles(str(path))


def test_hub_in_offline_mode_fails_fast_with_a_hint(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(UserError, match="--dataset_path"):
        load_articles(None)
    assert time.monotonic() - start < 30  # generous: it must not hang on the network


def test_unreachable_hub_fails_fast_with_a_hint(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(UserError, match="unreachable.*--dataset_path"):
        load_articles(None)
