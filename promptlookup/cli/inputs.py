"""Prompts for run.py: ``--input_text`` (repeatable) or ``--input_file``.

``--input_file`` formats (kept stable; scripts depend on them):

- ``.txt``: the whole file is one text prompt;
- ``.json``: a list of prompts, each a string (text) or a list of token ids;
- ``.csv``: one prompt of token ids per row (comma separated), as TensorRT-LLM;
- ``.npy``: token ids; a 1-D array is one prompt, a 2-D array one prompt per row, with
  trailing ``end_id`` padding removed, as TensorRT-LLM pads such files.

Text prompts are tokenized (wrapped in the chat template with ``--use_chat_template``);
token-id prompts are used exactly as given: no chat template, no BOS (so
``--use_chat_template`` with only token-id prompts is refused: it would change nothing).
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import UserError
from ..text import encode_text

INPUT_FILE_TYPES = (".txt", ".json", ".csv", ".npy")


@dataclass
class Prompt:
    ids: list[int]
    text: str | None  # None for token-id prompts


def _ids(row: Sequence[Any], where: str) -> list[int]:
    try:
        ids = [int(x) for x in row]
    except (TypeError, ValueError):
        raise UserError(f"{where}: token ids must be integers") from None
    if any(isinstance(x, bool) or (isinstance(x, float) and not float(x).is_integer()) for x in row):
        raise UserError(f"{where}: token ids must be integers")
    return ids


def check_input_file(path: str) -> Path:
    """``path`` names an existing file of a supported type (cheap; run before loading a model)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"--input_file {path} is a directory; name a file ({', '.join(INPUT_FILE_TYPES)})")
    if not p.is_file():
        raise UserError(f"--input_file {path} does not exist")
    suffix = p.suffix.lower()
    if suffix not in INPUT_FILE_TYPES:
        raise UserError(f"--input_file {path}: unsupported type {suffix or '(none)'}; use one of {', '.join(INPUT_FILE_TYPES)}")
    if suffix != ".npy":
        _read_utf8(p)  # a text file that is not UTF-8 is refused now, not after the model loads
    return p


def _read_utf8(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--input_file {p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UserError(f"cannot read --input_file {p}: {exc.strerror}") from None


def read_input_file(path: str, end_id: int | None) -> list[str | list[int]]:
    p = check_input_file(path)
    suffix = p.suffix.lower()
    if suffix == ".txt":
        return [_read_utf8(p)]
    if suffix == ".json":
        try:
            data = json.loads(_read_utf8(p))
        except ValueError as exc:
            raise UserError(f"--input_file {path} is not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise UserError(f"--input_file {path} must hold a JSON list of prompts (strings or lists of token ids)")
        out: list[str | list[int]] = []
        for i, item in enumerate(data):
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, list):
                out.append(_ids(item, f"{path} item {i}"))
            else:
                raise UserError(f"{path} item {i} must be a string or a list of token ids")
        return out
    if suffix == ".csv":
        rows = [[c for c in row if c.strip() != ""] for row in csv.reader(io.StringIO(_read_utf8(p), newline=""))]
        return [_ids(row, f"{path} row {i + 1}") for i, row in enumerate(rows) if row]
    if suffix == ".npy":
        import numpy as np

        try:
            arr = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise UserError(f"--input_file {path} is not a readable .npy file ({exc})") from None
        if arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.integer):
            raise UserError(f"--input_file {path} must be a 1-D or 2-D integer array of token ids")
        rows = [arr] if arr.ndim == 1 else list(arr)
        out = []
        for row in rows:
            ids = row.tolist()
            while arr.ndim == 2 and end_id is not None and ids and ids[-1] == end_id:
                ids.pop()
            out.append(ids)
        return out
    raise AssertionError(suffix)  # check_input_file admits only INPUT_FILE_TYPES


def check_prompt_sources(input_text: list[str] | None, input_file: str | None) -> None:
    """Exactly one of ``--input_text`` and ``--input_file`` (cheap: run.py checks it before loading)."""
    if input_text and input_file:
        raise UserError("give either --input_text or --input_file, not both")
    if not input_text and not input_file:
        raise UserError("no prompt given; pass --input_text TEXT or --input_file PATH")


def collect_prompts(
    input_text: list[str] | None,
    input_file: str | None,
    tokenizer: Any,
    use_chat_template: bool,
    end_id: int | None,
) -> list[Prompt]:
    check_prompt_sources(input_text, input_file)
    raw: list[str | list[int]] = list(input_text or []) or (read_input_file(input_file, end_id) if input_file else [])
    if not raw:  # a file that holds none (check_prompt_sources refused no source at all)
        raise UserError(f"--input_file {input_file} holds no prompt; put at least one in it")
    prompts = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            if not item.strip():
                raise UserError(f"prompt {i} is empty; give some text")
            prompts.append(Prompt(encode_text(tokenizer, item, use_chat_template), item))
        else:
            if not item:
                raise UserError(f"prompt {i} is empty; give at least one token id")
            prompts.append(Prompt(item, None))
    if use_chat_template and all(p.text is None for p in prompts):
        raise UserError(f"--use_chat_template wraps text prompts, but --input_file {input_file} holds only token ids, "
                        "which are used as given; drop --use_chat_template (or give the prompts as text)")
    return prompts
