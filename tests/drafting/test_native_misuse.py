"""The C pool survives misuse: no crash, a Python exception or the right answer.

Each case once crashed or read freed memory (found under AddressSanitizer). ``make
test-asan`` runs this file against sanitizer builds of the C modules (``PLD_NATIVE_DIR``
names the folder holding them); otherwise it tests the normal build.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .implementations import require_native

TEXT = [5, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2]  # "1 2" recurs: a draft exists


def native(name: str) -> ModuleType:
    """The C module ``name``: from ``$PLD_NATIVE_DIR`` (sanitizer builds), else the package's."""
    folder = os.environ.get("PLD_NATIVE_DIR")
    if not folder:
        return require_native(name)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    path = Path(folder) / f"_{name}{suffix}"
    key = f"_pld_sanitized_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(f"_{name}", path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


@pytest.fixture
def pool_module() -> ModuleType:
    return native("pool")


def expected(mod: ModuleType, text: list[int], max_seq_len: int = 100) -> tuple[list[int], int]:
    cursor = mod.PoolCursor(mod.NGramPool(3, 2, True, True))
    return cursor.propose(list(text), max_seq_len)


def new_cursor(mod: ModuleType):
    return mod.PoolCursor(mod.NGramPool(3, 2, True, True))


def test_expected_draft_is_not_empty(pool_module):
    assert expected(pool_module, TEXT)[0]


def test_uninitialised_cursor_raises(pool_module):
    cursor = pool_module.PoolCursor.__new__(pool_module.PoolCursor)
    with pytest.raises(ValueError, match="not initialised"):
        cursor.propose(TEXT, 100)
    assert cursor.pool is None
    del cursor  # deallocating it must not crash either


def test_uninitialised_pool_is_refused_by_a_cursor(pool_module):
    pool = pool_module.NGramPool.__new__(pool_module.NGramPool)
    assert pool.num_patterns() == 0
    with pytest.raises(ValueError, match="not initialised"):
        pool_module.PoolCursor(pool)


class LyingLength:
    """A sequence whose ``__len__`` disagrees with the items it yields."""

    def __init__(self, items: list[int], claimed: int) -> None:
        self.items, self.claimed = items, claimed

    def __len__(self) -> int:
        return self.claimed

    def __iter__(self):
        return iter(self.items)


@pytest.mark.parametrize("claimed", [0, 3, 40, 10_000])
def test_a_length_that_disagrees_with_the_items_uses_the_items(pool_module, claimed):
    cursor = new_cursor(pool_module)
    assert cursor.propose(LyingLength(TEXT, claimed), 100) == expected(pool_module, TEXT)
    assert cursor.prev_len == len(TEXT)


class Resizing:
    """A token whose ``__index__`` resizes the list being read."""

    def __init__(self, value: int, text: list, grow_by: int) -> None:
        self.value, self.text, self.grow_by = value, text, grow_by

    def __index__(self) -> int:
        if self.grow_by < 0:
            self.text.clear()
        else:
            self.text.extend([0] * self.grow_by)  # forces the list to reallocate
        return self.value


@pytest.mark.parametrize("grow_by", [-1, 1, 10_000])
def test_index_that_resizes_the_list_reads_a_snapshot(pool_module, grow_by):
    text: list = list(TEXT)
    text[4] = Resizing(TEXT[4], text, grow_by)
    cursor = new_cursor(pool_module)
    assert cursor.propose(text, 100) == expected(pool_module, TEXT)
    # the next call sees the list as the resizing left it
    if grow_by < 0:
        with pytest.raises(ValueError, match="shrank"):
            cursor.propose(text, 100_000)


def test_index_that_creates_cursors_on_the_same_pool(pool_module):
    pool = pool_module.NGramPool(3, 2, True, True)
    made = []

    class MakesCursors:
        def __index__(self) -> int:
            made.extend(pool_module.PoolCursor(pool) for _ in range(64))  # moves the pool's text table
            return 9

    text: list = list(TEXT)
    text[4] = MakesCursors()
    cursor = pool_module.PoolCursor(pool)
    assert cursor.propose(text, 100) == expected(pool_module, TEXT)
    assert len(made) == 64


def test_index_that_reenters_propose_is_refused(pool_module):
    cursor = new_cursor(pool_module)

    class Reenters:
        def __index__(self) -> int:
            cursor.propose([1, 2, 3, 4, 5, 6], 100)
            return 9

    text: list = list(TEXT)
    text[4] = Reenters()
    with pytest.raises(RuntimeError, match="changed while"):
        cursor.propose(text, 100)


def test_non_integer_tokens_raise_and_change_nothing(pool_module):
    cursor = new_cursor(pool_module)
    with pytest.raises(TypeError):
        cursor.propose([1, 2, "3", 4], 100)
    with pytest.raises(OverflowError):
        cursor.propose([1, 2, 1 << 70], 100)
    assert cursor.prev_len == -1
    assert cursor.propose(TEXT, 100) == expected(pool_module, TEXT)


def test_max_seq_len_index_that_resizes_the_text(pool_module):
    text = list(TEXT)

    class Budget:
        def __index__(self) -> int:
            text.clear()
            return 100

    cursor = new_cursor(pool_module)
    assert cursor.propose(text, Budget()) == ([], 0)  # the text was empty by the time it was read
