"""llama.cpp's n-gram cache files and its draft algorithm (``llama_ngram_cache_draft``).

Files are written and read here by a small independent codec following the layout llama.cpp
documents in ``common/ngram-cache.cpp`` (``llama_ngram_cache_save``: per n-gram, 4 int32
token slots padded with -1, an int32 count of next tokens, then int32 (token, count) pairs),
and the draft algorithm is checked against a brute-force restatement that recounts the
context from the raw text at every step.
"""
from __future__ import annotations

import json
import random
import struct

import pytest

from promptlookup.cli import ngram_cache as cli
from promptlookup.drafting import DraftConfig, NgramCache, TokenizerIdentity, make_drafter
from promptlookup.drafting.cache_file import file_format
from promptlookup.errors import UserError

VOCAB = 12
IDENT = TokenizerIdentity.from_vocab({f"t{i}": i for i in range(VOCAB)}, "toy")

# llama.cpp's thresholds (common/ngram-cache.cpp), by n-gram size 1..4
LAX = ((2, 2, 1, 1), (66, 50, 50, 50))
STRICT = ((4, 3, 2, 2), (75, 66, 66, 66))


def write_llamacpp(path, table: dict[tuple, dict[int, int]]) -> None:
    out = bytearray()
    for gram, counts in table.items():
        out += struct.pack("<4i", *(list(gram) + [-1] * (4 - len(gram))))
        out += struct.pack("<i", len(counts))
        for token, count in counts.items():
            out += struct.pack("<ii", token, count)
    path.write_bytes(bytes(out))


def read_llamacpp(path) -> dict[tuple, dict[int, int]]:
    data = path.read_bytes()
    table, pos = {}, 0
    while pos < len(data):
        slots = struct.unpack_from("<4i", data, pos)
        (n,) = struct.unpack_from("<i", data, pos + 16)
        pos += 20
        pairs = struct.unpack_from(f"<{2 * n}i", data, pos)
        pos += 8 * n
        table[tuple(t for t in slots if t != -1)] = dict(zip(pairs[0::2], pairs[1::2]))
    return table


def as_table(cache: NgramCache) -> dict[tuple, dict[int, int]]:
    out = {}
    for s in range(1, cache.max_ngram + 1):
        for key, entry in cache.tables[s].items():
            out[(key,) if s == 1 else key] = dict(entry[3])
    return out


def count_ngrams(text, sizes=range(1, 5)) -> dict[tuple, dict[int, int]]:
    table: dict[tuple, dict[int, int]] = {}
    for s in sizes:
        for i in range(s, len(text)):
            counts = table.setdefault(tuple(text[i - s:i]), {})
            counts[text[i]] = counts.get(text[i], 0) + 1
    return table


# ------------------------------------------------------------------------------ files
def test_reads_a_file_in_llamacpps_layout(tmp_path):
    table = {(3, 4): {5: 7, 1: 2}, (9,): {0: 1}, (1, 2, 3, 4): {11: 3}, (6, 7, 8): {2: 1, 3: 1, 4: 5}}
    path = tmp_path / "static.lcache"
    write_llamacpp(path, table)
    cache, identity = NgramCache.load(path, expect=IDENT)
    assert identity is None and file_format(path) == "llama.cpp"
    assert as_table(cache) == table
    assert cache.tables[2][(3, 4)][1:3] == [5, 7]  # most frequent next token


def test_writes_llamacpps_layout(tmp_path):
    cache = NgramCache(4)
    cache.update([1, 2, 3, 1, 2, 4, 1, 2, 3, 5])
    path = tmp_path / "out.lcache"
    cache.save(path, None, "llama.cpp")
    assert read_llamacpp(path) == as_table(cache) == count_ngrams([1, 2, 3, 1, 2, 4, 1, 2, 3, 5])
    again = tmp_path / "again.lcache"
    NgramCache.load(path)[0].save(again, None, "llama.cpp")
    assert again.read_bytes() == path.read_bytes()  # deterministic
    five = NgramCache(5)
    five.update([1, 2, 3, 4, 5, 6])
    with pytest.raises(UserError, match="at most 4 tokens"):
        five.save(tmp_path / "five.lcache", None, "llama.cpp")


@pytest.mark.parametrize("damage", ["truncated", "count", "padding", "odd", "vocab"])
def test_malformed_llamacpp_files_are_refused_in_one_line(tmp_path, damage):
    good = bytearray()
    good += struct.pack("<4i", 1, 2, -1, -1) + struct.pack("<i", 2) + struct.pack("<iiii", 3, 1, 4, 2)
    data = {
        "truncated": bytes(good[:-4]),
        "count": bytes(good[:-4]) + struct.pack("<i", 0),
        "padding": struct.pack("<4i", 1, -1, 2, -1) + bytes(good[16:]),
        "odd": bytes(good) + b"\0",
        "vocab": struct.pack("<4i", 1, 2, -1, -1) + struct.pack("<i", 1) + struct.pack("<ii", VOCAB, 1),
    }[damage]
    path = tmp_path / "bad.lcache"
    path.write_bytes(data)
    with pytest.raises(UserError) as err:
        NgramCache.load(path, expect=IDENT)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


# ------------------------------------------------------------------------------ drafting
def brute_force_draft(text, k, dynamic, static):
    """llama_ngram_cache_draft restated: context counts recomputed from ``text`` every time."""

    def best(counts, weights):
        return min(counts, key=lambda t: (-counts[t] * (100 * weights[t] if t in weights else 1), t))

    def passes(counts, token, thresholds, s):
        total = sum(counts.values())
        return total >= thresholds[0][s - 1] and 100 * counts[token] >= thresholds[1][s - 1] * total

    if len(text) < 2:
        return []
    seq, out = list(text), []
    context = count_ngrams(text)
    while len(out) < k:
        weights = static.get(tuple(seq[-2:]), {})
        token = None
        for table, thresholds in ((context, LAX), (dynamic, STRICT)):
            for s in (4, 3, 2, 1):
                counts = table.get(tuple(seq[-s:])) if s <= len(seq) else None
                if counts and passes(counts, best(counts, weights), thresholds, s):
                    token = best(counts, weights)
                    break
            if token is not None:
                break
        if token is None and weights and passes(weights, best(weights, {}), LAX, 2):
            token = best(weights, {})
        if token is None:
            break
        out.append(token)
        seq.append(token)
    return out


def random_cache(rnd, alphabet, sizes, entries):
    table = {}
    for _ in range(entries):
        gram = tuple(rnd.randrange(alphabet) for _ in range(rnd.choice(sizes)))
        table[gram] = {rnd.randrange(alphabet): rnd.randint(1, 6) for _ in range(rnd.randint(1, 3))}
    return table


@pytest.mark.parametrize("seed", range(12))
def test_llamacpp_mode_matches_the_brute_force_restatement(tmp_path, seed):
    rnd = random.Random(seed)
    alphabet = rnd.choice([2, 3, 5, 8])
    k = rnd.randint(1, 6)
    static = random_cache(rnd, alphabet, [2], rnd.randint(0, 20))
    dynamic = random_cache(rnd, alphabet, [1, 2, 3, 4], rnd.randint(0, 30))
    write_llamacpp(tmp_path / "static.lcache", static)
    write_llamacpp(tmp_path / "dynamic.lcache", dynamic)
    cfg = DraftConfig(prompt_lookup_num_tokens=k, mode="llamacpp", static_cache=str(tmp_path / "static.lcache"),
                      dynamic_cache=str(tmp_path / "dynamic.lcache"))
    drafter = make_drafter(cfg, tokenizer=IDENT)
    drafted = 0
    for _ in range(2):  # the second request sees the first one's text in the dynamic cache
        text = [rnd.randrange(alphabet) for _ in range(rnd.randint(0, 8))]
        req = drafter.new_request(text, 10_000)
        assert req.propose() == []  # llama.cpp drafts from the first sampled token on
        for _ in range(40):
            new = [rnd.randrange(alphabet) for _ in range(rnd.choice([1, 1, 2, 3]))]
            req.extend(new)
            text += new
            got = req.propose()
            assert got == brute_force_draft(text, k, dynamic, static), text
            drafted += len(got)
        req.finish()
        for gram, counts in count_ngrams(text).items():  # llama.cpp merges the context cache into the dynamic one
            merged = dynamic.setdefault(gram, {})
            for token, count in counts.items():
                merged[token] = merged.get(token, 0) + count
    assert drafted > 0
    drafter.save()
    assert read_llamacpp(tmp_path / "dynamic.lcache") == dynamic  # written back in llama.cpp's format


def test_static_cache_reweights_the_context_candidates(tmp_path):
    # context: (3, 7) was followed once by 1 and once by 2 (a tie, to the smaller id: 1);
    # the static cache saw 2 after (3, 7), which multiplies 2's weight by 100
    write_llamacpp(tmp_path / "s.lcache", {(3, 7): {2: 1}})
    cfg = DraftConfig(prompt_lookup_num_tokens=1, mode="llamacpp", static_cache=str(tmp_path / "s.lcache"))
    plain = make_drafter(DraftConfig(prompt_lookup_num_tokens=1, mode="llamacpp")).new_request([3, 7, 1, 3, 7, 2, 3], 100)
    plain.extend([7])
    weighted = make_drafter(cfg, tokenizer=IDENT).new_request([3, 7, 1, 3, 7, 2, 3], 100)
    weighted.extend([7])
    assert plain.propose() == [1]
    assert weighted.propose() == [2]


def test_new_dynamic_cache_is_written_in_llamacpps_format(tmp_path):
    path = tmp_path / "dyn.lcache"
    drafter = make_drafter(DraftConfig(mode="llamacpp", dynamic_cache=str(path)), tokenizer=IDENT)
    req = drafter.new_request([1, 2, 3], 100)
    req.extend([1, 2])
    req.finish()
    drafter.save()
    assert file_format(path) == "llama.cpp" and read_llamacpp(path) == count_ngrams([1, 2, 3, 1, 2])


# ------------------------------------------------------------------------------ command lines
def test_cli_reads_and_writes_both_formats(tmp_path, capsys):
    tokens = tmp_path / "corpus.json"
    tokens.write_text(json.dumps({"tokenizer": IDENT.to_json(), "sequences": [[1, 2, 3, 1, 2, 4]]}))
    assert cli.main(["create", str(tokens), "--output", str(tmp_path / "a.lcache"), "--format", "llama.cpp",
                     "--ngram_min", "1", "--ngram_max", "4"]) == 0
    assert read_llamacpp(tmp_path / "a.lcache") == count_ngrams([1, 2, 3, 1, 2, 4])
    write_llamacpp(tmp_path / "b.lcache", {(1, 2): {3: 5}})
    assert cli.main(["merge", "--output", str(tmp_path / "m.lcache"), str(tmp_path / "a.lcache"),
                     str(tmp_path / "b.lcache")]) == 0
    assert read_llamacpp(tmp_path / "m.lcache")[(1, 2)] == {3: 6, 4: 1}
    with pytest.raises(UserError, match="records no tokenizer"):
        cli.main(["merge", "--output", str(tmp_path / "m.ngc"), "--format", "promptlookup", str(tmp_path / "b.lcache")])
    assert cli.main(["create", str(tokens), "--output", str(tmp_path / "p.ngc")]) == 0
    assert cli.main(["merge", "--output", str(tmp_path / "pm.ngc"), str(tmp_path / "p.ngc"),
                     str(tmp_path / "b.lcache")]) == 0
    merged, identity = NgramCache.load(tmp_path / "pm.ngc", expect=IDENT)
    assert identity == IDENT and as_table(merged)[(1, 2)] == {3: 6, 4: 1}
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "b.lcache")]) == 0
    assert "llama.cpp format" in capsys.readouterr().out
    with pytest.raises(UserError, match="at most 4 tokens"):
        cli.main(["create", str(tokens), "--output", str(tmp_path / "x.lcache"), "--format", "llama.cpp", "--max_ngram", "5"])
    assert cli.main(["stats", str(tokens), "--modes", "llamacpp,pool", "--k", "2", "--n", "1",
                     "--static_cache", str(tmp_path / "b.lcache")]) == 0
    assert "llamacpp k=2" in capsys.readouterr().out


def test_run_accepts_llamacpps_flag_names():
    from promptlookup.cli.args import draft_from_args
    from promptlookup.cli.run import parse_args

    args = parse_args(["--prompt_lookup_config", "[4,2,[0]]", "--drafter_mode", "llamacpp",
                       "--lookup-cache-static", "s.lcache", "--lookup-cache-dynamic", "d.lcache"])
    draft = draft_from_args(args)
    assert (draft.mode, draft.static_cache, draft.dynamic_cache) == ("llamacpp", "s.lcache", "d.lcache")


def test_create_llamacpp_defaults_to_lookup_creates_static_2grams(tmp_path, capsys):
    """llama-lookup-create writes LLAMA_NGRAM_STATIC (2) -grams only; so does --format llama.cpp by default."""
    text = [1, 2, 3, 1, 2, 4, 5, 1, 2, 3]
    tokens = tmp_path / "corpus.json"
    tokens.write_text(json.dumps({"tokenizer": IDENT.to_json(), "sequences": [text]}))
    out = tmp_path / "static.lcache"
    assert cli.main(["create", str(tokens), "--output", str(out), "--format", "llama.cpp"]) == 0
    assert read_llamacpp(out) == count_ngrams(text, sizes=[2])
    assert "sizes 2..2" in capsys.readouterr().out
    assert cli.main(["create", str(tokens), "--output", str(out), "--format", "llama.cpp", "--ngram_max", "3"]) == 0
    assert read_llamacpp(out) == count_ngrams(text, sizes=[2, 3])
    assert cli.main(["create", str(tokens), "--output", str(out), "--format", "llama.cpp", "--ngram_min", "1",
                     "--ngram_max", "1"]) == 0
    assert read_llamacpp(out) == count_ngrams(text, sizes=[1])
    mine = tmp_path / "p.ngc"  # this project's format keeps its 1..4 default; --ngram_min applies to it too
    assert cli.main(["create", str(tokens), "--output", str(mine)]) == 0
    assert as_table(NgramCache.load(mine)[0]) == count_ngrams(text)
    assert cli.main(["create", str(tokens), "--output", str(mine), "--ngram_min", "3"]) == 0
    assert as_table(NgramCache.load(mine)[0]) == count_ngrams(text, sizes=[3, 4])
    for flags, message in ((["--ngram_min", "3", "--ngram_max", "2"], "--ngram_min must be between 1 and --ngram_max 2"),
                           (["--ngram_min", "0"], "--ngram_min must be between 1"),
                           (["--ngram_max", "5"], "at most 4 tokens")):
        with pytest.raises(UserError, match=message):
            cli.main(["create", str(tokens), "--output", str(out), "--format", "llama.cpp", *flags])


def test_inspect_decode_shows_text(tmp_path, capsys, smollm2_tokenizer_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. the cat sat on the hat. the cat sat down.")
    cache = tmp_path / "c.lcache"
    assert cli.main(["create", str(corpus), "--output", str(cache), "--format", "llama.cpp",
                     "--tokenizer_dir", str(smollm2_tokenizer_dir)]) == 0
    capsys.readouterr()
    report = tmp_path / "r.json"
    assert cli.main(["inspect", str(cache), "--top", "2", "--decode", "--tokenizer_dir", str(smollm2_tokenizer_dir),
                     "--output_json", str(report)]) == 0
    out = capsys.readouterr().out
    import re

    assert re.search(r"2-gram \[\d+, \d+\] '[^']+': seen", out) and "' cat'" in out  # ids, then their text
    top = json.loads(report.read_text())["sizes"][1]["top"][0]
    assert top["text"] and top["top_text"] and isinstance(top["ngram"], list)
    with pytest.raises(UserError, match="--decode needs the tokenizer"):
        cli.main(["inspect", str(cache), "--decode"])
    with pytest.raises(UserError, match="only with --decode"):
        cli.main(["inspect", str(cache), "--tokenizer_dir", str(smollm2_tokenizer_dir)])
    toy = tmp_path / "toy.ngc"
    (tmp_path / "toy.json").write_text(json.dumps({"tokenizer": IDENT.to_json(), "sequences": [[1, 2, 3, 1, 2]]}))
    assert cli.main(["create", str(tmp_path / "toy.json"), "--output", str(toy)]) == 0
    with pytest.raises(UserError, match="was built with"):
        cli.main(["inspect", str(toy), "--decode", "--tokenizer_dir", str(smollm2_tokenizer_dir)])


def test_inspect_decode_takes_an_engine_directory(tmp_path, capsys, tiny_engine_dir):
    text = tmp_path / "t.txt"
    text.write_text("one two one two one two")
    cache = tmp_path / "e.lcache"
    assert cli.main(["create", str(text), "--output", str(cache), "--format", "llama.cpp",
                     "--tokenizer_dir", str(tiny_engine_dir)]) == 0
    capsys.readouterr()
    assert cli.main(["inspect", str(cache), "--decode", "--tokenizer_dir", str(tiny_engine_dir)]) == 0
    assert "' two'" in capsys.readouterr().out
