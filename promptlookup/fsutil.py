"""Atomic output: nothing half-written is ever left where the user asked for output.

Directories are assembled in a hidden sibling temporary directory and renamed into place
only when complete; files are written to a sibling temporary file and renamed. A failure
at any point removes the temporary and leaves an existing target untouched.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _writable_parent(target: Path) -> Path:
    parent = target.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output location {parent}: {exc.strerror}; choose a writable path") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output location {parent} is not writable; choose a writable path")
    if target.exists() and not target.is_dir():
        raise UserError(f"output path {target} exists and is not a directory; remove it or choose another path")
    return parent


@contextlib.contextmanager
def atomic_output_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` when the block succeeds.

    An existing ``target`` is replaced only after the new one is complete.
    """
    target = Path(target)
    parent = _writable_parent(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; outputs are not
        yield tmp
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=parent))
            os.rename(target, old / "x")
        os.rename(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via a sibling temporary file and an atomic rename."""
    path = Path(path)
    parent = path.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=parent)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}; choose a writable path") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; outputs are not
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
