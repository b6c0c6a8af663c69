"""C implementations of the drafters' hot paths, with the pure-Python ones as fallback.

The C modules (``_pool`` for :mod:`..pool`, ``_suffix_automaton`` for
:mod:`..suffix_automaton`) implement the same classes with the same drafts; the pure-Python
modules are the fallback where the C ones are not built, and the property tests run both
against the specifications (:mod:`..pool_spec` for the pool) and brute-force references. :func:`load` returns a built module, or ``None`` when it was not
built (no compiler: see :mod:`.build`) or when ``PROMPTLOOKUP_DRAFTING=python`` asks for the
pure-Python code. :func:`implementation` names what :func:`make_drafter` uses, so
benchmarks and ``--output_json`` can say it.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NamedTuple

ENV = "PROMPTLOOKUP_DRAFTING"  # "python" forces the pure-Python drafters
MODULES = ("pool", "suffix_automaton")
IMPLEMENTATIONS = ("auto", "c", "python")


class DraftingClasses(NamedTuple):
    """The classes a drafter builds its state from (C or pure Python, same behaviour)."""

    NGramPool: type
    PoolCursor: type
    SuffixAutomaton: type
    Matcher: type
    implementation: dict[str, str]


def load(name: str) -> ModuleType | None:
    """The built C module for ``name`` (one of :data:`MODULES`), or ``None``."""
    if name not in MODULES:
        raise ValueError(f"unknown native module {name!r}")
    if os.environ.get(ENV, "").strip().lower() == "python":
        return None
    try:
        return importlib.import_module(f"{__name__}._{name}")
    except ImportError:
        return None


def implementation() -> dict[str, str]:
    """What ``implementation="auto"`` uses: ``{"pool": "c" | "python", "suffix_automaton": ...}``."""
    return drafting_classes().implementation


def drafting_classes(implementation: str = "auto") -> DraftingClasses:
    """The pool and suffix-automaton classes for ``implementation``.

    ``"auto"``: each C module where built, else its pure-Python twin; ``"c"``: the C modules,
    ``RuntimeError`` if one is not built; ``"python"``: the pure-Python modules.
    """
    from .. import pool as py_pool
    from .. import suffix_automaton as py_sam

    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    mods = {}
    for name, fallback in (("pool", py_pool), ("suffix_automaton", py_sam)):
        built = None if implementation == "python" else load(name)
        if built is None and implementation == "c":
            raise RuntimeError(f"the C module _{name} is not built (or {ENV}=python is set); "
                               f"run `python -m promptlookup.drafting.native.build`")
        mods[name] = built or fallback
    pool, sam = mods["pool"], mods["suffix_automaton"]
    return DraftingClasses(pool.NGramPool, pool.PoolCursor, sam.SuffixAutomaton, sam.Matcher,
                           {name: "python" if mod in (py_pool, py_sam) else "c" for name, mod in mods.items()})
