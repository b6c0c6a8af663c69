"""The two implementations of the drafters' data structures, for tests that must hold for both.

The C modules are skipped when not built, except under ``PLD_REQUIRE_NATIVE=1`` (set by
``make test`` where a compiler exists), where a missing module fails the test instead.
"""
from __future__ import annotations

import os
from types import ModuleType

import pytest

from promptlookup.drafting.native import load

NAMES = ("python", "c")  # values of make_drafter's ``implementation``


def require_native(name: str) -> ModuleType:
    """The built C module ``name`` ("pool" or "suffix_automaton"); skip or fail without it."""
    module = load(name)
    if module is None:
        reason = (f"C module promptlookup.drafting.native._{name} is not built "
                  "(run `python -m promptlookup.drafting.native.build`) or PROMPTLOOKUP_DRAFTING=python")
        if os.environ.get("PLD_REQUIRE_NATIVE") == "1":
            pytest.fail(reason + "; PLD_REQUIRE_NATIVE=1 requires it")
        pytest.skip(reason)
    return module


def require(implementation: str) -> str:
    """``implementation`` after checking that it can run here (see :func:`require_native`)."""
    if implementation == "c":
        require_native("pool")
        require_native("suffix_automaton")
    return implementation
