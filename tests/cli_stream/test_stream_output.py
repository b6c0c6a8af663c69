"""Streaming detokenization and colour on a real tokenizer (SmolLM2's, from the bundled GGUF)."""
from __future__ import annotations

import argparse
import io
import random
import re

import pytest

from promptlookup.stream_output import (
    DRAFT_COLOR,
    RESET,
    StreamPrinter,
    add_color_argument,
    color_mode,
    colorize,
    decode_text,
    draft_segments,
)
from promptlookup.runtime.results import StepEvent
from promptlookup.errors import UserError

ANSI = re.compile(r"\x1b\[[0-9;]*m")

TEXTS = [
    "Héllo wörld! Ça va? naïve café, São Paulo, Zürich.",
    "你好，世界。日本語のテキストも。한국어 문장.",
    "Party 🎉🚀 family 👩\u200d👩\u200d👧 flag 🇫🇷 done 🙂",
    "  leading spaces, double  spaces,\n  an indented line\n\nand tabs\tok.",
    " The quick brown fox , jumps . over the lazy dog ' s tail n't",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def encoded(tokenizer):
    out = []
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert decode_text(tokenizer, ids) == text  # the round trip the test relies on
        out.append(ids)
    return out


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def stream(tokenizer, ids, cuts, drafts=None, color=False):
    """Feed ``ids`` split at ``cuts``; return (what was written before finish, full output, texts)."""
    out = io.StringIO()
    printer = StreamPrinter(tokenizer, out, color=color, num_sequences=1)
    bounds = [0, *cuts, len(ids)]
    final = decode_text(tokenizer, ids)
    for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
        printer.on_step(StepEvent(0, ids[a:b], drafts[j] if drafts else 0))
        shown = ANSI.sub("", out.getvalue())
        assert final.startswith(shown)  # never prints anything it would have to take back
        if "\ufffd" not in final:
            assert "\ufffd" not in shown  # incomplete characters are held back
    before = out.getvalue()
    texts = printer.finish()
    return before, out.getvalue(), texts


def test_every_single_cut_concatenates_to_the_final_text(tokenizer, encoded):
    for ids in encoded:
        final = decode_text(tokenizer, ids)
        for c in range(1, len(ids)):
            _, written, texts = stream(tokenizer, ids, [c])
            assert written == final + "\n"
            assert texts == [final]


def test_token_by_token_and_every_pair_of_cuts(tokenizer, encoded):
    for ids in encoded:
        final = decode_text(tokenizer, ids)
        _, written, _ = stream(tokenizer, ids, list(range(1, len(ids))))
        assert written == final + "\n"
        for a in range(1, len(ids)):
            for b in range(a + 1, len(ids), 3):
                _, written, _ = stream(tokenizer, ids, [a, b])
                assert written == final + "\n"


def test_multibyte_characters_really_span_tokens(tokenizer, encoded):
    # guard: the cases above only mean something if characters are split across tokens
    split = sum("\ufffd" in decode_text(tokenizer, ids[:c]) for ids in encoded for c in range(1, len(ids)))
    assert split > 10


def test_random_chunkings_with_colour(tokenizer, encoded):
    rng = random.Random(1234)
    for ids in encoded:
        final = decode_text(tokenizer, ids)
        for _ in range(30):
            cuts = sorted(rng.sample(range(1, len(ids)), rng.randint(1, min(8, len(ids) - 1))))
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(ids)])]
            drafts = [rng.randint(0, n - 1) for n in sizes]
            _, written, _ = stream(tokenizer, ids, cuts, drafts, color=True)
            assert ANSI.sub("", written) == final + "\n"


def test_draft_text_is_highlighted_exactly_on_ascii(tokenizer):
    ids = tokenizer.encode("The cat sat on the mat and the cat sat on the hat.", add_special_tokens=False)
    # steps: 1 own; 4 drafted + 1 own; rest own
    cuts = [1, 6]
    _, written, _ = stream(tokenizer, ids, cuts, drafts=[0, 4, 0], color=True)
    coloured = re.findall(re.escape(DRAFT_COLOR) + r"(.*?)" + re.escape(RESET), written, flags=re.S)
    assert "".join(coloured) == decode_text(tokenizer, ids[:5])[len(decode_text(tokenizer, ids[:1])) :]


def test_no_colour_codes_unless_enabled(tokenizer, encoded):
    ids = encoded[2]
    _, written, _ = stream(tokenizer, ids, [3, 9], drafts=[2, 5, 0], color=False)
    assert "\x1b" not in written
    assert color_mode("auto", io.StringIO()) is False  # piped: off
    assert color_mode("never", TTY()) is False
    assert color_mode(None, TTY()) is False  # off by default
    assert color_mode("always", io.StringIO()) is True  # forced


def test_auto_colour_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert color_mode("auto", TTY()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert color_mode("auto", TTY()) is False
    with pytest.raises(UserError, match="--color"):
        color_mode("sometimes", TTY())


def test_color_argument_defaults():
    parser = argparse.ArgumentParser()
    add_color_argument(parser)
    assert parser.parse_args([]).color == "never"
    assert parser.parse_args(["--color"]).color == "auto"
    assert parser.parse_args(["--color", "always"]).color == "always"


def test_several_sequences_print_blocks_at_finish(tokenizer, encoded):
    out = io.StringIO()
    printer = StreamPrinter(tokenizer, out, color=False, num_sequences=2)
    a, b = encoded[3], encoded[1]
    for i, ids in ((0, a), (1, b)):
        for s in range(0, len(ids), 5):
            printer.on_step(StepEvent(i, ids[s : s + 5], 2))
    assert out.getvalue() == ""  # nothing interleaved while generating
    texts = printer.finish()
    assert texts == [decode_text(tokenizer, a), decode_text(tokenizer, b)]
    indent = " " * 4
    expected = "[0] " + texts[0].replace("\n", "\n" + indent) + "\n" + "[1] " + texts[1].replace("\n", "\n" + indent) + "\n"
    assert out.getvalue() == expected
    assert printer.finish() == texts and out.getvalue() == expected  # idempotent


def test_colorize_finished_sequence_from_flags(tokenizer, encoded):
    ids = encoded[0]
    flags = [(j // 3) % 2 == 1 for j in range(len(ids))]
    coloured = colorize(tokenizer, ids, flags)
    assert ANSI.sub("", coloured) == decode_text(tokenizer, ids)
    assert DRAFT_COLOR in coloured
    assert colorize(tokenizer, ids, flags, color=False) == decode_text(tokenizer, ids)
    segs = draft_segments(tokenizer, ids, flags)
    assert "".join(t for t, _ in segs) == decode_text(tokenizer, ids)
    with pytest.raises(ValueError):
        draft_segments(tokenizer, ids, flags[:-1])


def test_special_tokens_are_skipped(tokenizer, encoded):
    ids = encoded[0] + [tokenizer.eos_token_id]
    _, written, texts = stream(tokenizer, ids, [4])
    assert texts == [TEXTS[0]] and written == TEXTS[0] + "\n"


class RewritingTokenizer:
    """Not prefix-stable: the text of a longer list rewrites earlier characters."""

    def decode(self, ids, **kwargs):
        text = "".join(chr(97 + i % 26) for i in ids)
        return text.upper() if len(ids) > 3 else text


def test_unstable_decoder_gets_its_text_reprinted():
    out = io.StringIO()
    printer = StreamPrinter(RewritingTokenizer(), out, color=False, num_sequences=1)
    printer.on_step(StepEvent(0, [0, 1], 0))
    printer.on_step(StepEvent(0, [2, 3, 4], 0))
    assert printer.finish() == ["ABCDE"]
    assert out.getvalue() == "ab\nABCDE\n"
