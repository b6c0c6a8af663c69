"""Atomic output: nothing half-written is ever left where the user asked for output.

Directories are assembled in a hidden sibling temporary directory and renamed into place
only when complete; files are written to a sibling temporary file and renamed. A failure
at any point removes the temporary and leaves an existing target untouched.

Nothing the toolkit did not write is ever deleted: every output directory carries a small
manifest (:data:`MANIFEST`, naming its kind and the files written), and an existing directory
is replaced only when it is empty or carries the manifest of the same kind and holds no file
beyond those it lists (a note a user added to a checkpoint folder is never deleted). Outputs that are, contain or
lie inside their inputs are refused (:func:`check_output_dir`), before anything is loaded.
A write that the file system refuses (full, over quota, read-only, not permitted) becomes one
line naming the path and the fix (:class:`UserError`), after the temporary is removed.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

from .errors import UserError


# what the file system, not the program, refused: reported in one line, not as a traceback
_REFUSED_WRITES = {errno.ENOSPC: "free space there", errno.EDQUOT: "free space there (over quota)",
                   errno.EROFS: "it is read-only", errno.EACCES: "it is not writable",
                   errno.EPERM: "it is not writable"}


def _refused_write(exc: BaseException, where: str | os.PathLike[str], fix: str) -> UserError | None:
    """The one-line error for a write the file system refused (``None`` for any other error)."""
    why = _REFUSED_WRITES.get(exc.errno) if isinstance(exc, OSError) else None
    if why is None:
        return None
    return UserError(f"cannot write {exc.filename or where}: {exc.strerror}; {why}, or {fix}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


MANIFEST = ".promptlookup-output.json"
"""Marks a directory this toolkit wrote; only such a directory (or an empty one) is replaced."""


def _manifest(directory: Path) -> tuple[str | None, set[str] | None]:
    """The ``kind`` recorded in ``directory``'s manifest (None if it has no readable one) and
    the files it lists (None for a manifest from before the list was kept)."""
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(data, dict) or data.get("tool") != "promptlookup" or not isinstance(data.get("kind"), str):
        return None, None
    files = data.get("files")
    return data["kind"], set(files) if isinstance(files, list) else None


def _files(directory: Path) -> list[str]:
    """Every file under ``directory`` (links included, not followed), as sorted relative POSIX paths."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if p.is_file() or p.is_symlink())


def _probe_writable(directory: Path, what: str) -> None:
    """Create and remove a temporary entry in ``directory``: the only check root cannot skip."""
    if not directory.is_dir():
        raise UserError(f"{what}: {directory} is not a directory; choose a writable path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".promptlookup-probe-", dir=directory))
    except OSError as exc:
        raise UserError(f"{what}: cannot write in {directory} ({exc.strerror}); choose a writable path") from None


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def ensure_writable(path: str | os.PathLike[str], what: str, *, directory: bool = False,
                    inputs: Sequence[tuple[str, str | os.PathLike[str] | None]] = ()) -> None:
    """Fail early, creating nothing, if ``path`` cannot be written later (a file, or a folder),
    or if writing it would replace one of the run's ``inputs`` (``(flag, path)`` pairs, None
    skipped): the same file, or a file inside an input folder (an engine's ``config.json``).

    ``what`` names the flag in the message. Cost: a few ``stat`` calls and one temporary
    entry created and removed in the nearest existing ancestor.
    """
    target = Path(path)
    resolved = target.resolve()
    for flag, other in inputs:
        where = None if other is None else _relation(resolved, Path(other).resolve())
        if where in ("is", "lies inside"):
            raise UserError(f"{what} {path} {where} {flag} {other}, which this run reads; name another file")
    if target.exists() and target.is_dir() != directory:
        kind = "a directory" if target.is_dir() else "a file"
        fix = "name a directory" if directory else "name a file (e.g. one inside it)"
        raise UserError(f"{what} {path} is {kind}; {fix}")
    _probe_writable(_existing_ancestor(target.resolve().parent), f"{what} {path}")


def _relation(output: Path, other: Path) -> str | None:
    if output == other:
        return "is"
    if other in output.parents:
        return "lies inside"
    if output in other.parents:
        return "contains"
    return None


def check_output_dir(
    target: str | os.PathLike[str],
    kind: str,
    *,
    flag: str = "--output_dir",
    inputs: Sequence[tuple[str, str | os.PathLike[str]]] = (),
    legacy_names: Collection[str] = (),
) -> Path:
    """Refuse, creating nothing, an output directory that must not be replaced; return it resolved.

    Rules (each a one-line :class:`UserError` naming the folder and the fix):

    - the output is not an input, does not lie inside one and does not contain one
      (``inputs`` holds ``(flag, path)`` pairs);
    - it is not the working directory or one of its ancestors;
    - an existing output is a directory that is empty or carries this toolkit's
      :data:`MANIFEST` for the same ``kind`` (``legacy_names``: file names whose sole
      presence also marks an output written before manifests existed) and no file beyond
      those the manifest lists;
    - its location can be written.

    Cost: O(files of the existing output) plus :func:`ensure_writable`'s probe.
    """
    resolved = Path(target).resolve()
    for in_flag, in_path in inputs:
        relation = _relation(resolved, Path(in_path).resolve())
        if relation is not None:
            raise UserError(f"{flag} {target} {relation} {in_flag} {in_path}; the output replaces its folder as a "
                            f"whole, so choose a folder outside the input")
    if _relation(resolved, Path.cwd().resolve()) in ("is", "contains"):
        raise UserError(f"{flag} {target} is the working directory (or contains it); the output replaces its "
                        f"folder as a whole, so name a new folder, e.g. {flag} {Path(target) / kind.split()[-1]}")
    if resolved.exists():
        if not resolved.is_dir():
            raise UserError(f"{flag} {target} exists and is not a directory; remove it or choose another path")
        entries = sorted(p.name for p in resolved.iterdir())
        found, written = _manifest(resolved) if MANIFEST in entries else (None, None)
        if entries and found != kind and not (found is None and legacy_names and set(entries) <= set(legacy_names)):
            if found is not None:
                raise UserError(f"{flag} {target} holds a {found} written by promptlookup, not the {kind} "
                                f"this command writes; choose another folder")
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise UserError(f"{flag} {target} already holds files promptlookup did not write ({shown}); "
                            f"choose a new or empty folder, or delete it yourself")
        added = [] if written is None else [f for f in _files(resolved) if f != MANIFEST and f not in written]
        if added:
            shown = ", ".join(added[:3]) + (", ..." if len(added) > 3 else "")
            raise UserError(f"{flag} {target} holds the {kind} promptlookup wrote, but it now also holds files it did not "
                            f"write ({shown}), which replacing it would delete; move them out, or choose another "
                            "folder")
    ensure_writable(resolved, flag, directory=True)
    return resolved


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back until the block is done, then deliver it (main thread only).

    The Python-level handler is swapped rather than the signal masked: in a process with
    other threads (PyTorch's), the kernel may hand the signal to any of them.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        if received:
            signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def atomic_output_dir(
    target: str | os.PathLike[str],
    kind: str,
    *,
    flag: str = "--output_dir",
    inputs: Sequence[tuple[str, str | os.PathLike[str]]] = (),
    legacy_names: Collection[str] = (),
) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` when the block succeeds.

    ``target`` must pass :func:`check_output_dir` (checked on entry and again just before
    the replacement, so files that appeared meanwhile are never deleted). The new output
    carries a :data:`MANIFEST` naming ``kind``. An existing ``target`` is replaced only
    after the new one is complete; an interrupt during the replacement is delivered after it.
    """
    checks = dict(flag=flag, inputs=inputs, legacy_names=legacy_names)
    resolved = check_output_dir(target, kind, **checks)
    parent = resolved.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag} {target}: cannot create {parent} ({exc.strerror}); choose a writable path") from None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{resolved.name}.tmp-", dir=parent))
    except OSError as exc:
        raise (_refused_write(exc, parent, f"choose another {flag}") or exc) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; outputs are not
        yield tmp
        atomic_write_json(tmp / MANIFEST, {"tool": "promptlookup", "kind": kind, "version": 2, "files": _files(tmp)})
        check_output_dir(target, kind, **checks)
        with _deferred_interrupts():
            old = None
            if resolved.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{resolved.name}.old-", dir=parent))
                os.rename(resolved, old / "x")
            os.rename(tmp, resolved)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        refused = _refused_write(exc, tmp, f"choose another {flag}")
        if refused is not None:
            raise refused from None
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
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        refused = _refused_write(exc, path, "choose another path")
        if refused is not None:
            raise refused from None
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
