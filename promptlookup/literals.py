"""Safe parsing of the bracketed list values that TensorRT-LLM's flags take
(``--prompt_lookup_config "[10,2,[0]]"``, ``--lookahead_config "[4,3,4]"``)."""
from __future__ import annotations

from typing import Any

from .errors import UserError


def parse_list_literal(text: str, flag: str, hint: str, items: int | None = None) -> list[Any]:
    """``text`` as a Python list literal (``ast.literal_eval``: no code runs), with ``items``
    elements when given; bad input is a one-line :class:`UserError` naming ``flag``."""
    import ast

    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise UserError(f"{flag} {text!r} is malformed; {hint}") from None
    if not isinstance(value, (list, tuple)):
        raise UserError(f"{flag} {text!r} is not a list; {hint}")
    if items is not None and len(value) != items:
        raise UserError(f"{flag} {text!r} must have {items} items; {hint}")
    return list(value)
