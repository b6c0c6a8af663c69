"""``--output_csv`` and ``--output_npy``: token ids in TensorRT-LLM ``run.py``'s layout.

One row per prompt (beam width 1): the prompt's tokens, then the generated tokens, padded
with ``end_id`` to ``longest prompt + max_output_len`` columns -- the ``output_ids``
tensor TensorRT-LLM's runners return, flattened to ``[batch * beams, length]``. The CSV
holds comma-separated integers, one row per line; the ``.npy`` an int32 array. Both are
written atomically (temporary file, then rename).
"""
from __future__ import annotations

import csv
import io
from typing import Sequence

import numpy as np

from ..fsutil import atomic_write_bytes, atomic_write_text


def output_id_rows(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], max_output_len: int,
                   end_id: int) -> np.ndarray:
    width = max(len(p) for p in prompts) + max_output_len
    rows = np.full((len(prompts), width), end_id, dtype=np.int32)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        seq = list(p) + list(o)
        rows[i, : len(seq)] = seq
    return rows


def write_csv(path: str, rows: np.ndarray) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows.tolist())
    atomic_write_text(path, buf.getvalue())


def write_npy(path: str, rows: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, rows)
    atomic_write_bytes(path, buf.getvalue())
