"""The C modules' build: a missing compiler is a note, not a failure; the report says what runs."""
from unittest import mock

import pytest

from promptlookup.drafting import make_drafter
from promptlookup.drafting.base import DraftConfig
from promptlookup.drafting.native import ENV, build, drafting_classes, implementation


def test_no_compiler_is_a_note_and_exit_0(capsys):
    with mock.patch.object(build.shutil, "which", return_value=None):
        assert build.compiler() is None
        assert build.main([]) == 0
        assert "pure-Python" in capsys.readouterr().out
        assert build.main(["--has_compiler"]) == 0
        assert capsys.readouterr().out.strip() == "0"


def test_every_source_has_a_module_name():
    names = {build.module_path(s).name.split(".")[0] for s in build.sources()}
    assert names == {"_pool", "_suffix_automaton", "_gemv", "_step_ops"}
    assert {s.name for s in build.sources((build.HERE,))} == {"pool.c", "suffix_automaton.c"}  # what --sanitize builds


def test_the_kernels_fall_back_to_a_build_without_openmp(monkeypatch, tmp_path):
    """Where the compiler has no OpenMP, the kernels' second flag set (no -fopenmp) is used."""
    source = tmp_path / "k.c"
    source.write_text("int x;\n")
    monkeypatch.setitem(build.FOLDERS, tmp_path, build.FOLDERS[build.KERNELS])
    tried = []

    def fake_build_one(cc, src, link=None, *, cflags=build.CFLAGS, directory=None):
        tried.append(cflags)
        if "-fopenmp" in cflags:
            raise RuntimeError("cc ...\ncc: error: unrecognized command-line option '-fopenmp'")
        return tmp_path / "_k.so"

    monkeypatch.setattr(build, "build_one", fake_build_one)
    assert build.build_best(["cc"], source) == tmp_path / "_k.so"
    assert ["-fopenmp" in flags for flags in tried] == [True, False]


def test_forcing_python_is_reported_and_honoured(monkeypatch):
    monkeypatch.setenv(ENV, "python")
    assert implementation() == {"pool": "python", "suffix_automaton": "python"}
    assert drafting_classes().implementation == {"pool": "python", "suffix_automaton": "python"}
    with pytest.raises(RuntimeError, match="not built"):
        drafting_classes("c")
    drafter = make_drafter(DraftConfig(), implementation="python")
    assert type(drafter.new_request([1, 2, 1], 100).mode.cursor).__module__ == "promptlookup.drafting.pool"


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="implementation must be one of"):
        drafting_classes("fortran")


def test_link_flags_per_platform():
    assert build.link_flag_candidates("linux") == [["-shared"]]
    darwin = build.link_flag_candidates("darwin")
    assert all("dynamic_lookup" in flags for flags in darwin)  # Python's symbols resolve at load time there
    assert darwin[0][0] == "-bundle"


def test_a_toolchain_that_cannot_link_falls_back_in_one_line(monkeypatch, capsys):
    """As on macOS without -undefined dynamic_lookup: a note, exit 0 even with --strict."""
    monkeypatch.setattr(build, "compiler", lambda: ["cc"])
    build._toolchain.cache_clear()
    failed = build.subprocess.CompletedProcess([], 1, "", "ld: error: undefined symbols: _PyModule_Create2\nmore")
    monkeypatch.setattr(build, "_compile", lambda command: failed)
    try:
        assert build.toolchain() is None
        assert build.main(["--strict"]) == 0
        out = capsys.readouterr().out
        assert len(out.strip().splitlines()) == 1
        assert "cannot link a Python extension" in out and "undefined symbols" in out and "pure-Python" in out
        assert build.main(["--has_compiler"]) == 0
        assert capsys.readouterr().out.strip() == "0"
    finally:
        build._toolchain.cache_clear()


def test_a_change_of_flags_or_header_is_noticed(monkeypatch, tmp_path):
    """The stamp beside a module hashes the command and the sources, not only mtimes."""
    chain = build.toolchain()
    if chain is None:
        pytest.skip("no C toolchain here")
    cc, link = chain
    source = build.sources()[0]
    target = build.module_path(source)
    if not build.up_to_date(cc, link, source):
        pytest.skip("the C modules are not built (or not current) in this checkout")
    assert not build.up_to_date(cc, link, source, cflags=[*build.CFLAGS, "-DPLD_OTHER"])
    assert not build.up_to_date(["other-cc"], link, source)
    stamp = build.stamp_path(target)
    assert stamp.read_text().strip() == build.build_hash(build._command(cc, build.CFLAGS, link, source), source)
    monkeypatch.setattr(build, "HEADERS", ("common.h", "missing.h"))
    assert not build.up_to_date(cc, link, source)  # the set of headers is part of the hash


def test_a_module_that_fails_to_compile_is_one_line_without_strict(monkeypatch, capsys, tmp_path):
    chain = build.toolchain()
    if chain is None:
        pytest.skip("no C toolchain here")
    broken = tmp_path / "broken.c"
    broken.write_text("#include <Python.h>\nint oops( { }\n")
    monkeypatch.setattr(build, "sources", lambda: [broken])
    assert build.main([]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "building broken.c failed" in err[0] and "pure-Python" in err[0]
    assert build.main(["--strict"]) == 2
    assert not list(tmp_path.glob("_broken*"))  # nothing half-written
