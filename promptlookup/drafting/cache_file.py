"""llama.cpp-style n-gram caches (n-gram -> next-token counts) and their versioned file format.

An :class:`NgramCache` counts, for every n-gram of 1..``max_ngram`` tokens seen in some
text, how often each token followed it (llama.cpp's ``common_ngram_cache``). A *static*
cache is built offline from a corpus and only read; a *dynamic* cache absorbs every
finished request and is saved for the next run. Both draft token by token
(:meth:`NgramCache.predict`): the longest n-gram at the tail whose counts pass a sample-size
and a share threshold gives its most frequent next token (ties: the smaller id).

File format, version 1 (all integers little-endian)
----------------------------------------------------

==========  ===========================  =================================================
offset      size (bytes)                 field
==========  ===========================  =================================================
0           8                            magic ``b"PLNGRAM\\x00"``
8           4                            u32 format version (1)
12          4                            u32 ``max_ngram`` N (1..16)
16          4                            u32 tokenizer vocabulary size
20          32                           tokenizer vocabulary SHA-256 (see ``identity.py``)
52          2                            u16 tokenizer name length ``B``
54          B                            tokenizer name, UTF-8
54+B        ...                          N sections, one per n-gram size s = 1..N
end-4       4                            u32 CRC-32 (zlib) of every byte before it
==========  ===========================  =================================================

Section for size ``s``:

====================  ==============================================================
size (bytes)          field
====================  ==============================================================
8                     u64 G: number of distinct n-grams of size s
8                     u64 P: number of (n-gram, next token) pairs
4 * s * G             i32 n-gram tokens, one row of s tokens per n-gram, rows sorted
4 * G                 u32 pairs per n-gram (each >= 1; they sum to P)
4 * P                 i32 next tokens, grouped by n-gram in row order, ascending per group
4 * P                 u32 counts (each >= 1), parallel to the next tokens
====================  ==============================================================

A file is rejected with :class:`UserError` (one line naming the file and the fix) when it
is shorter than its header or sections say (truncated), has another magic, another
version, a bad CRC, trailing bytes, or was built with a tokenizer whose identity differs.

llama.cpp's format (``common/ngram-cache.cpp``: ``llama_ngram_cache_save``/``_load``)
---------------------------------------------------------------------------------------
Read and written beside the format above and told apart by content (a file that does not
start with the magic above is read as llama.cpp's). No header: a sequence of records, all
integers 32-bit little-endian, until the end of the file (an empty file is an empty cache):

==========  ================================================================
size        field
==========  ================================================================
16          the n-gram: 4 token ids, the unused tail padded with -1
4           i32 T: number of distinct next tokens (>= 1)
8 * T       T pairs (i32 next token, i32 count >= 1)
==========  ================================================================

llama.cpp's n-grams have at most 4 tokens (``LLAMA_NGRAM_MAX``), so a cache with longer
n-grams cannot be written in it. Its files carry no tokenizer identity: the only check
possible is that every token id is below the tokenizer's vocabulary size.

Costs: :meth:`NgramCache.update` O(N) dictionary operations per token;
:meth:`NgramCache.predict` O(N) lookups per drafted token (each entry keeps its top token).
"""
from __future__ import annotations

import struct
import sys
import zlib
from array import array
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import UserError
from ..fsutil import atomic_write_bytes
from .identity import TokenizerIdentity

MAGIC = b"PLNGRAM\x00"
VERSION = 1
FORMATS = ("promptlookup", "llama.cpp")  # file formats, told apart by content
LLAMACPP_NGRAM_MAX = 4  # llama.cpp's LLAMA_NGRAM_MAX: n-gram slots per record
MAX_NGRAM_LIMIT = 16
DEFAULT_MAX_NGRAM = 4  # llama.cpp's LLAMA_NGRAM_MAX
LLAMACPP_NGRAM_STATIC = 2  # llama.cpp's LLAMA_NGRAM_STATIC: lookup-create's static caches hold 2-grams only

_HEADER = struct.Struct("<8sIII32sH")  # magic, version, max_ngram, vocab_size, sha256, name length
_SECTION = struct.Struct("<QQ")

# Draft thresholds by n-gram size (index s-1; sizes above 4 use the last entry): minimum
# number of observations of the n-gram, and minimum share (percent) of its top token.
# These are llama.cpp's "strict" (dynamic cache) and "lax" (static cache) values.
STRICT = ((4, 3, 2, 2), (75, 66, 66, 66))
LAX = ((2, 2, 1, 1), (66, 50, 50, 50))


def _le_array(typecode: str, data: bytes | memoryview) -> array:
    a = array(typecode)
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def _le_bytes(a: array) -> bytes:
    if sys.byteorder != "little":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


class NgramCache:
    """n-gram -> {next token: count} for n-gram sizes 1..``max_ngram``.

    ``tables[s]`` maps a key (the token itself for s == 1, else a tuple of s tokens) to an
    entry ``[total, top_token, top_count, counts]``; ``top_token`` is the most frequent next
    token (ties: smaller id) and ``total`` the sum of ``counts``.
    """

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM) -> None:
        if not 1 <= max_ngram <= MAX_NGRAM_LIMIT:
            raise UserError(f"max_ngram must be between 1 and {MAX_NGRAM_LIMIT}, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tables: list[dict] = [{} for _ in range(max_ngram + 1)]

    # -- building ----------------------------------------------------------------------
    def _add(self, s: int, key, token: int, count: int) -> None:
        table = self.tables[s]
        entry = table.get(key)
        if entry is None:
            table[key] = [count, token, count, {token: count}]
            return
        counts = entry[3]
        c = counts.get(token, 0) + count
        counts[token] = c
        entry[0] += count
        if c > entry[2] or (c == entry[2] and token < entry[1]):
            entry[1] = token
            entry[2] = c

    def update(self, tokens: Sequence[int], start: int = 0, min_ngram: int = 1) -> None:
        """Count every (n-gram of ``min_ngram``..``max_ngram`` tokens, next token) pair whose next
        token is at index >= ``start`` (llama.cpp's ``common_ngram_cache_update(ngram_min, ngram_max)``)."""
        add = self._add
        for s in range(max(1, min_ngram), self.max_ngram + 1):
            for i in range(max(start, s), len(tokens)):
                key = tokens[i - 1] if s == 1 else tuple(tokens[i - s:i])
                add(s, key, tokens[i], 1)

    def merge(self, other: "NgramCache") -> None:
        """Add ``other``'s counts to this cache (sizes above ``self.max_ngram`` are dropped)."""
        for s in range(1, min(self.max_ngram, other.max_ngram) + 1):
            for key, entry in other.tables[s].items():
                for token, count in entry[3].items():
                    self._add(s, key, token, count)

    # -- drafting ----------------------------------------------------------------------
    def predict(self, context: Sequence[int], thresholds=STRICT) -> tuple[int, int] | None:
        """(next token, n-gram size) from the longest confident n-gram ending ``context``."""
        sizes, percents = thresholds
        tables = self.tables
        for s in range(min(self.max_ngram, len(context)), 0, -1):
            key = context[-1] if s == 1 else tuple(context[-s:])
            entry = tables[s].get(key)
            if entry is None:
                continue
            j = min(s, len(sizes)) - 1
            total = entry[0]
            if total >= sizes[j] and 100 * entry[2] >= percents[j] * total:
                return entry[1], s
        return None

    # -- inspection --------------------------------------------------------------------
    def num_ngrams(self, s: int | None = None) -> int:
        if s is not None:
            return len(self.tables[s])
        return sum(len(t) for t in self.tables)

    def num_pairs(self, s: int | None = None) -> int:
        sizes = [s] if s is not None else range(1, self.max_ngram + 1)
        return sum(len(e[3]) for size in sizes for e in self.tables[size].values())

    def total_count(self, s: int) -> int:
        return sum(e[0] for e in self.tables[s].values())

    def top(self, s: int, limit: int) -> list[tuple[tuple[int, ...], int, int, int]]:
        """The ``limit`` most observed n-grams of size ``s``: (ngram, total, top token, top count)."""
        rows = []
        for key, e in self.tables[s].items():
            ngram = (key,) if s == 1 else key
            rows.append((ngram, e[0], e[1], e[2]))
        rows.sort(key=lambda r: (-r[1], r[0]))
        return rows[:limit]

    # -- file format -------------------------------------------------------------------
    def to_bytes(self, identity: TokenizerIdentity) -> bytes:
        name = identity.name.encode("utf-8")[:65535]
        parts = [_HEADER.pack(MAGIC, VERSION, self.max_ngram, identity.vocab_size, identity.vocab_sha256, len(name)), name]
        for s in range(1, self.max_ngram + 1):
            table = self.tables[s]
            keys = sorted(table)
            grams = array("i")
            npairs = array("I")
            nexts = array("i")
            counts = array("I")
            for key in keys:
                if s == 1:
                    grams.append(key)
                else:
                    grams.extend(key)
                pairs = sorted(table[key][3].items())
                npairs.append(len(pairs))
                for token, count in pairs:
                    nexts.append(token)
                    counts.append(min(count, 0xFFFFFFFF))
            parts.append(_SECTION.pack(len(keys), len(nexts)))
            parts.extend(_le_bytes(a) for a in (grams, npairs, nexts, counts))
        body = b"".join(parts)
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "n-gram cache") -> tuple["NgramCache", TokenizerIdentity]:
        """Parse a cache file's bytes; raise :class:`UserError` (naming ``where``) if unusable."""
        rebuild = "; rebuild it with `python -m promptlookup.cli.ngram_cache create`"
        if len(data) < 8 or data[:8] != MAGIC:
            raise UserError(f"{where} is not a promptlookup n-gram cache (bad magic bytes){rebuild}")
        if len(data) < _HEADER.size + 4:
            raise UserError(f"{where} is truncated (shorter than its header){rebuild}")
        _, version, max_ngram, vocab_size, digest, name_len = _HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise UserError(
                f"{where} has n-gram cache format version {version}, this promptlookup reads version {VERSION}{rebuild}"
            )
        if zlib.crc32(memoryview(data)[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
            raise UserError(f"{where} is truncated or corrupt (checksum mismatch){rebuild}")
        if not 1 <= max_ngram <= MAX_NGRAM_LIMIT:
            raise UserError(f"{where} is corrupt (max_ngram {max_ngram}){rebuild}")
        body = memoryview(data)[:-4]
        pos = _HEADER.size
        try:
            name = bytes(body[pos:pos + name_len]).decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{where} is corrupt (tokenizer name is not UTF-8){rebuild}") from None
        pos += name_len
        identity = TokenizerIdentity(name, vocab_size, bytes(digest))
        cache = cls(max_ngram)

        def take(n: int) -> memoryview:
            nonlocal pos
            if n < 0 or pos + n > len(body):
                raise UserError(f"{where} is truncated (section ends past the end of the file){rebuild}")
            chunk = body[pos:pos + n]
            pos += n
            return chunk

        for s in range(1, max_ngram + 1):
            ngrams, pairs = _SECTION.unpack(take(_SECTION.size))
            if ngrams > len(body) or pairs > len(body):
                raise UserError(f"{where} is truncated (section ends past the end of the file){rebuild}")
            grams = _le_array("i", take(4 * s * ngrams))
            npairs = _le_array("I", take(4 * ngrams))
            nexts = _le_array("i", take(4 * pairs))
            counts = _le_array("I", take(4 * pairs))
            if sum(npairs) != pairs or (ngrams and min(npairs) < 1) or (pairs and min(counts) < 1):
                raise UserError(f"{where} is corrupt (inconsistent counts in the {s}-gram section){rebuild}")
            table = cache.tables[s]
            j = 0
            for g in range(ngrams):
                key = grams[g] if s == 1 else tuple(grams[g * s:(g + 1) * s])
                m = npairs[g]
                token_counts = dict(zip(nexts[j:j + m], counts[j:j + m]))
                j += m
                total = sum(token_counts.values())
                best = max(token_counts.values())
                top = min(t for t, c in token_counts.items() if c == best)
                table[key] = [total, top, best, token_counts]
        if pos != len(body):
            raise UserError(f"{where} is corrupt ({len(body) - pos} unexpected bytes after the last section){rebuild}")
        return cache, identity

    # -- llama.cpp's file format ----------------------------------------------------------
    def to_llamacpp_bytes(self) -> bytes:
        """llama.cpp's ``llama_ngram_cache_save`` layout (records in sorted order: deterministic)."""
        longest = max((s for s in range(1, self.max_ngram + 1) if self.tables[s]), default=0)
        if longest > LLAMACPP_NGRAM_MAX:
            raise UserError(
                f"llama.cpp's n-gram cache format holds n-grams of at most {LLAMACPP_NGRAM_MAX} tokens, this cache "
                f"has {longest}-grams; write it in the promptlookup format or build it with --max_ngram {LLAMACPP_NGRAM_MAX}"
            )
        out = array("i")
        for s in range(1, min(self.max_ngram, LLAMACPP_NGRAM_MAX) + 1):
            table = self.tables[s]
            for key in sorted(table):
                gram = [key] if s == 1 else list(key)
                pairs = sorted(table[key][3].items())
                out.extend(gram + [-1] * (LLAMACPP_NGRAM_MAX - s))
                out.append(len(pairs))
                for token, count in pairs:
                    out.append(token)
                    out.append(min(count, 0x7FFFFFFF))
        return _le_bytes(out)

    @classmethod
    def from_llamacpp_bytes(cls, data: bytes, where: str = "n-gram cache") -> "NgramCache":
        """Parse llama.cpp's layout; raise :class:`UserError` (naming ``where``) if malformed."""
        bad = f"{where} is neither a promptlookup n-gram cache (no magic bytes) nor a valid llama.cpp one"
        if len(data) % 4:
            raise UserError(f"{bad} (its size is not a multiple of 4 bytes)")
        ints = _le_array("i", data)
        cache = cls(LLAMACPP_NGRAM_MAX)
        pos, end = 0, len(ints)
        while pos < end:
            if pos + LLAMACPP_NGRAM_MAX + 1 > end:
                raise UserError(f"{bad} (truncated record at byte {4 * pos})")
            gram = ints[pos:pos + LLAMACPP_NGRAM_MAX]
            s = next((i for i, t in enumerate(gram) if t == -1), LLAMACPP_NGRAM_MAX)
            ntokens = ints[pos + LLAMACPP_NGRAM_MAX]
            if s == 0 or any(t < 0 for t in gram[:s]) or any(t != -1 for t in gram[s:]) or ntokens < 1:
                raise UserError(f"{bad} (malformed record at byte {4 * pos})")
            pos += LLAMACPP_NGRAM_MAX + 1
            if pos + 2 * ntokens > end:
                raise UserError(f"{bad} (truncated record at byte {4 * (pos - LLAMACPP_NGRAM_MAX - 1)})")
            pairs = ints[pos:pos + 2 * ntokens]
            pos += 2 * ntokens
            key = gram[0] if s == 1 else tuple(gram[:s])
            for token, count in zip(pairs[0::2], pairs[1::2]):
                if token < 0 or count < 1:
                    raise UserError(f"{bad} (bad token or count in the record of n-gram {list(gram[:s])})")
                cache._add(s, key, token, count)
        return cache

    def max_token(self) -> int:
        """The largest token id in the cache (-1 when empty)."""
        best = -1
        for s in range(1, self.max_ngram + 1):
            for key, entry in self.tables[s].items():
                best = max(best, key if s == 1 else max(key), max(entry[3]))
        return best

    # -- files ------------------------------------------------------------------------------
    def save(self, path: str | Path, identity: TokenizerIdentity | None, file_format: str = "promptlookup") -> None:
        """Write the cache atomically in ``file_format`` (a failure leaves any existing file untouched).

        ``identity`` is required by the promptlookup format; llama.cpp's has no room for it.
        """
        if file_format == "llama.cpp":
            atomic_write_bytes(path, self.to_llamacpp_bytes())
            return
        if file_format != "promptlookup":
            raise ValueError(f"unknown n-gram cache format {file_format!r}; choose one of {FORMATS}")
        if identity is None:
            raise UserError(f"writing {path} in the promptlookup format needs the tokenizer; pass --tokenizer_dir")
        atomic_write_bytes(path, self.to_bytes(identity))

    @classmethod
    def load(cls, path: str | Path, expect: TokenizerIdentity | None = None) -> tuple["NgramCache", TokenizerIdentity | None]:
        """Read a cache file in either format (told apart by content).

        Returns the cache and the tokenizer identity stored in the file (``None`` for
        llama.cpp's format, which stores none; :func:`file_format` tells the format). With
        ``expect``, refuse a file built with another tokenizer, or (llama.cpp's format)
        holding a token id outside ``expect``'s vocabulary. A file in this project's format
        holding a token id outside its recorded (or ``expect``'s) vocabulary is refused too.
        """
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UserError(f"n-gram cache {path} does not exist; create it with `python -m promptlookup.cli.ngram_cache create`") from None
        except IsADirectoryError:
            raise UserError(f"n-gram cache {path} is a directory, not a file") from None
        except OSError as exc:
            raise UserError(f"cannot read n-gram cache {path}: {exc.strerror}") from None
        where = f"n-gram cache {path}"
        if detect_format(data) == "llama.cpp":
            cache = cls.from_llamacpp_bytes(data, where)
            if expect is not None and cache.max_token() >= expect.vocab_size:
                raise UserError(
                    f"{where} (llama.cpp format) holds token id {cache.max_token()}, outside the current tokenizer's "
                    f"{expect.vocab_size} tokens; it was built with another tokenizer"
                )
            return cache, None
        cache, identity = cls.from_bytes(data, where=where)
        if expect is not None and not identity.compatible(expect):
            raise UserError(
                f"n-gram cache {path} was built with tokenizer {identity.describe()}, not with the current "
                f"tokenizer {expect.describe()}; rebuild the cache with this tokenizer"
            )
        # the recorded tokenizer's vocabulary bounds every token id (a file written from ids
        # outside it would crash generation with "index out of range")
        vocab = min(identity.vocab_size, expect.vocab_size) if expect is not None else identity.vocab_size
        if cache.max_token() >= vocab:
            raise UserError(
                f"{where} holds token id {cache.max_token()}, outside the tokenizer's {vocab} tokens "
                f"({identity.describe()}); rebuild the cache from valid token ids"
            )
        return cache, identity


def detect_format(data: bytes) -> str:
    """"promptlookup" for bytes that start with this project's magic, else "llama.cpp"."""
    head = bytes(data[:len(MAGIC)])
    return "promptlookup" if head and MAGIC.startswith(head) else "llama.cpp"


def file_format(path: str | Path) -> str:
    """The format of the cache file at ``path`` (read from its first bytes)."""
    with open(path, "rb") as f:
        return detect_format(f.read(len(MAGIC)))


def build_cache(sequences: Iterable[Sequence[int]], max_ngram: int = DEFAULT_MAX_NGRAM) -> NgramCache:
    cache = NgramCache(max_ngram)
    for tokens in sequences:
        cache.update(tokens)
    return cache
