"""User-facing errors.

Every entry point reports bad input the same way: one line on stderr that names the bad
value and the fix, exit code 2, no traceback. Library code raises :class:`UserError`;
only the CLI layer (:func:`run_cli`) turns it into an exit code.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, NoReturn

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as shells report for a C program


class UserError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""


def one_line(exc: BaseException | str, limit: int | None = 300) -> str:
    """An exception (or text) as one line, whitespace runs folded, cut to ``limit`` characters
    (``None``: whole); the exception's class name when it has no message."""
    text = " ".join(str(exc).split()) or (type(exc).__name__ if isinstance(exc, BaseException) else "")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def fail(message: str) -> NoReturn:
    """Raise a :class:`UserError` with ``message`` (a convenience for guard clauses)."""
    raise UserError(message)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _interrupted_late(signum: int, frame: object) -> None:
    """SIGINT after the work is done (e.g. while the interpreter shuts down): no traceback."""
    try:
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> NoReturn:
    """Run ``main(argv)`` and exit, the same way for every script.

    - 0 on success (or ``main``'s code);
    - 2 with one line ``error: ...`` on :class:`UserError`;
    - 130 with ``error: interrupted`` on Ctrl-C, also when it lands after ``main`` returned
      (while the interpreter shuts down), never with a traceback;
    - 141 (128 + SIGPIPE), silently, when stdout is a pipe whose reader has gone
      (``run.py --streaming | head``): the output nobody reads is dropped.
    """
    try:
        code = main(argv)
        sys.stdout.flush()  # a closed pipe shows here rather than at exit
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _interrupted_late)
    except UserError as exc:
        message = one_line(exc, limit=None)  # always exactly one line
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(EXIT_BROKEN_PIPE)
    sys.exit(code or 0)
