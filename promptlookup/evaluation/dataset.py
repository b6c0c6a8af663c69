"""Articles and reference summaries for the summarization benchmark.

Two sources, both returning the same :class:`Article` records in a deterministic order:

- a local file (``--dataset_path``): JSON, JSONL, Parquet or CSV with ``article`` and
  ``highlights`` columns (an ``id`` column is optional), read with :mod:`datasets`;
- the Hugging Face hub's CNN/DailyMail 3.0.0 test split, when no path is given. When the
  hub cannot be used (offline mode, or no network) and the split is not already cached,
  loading fails at once with a :class:`UserError` that asks for ``--dataset_path``; the
  reachability probe is bounded by a few seconds, so nothing hangs.

Like TensorRT-LLM's ``summarize.py``, the rows are shuffled with the random seed before
the first ``limit`` are taken; the order therefore depends only on (source, seed).
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from ..errors import UserError, one_line

HUB_DATASET = "abisee/cnn_dailymail"  # the hub's canonical home of "cnn_dailymail"
HUB_CONFIG = "3.0.0"
HUB_SPLIT = "test"
INPUT_KEY = "article"
REFERENCE_KEY = "highlights"
_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
_TRUE = {"1", "on", "yes", "true"}
_PROBE_TIMEOUT_S = 4.0


@dataclass(frozen=True)
class Article:
    """One evaluation example: the text to summarize and its human reference summary."""

    id: str
    article: str
    highlights: str


def load_articles(path: str | None, *, limit: int | None = None, seed: int | None = 0) -> list[Article]:
    """Load, validate, shuffle (when ``seed`` is not None) and keep the first ``limit`` rows.

    Raises :class:`UserError` for a missing or unreadable file, an unsupported format,
    missing columns, empty or null texts, an empty dataset, or an unusable hub.
    """
    dataset = _load_local(path) if path else _load_hub()
    missing = [c for c in (INPUT_KEY, REFERENCE_KEY) if c not in dataset.column_names]
    source = path or f"{HUB_DATASET} {HUB_CONFIG}"
    if missing:
        raise UserError(
            f"dataset {source} has no {' or '.join(repr(c) for c in missing)} column "
            f"(columns: {', '.join(dataset.column_names) or 'none'}); "
            f"it needs '{INPUT_KEY}' and '{REFERENCE_KEY}'"
        )
    if len(dataset) == 0:
        raise UserError(f"dataset {source} has no rows; pass a file with at least one article")
    if seed is not None:
        dataset = dataset.shuffle(seed=seed)
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    ids = dataset["id"] if "id" in dataset.column_names else [str(i) for i in range(len(dataset))]
    articles = []
    for row, (ident, text, ref) in enumerate(zip(ids, dataset[INPUT_KEY], dataset[REFERENCE_KEY])):
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"dataset {source}: row {ident!s} has an empty or missing '{INPUT_KEY}'")
        if not isinstance(ref, str):
            raise UserError(f"dataset {source}: row {ident!s} has no '{REFERENCE_KEY}' text")
        articles.append(Article(id=str(ident), article=text, highlights=ref))
    return articles


def dataset_file_in(path: str) -> str:
    """``--dataset_dir``: a data file as is, or the one data file a folder holds.

    A folder must hold exactly one ``.jsonl`` file, or else exactly one file of the other
    supported types (``.json``, ``.parquet``, ``.csv``); anything else is a one-line error
    naming what was found.
    """
    p = Path(path)
    if not p.is_dir():
        return path  # a file (or nothing): _load_local reports what is wrong with it
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in _FORMATS)
    preferred = [f for f in files if f.suffix.lower() == ".jsonl"] or files
    if len(preferred) != 1:
        found = ", ".join(f.name for f in preferred[:4]) or "none"
        raise UserError(f"--dataset_dir {path} must hold exactly one .jsonl (or .json/.parquet/.csv) data file, "
                        f"found {found}; pass the file itself with --dataset_path")
    return str(preferred[0])


def _load_local(path: str):
    file = Path(path)
    if not file.is_file():
        raise UserError(f"dataset file {path} does not exist; pass an existing --dataset_path")
    fmt = _FORMATS.get(file.suffix.lower())
    if fmt is None:
        raise UserError(f"dataset file {path} has an unsupported extension; use .json, .jsonl, .parquet or .csv")
    if file.stat().st_size == 0:
        raise UserError(f"dataset {path} has no rows; pass a file with at least one article")
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(fmt, data_files=str(file.resolve()), split="train")
    except Exception as exc:  # datasets wraps parse errors in several exception types
        if "no data" in str(exc):  # a header-only CSV, an empty JSON list, ...
            raise UserError(f"dataset {path} has no rows; pass a file with at least one article") from None
        reason = one_line(exc, 200)
        raise UserError(f"cannot read dataset {path} as {fmt}: {reason}") from None


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_reachable(timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the hub endpoint opens within ``timeout_s``.

    The probe (DNS included) runs in a daemon thread so a stuck resolver cannot hang us.
    """
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    return bool(ok)


def _load_hub():
    import datasets

    hint = "pass --dataset_path with a local JSON/JSONL/Parquet/CSV file that has 'article' and 'highlights' columns"
    offline = _offline()
    if not offline and not hub_reachable():
        raise UserError(f"the Hugging Face hub is unreachable, so {HUB_DATASET} {HUB_CONFIG} cannot be downloaded; {hint}")
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(HUB_DATASET, HUB_CONFIG, split=HUB_SPLIT)
    except Exception as exc:
        why = "offline mode is on (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) and it is not cached" if offline else (
            one_line(exc, 160)
        )
        raise UserError(f"cannot load {HUB_DATASET} {HUB_CONFIG} from the Hugging Face hub: {why}; {hint}") from None
