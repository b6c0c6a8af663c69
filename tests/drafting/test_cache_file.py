"""Persisted n-gram caches: round trips, refusal of unusable files, learning across requests."""
from __future__ import annotations

import struct
import zlib

import pytest

from promptlookup.drafting import DraftConfig, NgramCache, TokenizerIdentity, make_drafter
from promptlookup.drafting.cache_file import MAGIC
from promptlookup.errors import UserError

IDENT = TokenizerIdentity.from_vocab({"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5, "g": 6, "h": 7, "i": 8, "j": 9}, "toy")
OTHER = TokenizerIdentity.from_vocab({"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5, "g": 6, "h": 7, "i": 8, "x": 9}, "toy")


def _cache() -> NgramCache:
    cache = NgramCache(3)
    cache.update([1, 2, 3, 1, 2, 3, 1, 2, 4, 5, 6])
    cache.update([7, 8, 9, 7, 8, 9, 7, 8])
    return cache


def _tables(cache: NgramCache):
    return [{key: (e[0], e[1], e[2], dict(e[3])) for key, e in t.items()} for t in cache.tables]


def test_round_trip(tmp_path):
    cache = _cache()
    path = tmp_path / "c.ngc"
    cache.save(path, IDENT)
    loaded, identity = NgramCache.load(path, expect=IDENT)
    assert identity == IDENT
    assert loaded.max_ngram == 3
    assert _tables(loaded) == _tables(cache)
    assert path.read_bytes()[:8] == MAGIC
    cache.save(tmp_path / "again.ngc", IDENT)
    assert (tmp_path / "again.ngc").read_bytes() == path.read_bytes()  # deterministic bytes


def test_counts_and_prediction():
    cache = _cache()
    # (1, 2) was followed by 3 twice and 4 once
    assert cache.tables[2][(1, 2)][3] == {3: 2, 4: 1}
    assert cache.predict([5, 1, 2], thresholds=((1, 1, 1), (50, 50, 50))) == (3, 2)
    # strict thresholds want 3 observations of a 2-gram at 66%: 2/3 passes
    assert cache.predict([1, 2]) == (3, 2)
    assert cache.predict([42]) is None


def test_header_layout(tmp_path):
    path = tmp_path / "c.ngc"
    _cache().save(path, IDENT)
    data = path.read_bytes()
    magic, version, max_ngram, vocab, digest, name_len = struct.unpack_from("<8sIII32sH", data, 0)
    assert (magic, version, max_ngram, vocab, digest, name_len) == (MAGIC, 1, 3, 10, IDENT.vocab_sha256, 3)
    assert data[54:57] == b"toy"
    assert struct.unpack_from("<I", data, len(data) - 4)[0] == zlib.crc32(data[:-4])


def _refused(path, expect=None) -> str:
    with pytest.raises(UserError) as err:
        NgramCache.load(path, expect=expect)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def test_truncated_files_are_refused(tmp_path):
    good = tmp_path / "c.ngc"
    _cache().save(good, IDENT)
    data = good.read_bytes()
    empty = tmp_path / "empty.ngc"
    empty.write_bytes(b"")
    assert NgramCache.load(empty)[0].num_ngrams() == 0  # llama.cpp writes an empty cache as an empty file
    for cut in (5, 9, 40, 60, len(data) // 2, len(data) - 1):
        bad = tmp_path / f"cut{cut}.ngc"
        bad.write_bytes(data[:cut])
        message = _refused(bad)
        assert "truncated" in message or "magic" in message


def test_foreign_files_are_refused(tmp_path):
    good = tmp_path / "c.ngc"
    _cache().save(good, IDENT)
    data = good.read_bytes()
    (tmp_path / "magic.ngc").write_bytes(b"GGUF" + data[4:])
    assert "magic" in _refused(tmp_path / "magic.ngc")
    body = bytearray(data[:-4])
    body[8:12] = struct.pack("<I", 2)
    (tmp_path / "v2.ngc").write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    assert "version 2" in _refused(tmp_path / "v2.ngc")
    assert "not with the current tokenizer" in _refused(good, expect=OTHER)
    corrupt = bytearray(data)
    corrupt[70] ^= 0xFF
    (tmp_path / "flip.ngc").write_bytes(bytes(corrupt))
    assert "corrupt" in _refused(tmp_path / "flip.ngc")
    trailing = data[:-4] + b"\0\0\0\0"
    (tmp_path / "tail.ngc").write_bytes(trailing + struct.pack("<I", zlib.crc32(trailing)))
    assert "unexpected bytes" in _refused(tmp_path / "tail.ngc")
    assert "does not exist" in _refused(tmp_path / "missing.ngc")


def test_drafter_refuses_cache_from_another_tokenizer(tmp_path):
    path = tmp_path / "c.ngc"
    _cache().save(path, IDENT)
    with pytest.raises(UserError, match="not with the current tokenizer"):
        make_drafter(DraftConfig(static_cache=str(path)), tokenizer=OTHER)
    with pytest.raises(UserError, match="tokenizer"):
        make_drafter(DraftConfig(static_cache=str(path)))
    make_drafter(DraftConfig(static_cache=str(path)), tokenizer=IDENT)  # same vocabulary: fine


def test_static_cache_drafts_when_the_context_has_nothing(tmp_path):
    path = tmp_path / "c.ngc"
    _cache().save(path, IDENT)
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2, static_cache=str(path)), tokenizer=IDENT)
    req = drafter.new_request([9, 7, 8], 100)
    draft = req.propose()
    assert draft == [9, 7, 8]  # from the cache: 7 8 -> 9, 8 9 -> 7, 9 7 -> 8
    assert req.last_source == "static"
    req = drafter.new_request([7, 8, 0, 7], 100)
    req.extend([8])  # V2 rules draft from the pool from the first generated token on
    assert req.propose() == [0, 7, 8]  # the request context comes first
    assert req.last_source == "context"


def test_dynamic_cache_learns_and_persists(tmp_path):
    path = tmp_path / "dyn.ngc"
    cfg = DraftConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2, is_public_pool=False, dynamic_cache=str(path))
    drafter = make_drafter(cfg, tokenizer=IDENT)
    story = [3, 1, 4, 1, 5, 9, 2, 6]
    for _ in range(4):  # strict thresholds need a few observations
        req = drafter.new_request(story[:2], 100)
        req.extend(story[2:])
        req.finish()
    assert not path.exists()
    drafter.save()
    fresh = make_drafter(cfg, tokenizer=IDENT)
    req = fresh.new_request([8, 3, 1], 100)
    assert req.propose() == [4, 1, 5, 9]
    assert req.last_source == "dynamic"
    with pytest.raises(UserError, match="not with the current tokenizer"):
        make_drafter(cfg, tokenizer=OTHER)
