"""promptlookup.text: the incremental detokenizer equals the full decode, holds back
incomplete characters and decodes only a window of new tokens; chat template; stop strings."""
from __future__ import annotations

import random
from typing import Sequence

import pytest

from promptlookup.errors import UserError
from promptlookup.text import (
    REPLACEMENT,
    IncrementalDetokenizer,
    chat_ids,
    decode_text,
    encode_text,
    find_stop,
    stop_hold,
    stop_token_count,
)
from tests.cli_stream.test_stream_output import tokenizer  # noqa: F401 (the fixture: SmolLM2's tokenizer)

ALPHABET = "abc xyz.,\n" + "éüßç" + "你好世界" + "🎉🚀🙂" + "\u200d"


class ByteTokenizer:
    """Each token is a few bytes of UTF-8 (so characters split across tokens); decoding
    replaces incomplete sequences with U+FFFD, as byte-level BPE decoders do. Counts the
    tokens it decodes."""

    def __init__(self) -> None:
        self.vocab: list[bytes] = []
        self.decoded = 0
        self.largest = 0

    def tokenize(self, text: str, rng: random.Random) -> list[int]:
        data = text.encode("utf-8")
        ids, i = [], 0
        while i < len(data):
            n = rng.randint(1, 3)
            self.vocab.append(data[i:i + n])
            ids.append(len(self.vocab) - 1)
            i += n
        return ids

    def decode(self, ids: Sequence[int], **kwargs: object) -> str:
        self.decoded += len(ids)
        self.largest = max(self.largest, len(ids))
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


class SentencePieceLike:
    """Words with a leading "▁"; the leading space of the first piece is dropped on decode."""

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def decode(self, ids: Sequence[int], **kwargs: object) -> str:
        text = "".join(self.words[i] for i in ids).replace("▁", " ")
        return text[1:] if text.startswith(" ") else text


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def stream(detok: IncrementalDetokenizer, ids: list[int], rng: random.Random, full: str) -> str:
    """Push ``ids`` in random chunks; check every release; return all released text."""
    released, i = "", 0
    while i < len(ids):
        n = rng.randint(1, 4)
        new = detok.push(ids[i:i + n])
        i += n
        released += new
        assert released == detok.text
        assert full.startswith(released)  # never releases what it would take back
        assert REPLACEMENT not in released  # incomplete characters are held back
    return released + detok.flush()


def test_incremental_equals_full_decode_on_random_streams():
    rng = random.Random(7)
    split = 0
    for _ in range(200):
        tok = ByteTokenizer()
        text = random_text(rng, rng.randint(1, 60))
        ids = tok.tokenize(text, rng)
        full = decode_text(tok, ids)
        assert full == text
        split += sum(REPLACEMENT in decode_text(tok, ids[:c]) for c in range(1, len(ids)))
        detok = IncrementalDetokenizer(tok)
        assert stream(detok, ids, rng, full) == full
        assert detok.text == full and not detok.broken
    assert split > 100  # the streams really split characters across tokens


def test_emoji_is_held_back_until_complete():
    tok = ByteTokenizer()
    tok.vocab = [b"ok ", *(bytes([b]) for b in "🎉".encode())]  # ids 1..4: the emoji's four bytes
    detok = IncrementalDetokenizer(tok)
    assert detok.push([0]) == "ok "
    assert detok.push([1]) == ""
    assert detok.push([2, 3]) == ""
    assert detok.text == "ok "
    assert detok.push([4]) == "🎉"
    assert detok.flush() == ""
    assert detok.text == "ok 🎉"


def test_incomplete_tail_is_released_on_flush():
    tok = ByteTokenizer()
    tok.vocab = [b"a", "é".encode()[:1]]
    detok = IncrementalDetokenizer(tok)
    assert detok.push([0, 1]) == ""
    assert detok.flush() == "a" + REPLACEMENT
    assert detok.text == decode_text(tok, [0, 1])


def test_each_push_decodes_only_a_window_of_new_tokens():
    rng = random.Random(3)
    tok = ByteTokenizer()
    ids = tok.tokenize(random_text(rng, 3000), rng)
    detok = IncrementalDetokenizer(tok)
    for t in ids:
        detok.push([t])
    assert len(ids) > 1000
    # the window: tokens held back (while they end inside a character) plus the last release
    assert tok.largest <= 30
    assert tok.decoded <= 8 * len(ids)  # O(new tokens) per push, not O(sequence)
    detok.flush()
    assert detok.text == decode_text(tok, ids) and not detok.broken


def test_leading_spaces_survive_window_boundaries():
    words = ["▁The", "▁quick", "▁brown", "fox", "▁jumps", ".", "▁over"]
    tok = SentencePieceLike(words)
    ids = list(range(len(words)))
    detok = IncrementalDetokenizer(tok)
    released = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert released == decode_text(tok, ids) == "The quick brownfox jumps. over"


def test_a_decoder_that_rewrites_shown_text_is_flagged_on_flush():
    class Rewriting:
        def decode(self, ids: Sequence[int], **kwargs: object) -> str:
            return "x" * len(ids) if len(ids) < 3 else "y" * len(ids)

    detok = IncrementalDetokenizer(Rewriting())
    assert detok.push([0]) == "x"
    detok.push([1])
    detok.push([2])
    assert detok.flush() == ""
    assert detok.broken and detok.text == "yyy"


def test_real_tokenizer_random_streams(tokenizer):
    rng = random.Random(11)
    for _ in range(20):
        text = random_text(rng, rng.randint(5, 80))
        ids = tokenizer.encode(text, add_special_tokens=False)
        full = decode_text(tokenizer, ids)
        detok = IncrementalDetokenizer(tokenizer)
        assert stream(detok, ids, rng, full) == full


def test_chat_template(tokenizer):
    messages = [{"role": "user", "content": "hi 🎉"}]
    ids = chat_ids(tokenizer, messages)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert encode_text(tokenizer, "hi 🎉", use_chat_template=True) == ids
    assert encode_text(tokenizer, "hi") == list(tokenizer("hi")["input_ids"])


def test_chat_template_missing_and_dict_results():
    class Tok:
        chat_template = None

        def apply_chat_template(self, messages, **kwargs):
            return {"input_ids": [1, 2, len(messages)]}

    tok = Tok()
    with pytest.raises(UserError, match="no chat template"):
        chat_ids(tok, [{"role": "user", "content": "x"}])
    with pytest.raises(UserError, match="--use_chat_template"):
        encode_text(tok, "x", use_chat_template=True)
    tok.chat_template = "{{ messages }}"
    assert chat_ids(tok, [{"role": "user", "content": "x"}]) == [1, 2, 1]


def test_stop_strings():
    assert find_stop("abc STOP def END", ["END", "STOP"]) == (4, "STOP")
    assert find_stop("abc", ["x"]) is None and find_stop("abc", []) is None
    # only occurrences ending past `start` are looked for; one straddling it is found
    assert find_stop("abc STOP", ["STOP"], start=6) == (4, "STOP")
    assert stop_hold("text ST", ["STOP"]) == 2
    assert stop_hold("text", ["STOP"]) == 0
    assert stop_hold("text STOP", ["STOP"]) == 0  # a whole stop string is find_stop's, not a hold
    tok = ByteTokenizer()
    tok.vocab = [b"ab", b"ST", b"OP", b"cd"]
    assert stop_token_count(tok, [0, 1, 2, 3], "STOP") == 3
