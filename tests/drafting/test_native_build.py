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
    assert names == {"_pool", "_suffix_automaton"}


def test_forcing_python_is_reported_and_honoured(monkeypatch):
    monkeypatch.setenv(ENV, "python")
    assert implementation() == {"pool": "python", "suffix_automaton": "python"}
    assert drafting_classes().implementation == {"pool": "python", "suffix_automaton": "python"}
    with pytest.raises(RuntimeError, match="not built"):
        drafting_classes("c")
    drafter = make_drafter(DraftConfig(), implementation="python")
    assert type(drafter.new_request([1, 2, 1], 100).cursor).__module__ == "promptlookup.drafting.pool"


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="implementation must be one of"):
        drafting_classes("fortran")
