"""User-facing errors.

Every entry point reports bad input the same way: one line on stderr that names the bad
value and the fix, exit code 2, no traceback. Library code raises :class:`UserError`;
only the CLI layer (:func:`run_cli`) turns it into an exit code.
"""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

EXIT_USAGE = 2


class UserError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""


def fail(message: str) -> NoReturn:
    """Raise a :class:`UserError` with ``message`` (a convenience for guard clauses)."""
    raise UserError(message)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> NoReturn:
    """Run ``main(argv)`` and exit: 0 on success, 2 with one line on :class:`UserError`."""
    try:
        code = main(argv)
    except UserError as exc:
        message = " ".join(str(exc).split())  # always exactly one line
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
