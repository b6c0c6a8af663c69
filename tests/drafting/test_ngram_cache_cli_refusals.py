"""python -m promptlookup.cli.ngram_cache refuses, in one line and writing nothing: token ids
outside the vocabulary, outputs over inputs, and flags no selected mode or input reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from promptlookup.cli.ngram_cache import main
from promptlookup.drafting import NgramCache, TokenizerIdentity
from promptlookup.errors import UserError, run_cli

IDENT = TokenizerIdentity.from_vocab({f"t{i}": i for i in range(16)}, "toy")
SEQ = [[1, 2, 3, 1, 2, 3, 1, 2, 4]]


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(main, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _refused(argv, capsys) -> str:
    code, out, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def _tokens(path: Path, sequences=SEQ) -> Path:
    path.write_text(json.dumps({"tokenizer": IDENT.to_json(), "sequences": sequences}))
    return path


def test_create_refuses_token_ids_outside_the_vocabulary(tmp_path, capsys):
    inp = _tokens(tmp_path / "t.json", [[1, 2, 16, 3]])
    line = _refused(["create", inp, "--output", tmp_path / "c.ngc"], capsys)
    assert "16" in line and "vocabulary of 16" in line
    assert not (tmp_path / "c.ngc").exists()
    line = _refused(["stats", inp], capsys)
    assert "token id 16" in line


def test_load_refuses_a_cache_with_token_ids_outside_its_vocabulary(tmp_path, capsys):
    cache = NgramCache(2)
    cache.update([1, 2, 99, 1, 2])
    cache.save(tmp_path / "bad.ngc", IDENT)  # written directly, past the CLI's check
    with pytest.raises(UserError, match="token id 99.*16 tokens"):
        NgramCache.load(tmp_path / "bad.ngc")
    with pytest.raises(UserError, match="token id 99"):
        NgramCache.load(tmp_path / "bad.ngc", expect=IDENT)
    assert "token id 99" in _refused(["inspect", tmp_path / "bad.ngc"], capsys)
    # a valid cache still loads
    good = NgramCache(2)
    good.update([1, 2, 15])
    good.save(tmp_path / "good.ngc", IDENT)
    assert NgramCache.load(tmp_path / "good.ngc", expect=IDENT)[0].max_token() == 15


def test_outputs_never_replace_inputs(tmp_path, capsys):
    inp = _tokens(tmp_path / "t.json")
    cache = tmp_path / "c.ngc"
    assert _run(["create", inp, "--output", cache], capsys)[0] == 0
    other = tmp_path / "d.ngc"
    assert _run(["create", inp, "--output", other], capsys)[0] == 0
    before = {p: p.read_bytes() for p in (inp, cache, other)}
    cases = [
        ["create", inp, "--output", inp],
        ["inspect", cache, "--output_json", cache],
        ["stats", inp, "--output_json", inp],
        ["stats", inp, "--static_cache", cache, "--output_json", cache],
        ["merge", cache, other, "--output", cache],
        ["merge", cache, other, "--output", other],
    ]
    for argv in cases:
        assert "which this run reads" in _refused(argv, capsys), argv
    assert {p: p.read_bytes() for p in before} == before


def test_stats_pool_only_flags_apply_to_pool_configurations(tmp_path, capsys):
    inp = _tokens(tmp_path / "t.json")
    code, out, err = _run(["stats", inp, "--k", "4", "--n", "2", "--no-is_keep_all", "--no-is_use_oldest",
                           "--max_match_len", "8", "--output_json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    assert "pool k=4 n=2" in out and "longest k=4" in out
    rows = json.loads((tmp_path / "s.json").read_text())["results"]
    assert [r["config"]["mode"] for r in rows] == ["pool", "longest"]
    assert rows[1]["config"]["max_match_len"] == 8 and rows[0]["config"]["max_match_len"] == 64


@pytest.mark.parametrize("extra, flag", [
    (["--modes", "longest", "--n", "2"], "--n"),
    (["--modes", "pool", "--max_match_len", "8"], "--max_match_len"),
    (["--modes", "longest", "--no-is_keep_all"], "--is_keep_all"),
    (["--modes", "llamacpp", "--is_use_oldest"], "--is_use_oldest"),
    (["--modes", "llamacpp", "--no-is_public_pool"], "--is_public_pool"),
    (["--jsonl_field", "answer"], "--jsonl_field"),
    (["--prompt_field", "q"], "--prompt_field"),
])
def test_stats_refuses_flags_nothing_reads(tmp_path, capsys, extra, flag):
    inp = _tokens(tmp_path / "t.json")
    line = _refused(["stats", inp, "--output_json", tmp_path / "s.json", *extra], capsys)
    assert flag in line
    assert not (tmp_path / "s.json").exists()


def test_create_refuses_jsonl_field_without_jsonl_input(tmp_path, capsys):
    inp = _tokens(tmp_path / "t.json")
    assert "--jsonl_field" in _refused(["create", inp, "--output", tmp_path / "c.ngc", "--jsonl_field", "x"], capsys)
    assert not (tmp_path / "c.ngc").exists()
