"""Streaming and coloured text output for ``run.py``.

Text rule (used everywhere here, so streamed text and final text always agree): the text
of a sequence is ``tokenizer.decode(ids, skip_special_tokens=True,
clean_up_tokenization_spaces=False)``. Clean-up is off because it rewrites text that is
already on screen (``"word ,"`` becomes ``"word,"`` only once the comma arrives); with it
off, the decoders of byte-level BPE and SentencePiece tokenizers are *prefix-stable*: the
text of a token prefix is a prefix of the text of the whole sequence, except for a
trailing U+FFFD where a multi-byte character is still incomplete.

Incremental detokenization (:class:`IncrementalText`): after each step the whole token list
of the sequence is decoded again, trailing U+FFFD characters are held back, and only the
new stable suffix is printed. Decoding the whole list (rather than the new tokens alone)
keeps SentencePiece's and BPE's leading spaces right across chunk boundaries. Cost: O(n)
per step for a sequence of n tokens (two decodes when colour is on), small next to a
model forward pass. If a decoder ever breaks prefix stability, nothing more is streamed
for that sequence and :meth:`StreamPrinter.finish` reprints its full text on a new line.

Several sequences: only a batch of one is streamed live. With more, interleaved chunks
would be unreadable, so the printer collects tokens and :meth:`StreamPrinter.finish`
prints each text as a block, the first line prefixed ``[i] `` and the following lines
indented to match.

A closed pipe (``run.py --streaming | head -1``): the printer's writes stop at the first
:class:`BrokenPipeError`, the stream's file descriptor is pointed at ``/dev/null`` (so later
prints of the script cannot fail half-way), and :attr:`StreamPrinter.pipe_closed` is set;
generation goes on, and the script writes the files it was asked for before it exits 141.

Colour (``--color``): tokens that came from accepted drafts (the first ``accepted``
tokens of each :class:`StepEvent`, or ``SequenceResult.draft_flags``) are shown in
:data:`DRAFT_COLOR`, as the MLX and llama.cpp prompt-lookup demos highlight them. Colour
is off by default and is only emitted to a terminal unless forced with ``always``.
"""
from __future__ import annotations

import argparse
import os
from typing import Protocol, Sequence, TextIO

from ..runtime.results import StepEvent
from ..errors import UserError

DRAFT_COLOR = "\x1b[32m"  # green: text the target accepted from a draft
RESET = "\x1b[0m"
COLOR_CHOICES = ("auto", "always", "never")
REPLACEMENT = "\ufffd"

Segment = tuple[str, bool]  # (text, came from an accepted draft)


class Tokenizer(Protocol):
    def decode(self, ids: Sequence[int], **kwargs: object) -> str: ...


def decode_text(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """The text rule of this module (see the module docstring)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _stable(text: str) -> str:
    return text.rstrip(REPLACEMENT)


# --------------------------------------------------------------------------- colour mode


def color_mode(flag: str | None, stream: TextIO) -> bool:
    """Whether to emit ANSI colour on ``stream`` for ``--color {auto,always,never}``.

    ``None``/``"never"``: off (the default). ``"always"``: on. ``"auto"``: on only when
    ``stream`` is a terminal, ``NO_COLOR`` is unset and ``TERM`` is not ``dumb``.
    """
    if flag is None or flag == "never":
        return False
    if flag == "always":
        return True
    if flag != "auto":
        raise UserError(f"--color must be one of {', '.join(COLOR_CHOICES)}, got {flag!r}")
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # closed or detached streams
        return False


def add_color_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--color [{auto,always,never}]``: default ``never``, bare ``--color`` means ``auto``."""
    parser.add_argument(
        "--color",
        nargs="?",
        const="auto",
        default="never",
        choices=COLOR_CHOICES,
        help="highlight tokens that came from accepted drafts (bare --color: auto, i.e. only on a terminal)",
    )


def render(segments: Sequence[Segment], color: bool, indent: str = "") -> str:
    """Join segments, colouring draft ones; ``indent`` follows every newline.

    Colour codes never span a newline, so an indent (or a pager) is never coloured.
    """
    out = []
    for text, drafted in segments:
        lines = text.split("\n")
        for j, line in enumerate(lines):
            if j:
                out.append("\n" + indent)
            if line:
                out.append(f"{DRAFT_COLOR}{line}{RESET}" if color and drafted else line)
    return "".join(out)


# --------------------------------------------------------------------------- draft segments


def draft_segments(tokenizer: Tokenizer, ids: Sequence[int], draft_flags: Sequence[bool]) -> list[Segment]:
    """Split the text of ``ids`` into runs that came from accepted drafts or not.

    Character attribution: a character belongs to the run whose last token completes it.
    Cost: one decode per run of equal flags, O(runs * n).
    """
    if len(draft_flags) != len(ids):
        raise ValueError(f"{len(draft_flags)} draft flags for {len(ids)} tokens")
    text = decode_text(tokenizer, ids)
    segments: list[Segment] = []
    start = 0
    j = 0
    while j < len(ids):
        k = j
        while k < len(ids) and draft_flags[k] == draft_flags[j]:
            k += 1
        end = len(text) if k == len(ids) else len(_stable(decode_text(tokenizer, ids[:k])))
        end = max(start, min(end, len(text)))
        if end > start:
            segments.append((text[start:end], bool(draft_flags[j])))
        start = end
        j = k
    if start < len(text):  # only if a decoder is not prefix-stable
        segments.append((text[start:], False))
    return segments


def colorize(tokenizer: Tokenizer, ids: Sequence[int], draft_flags: Sequence[bool], color: bool = True) -> str:
    """The text of a finished sequence with accepted-draft tokens highlighted (non-streaming)."""
    return render(draft_segments(tokenizer, ids, draft_flags), color)


# --------------------------------------------------------------------------- incremental text


class IncrementalText:
    """One sequence's growing text, released only where it is stable.

    Invariants: ``shown`` is a prefix of the text of ``ids`` (unless ``broken``);
    ``_bounds`` holds ``(end, drafted)`` with non-decreasing ``end``, one or two per push,
    attributing each character of the stable text to draft or target tokens.
    """

    def __init__(self, tokenizer: Tokenizer, track_drafts: bool = True) -> None:
        self.tokenizer = tokenizer
        self.track_drafts = track_drafts
        self.ids: list[int] = []
        self.shown = ""
        self.broken = False
        self._bounds: list[tuple[int, bool]] = []
        self._next_bound = 0  # first bound whose end is past len(shown)

    def push(self, tokens: Sequence[int], accepted: int = 0) -> list[Segment]:
        """Append one step's tokens; return the newly stable text as segments."""
        base = len(self.ids)
        self.ids.extend(int(t) for t in tokens)
        if self.broken:
            return []
        if self.track_drafts and accepted > 0:
            cut = base + min(accepted, len(tokens))
            self._bounds.append((len(_stable(decode_text(self.tokenizer, self.ids[:cut]))), True))
        stable = _stable(decode_text(self.tokenizer, self.ids))
        self._bounds.append((len(stable), False))
        return self._release(stable)

    def flush(self) -> list[Segment]:
        """Release everything, including a trailing U+FFFD that never completed."""
        text = decode_text(self.tokenizer, self.ids)
        if self.broken:
            return []
        self._bounds.append((len(text), False))
        return self._release(text)

    def _release(self, text: str) -> list[Segment]:
        if not text.startswith(self.shown):
            self.broken = True
            return []
        segments: list[Segment] = []
        pos = len(self.shown)
        while pos < len(text):
            while self._next_bound < len(self._bounds) and self._bounds[self._next_bound][0] <= pos:
                self._next_bound += 1
            if self._next_bound < len(self._bounds):
                end, drafted = self._bounds[self._next_bound]
                end = min(end, len(text))
            else:
                end, drafted = len(text), False
            segments.append((text[pos:end], drafted))
            pos = end
        self.shown = text
        return segments


# --------------------------------------------------------------------------- printer


class StreamPrinter:
    """A :data:`StepCallback` that prints text as verification steps accept it.

    ``num_sequences == 1``: text is written (and flushed) chunk by chunk; :meth:`finish`
    writes any held-back tail and a newline. ``num_sequences > 1``: nothing is written
    until :meth:`finish`, which prints each sequence as a block prefixed ``[i] ``.
    :meth:`finish` returns the full texts (the module's text rule) either way; calling it
    again returns the same texts without printing.
    """

    def __init__(self, tokenizer: Tokenizer, stream: TextIO, color: bool, num_sequences: int) -> None:
        if num_sequences < 1:
            raise ValueError(f"num_sequences must be at least 1, got {num_sequences}")
        self.tokenizer = tokenizer
        self.stream = stream
        self.color = color
        self.live = num_sequences == 1
        self._texts = [IncrementalText(tokenizer, track_drafts=color) for _ in range(num_sequences)]
        self._flags: list[list[bool]] = [[] for _ in range(num_sequences)]
        self._finished: list[str] | None = None
        self.pipe_closed = False  # the stream's reader went away (BrokenPipeError); nothing more is written

    def on_step(self, event: StepEvent) -> None:
        seq = self._texts[event.index]
        n_draft = min(max(event.accepted, 0), len(event.tokens))
        if self.live:
            self._write(seq.push(event.tokens, n_draft))
        else:
            seq.ids.extend(int(t) for t in event.tokens)
        self._flags[event.index].extend([True] * n_draft + [False] * (len(event.tokens) - n_draft))

    __call__ = on_step

    def _write(self, segments: Sequence[Segment], indent: str = "") -> None:
        text = render(segments, self.color, indent)
        if text:
            self._emit(text)

    def _emit(self, text: str) -> None:
        """Write and flush ``text``, unless the reader has gone (see the module docstring)."""
        if self.pipe_closed:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            self.pipe_closed = True
            try:  # what is still buffered, and every later print, goes nowhere instead of failing
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass

    def finish(self) -> list[str]:
        if self._finished is not None:
            return list(self._finished)
        texts = [decode_text(self.tokenizer, seq.ids) for seq in self._texts]
        if self.live:
            seq = self._texts[0]
            if seq.broken:
                self._emit("\n" + render(draft_segments(self.tokenizer, seq.ids, self._flags[0]), self.color))
            else:
                self._write(seq.flush())
            self._emit("\n")
        else:
            for i, seq in enumerate(self._texts):
                prefix = f"[{i}] "
                body = render(draft_segments(self.tokenizer, seq.ids, self._flags[i]), self.color, " " * len(prefix))
                self._emit(prefix + body + "\n")
        self._finished = texts
        return list(texts)


__all__ = [
    "COLOR_CHOICES",
    "DRAFT_COLOR",
    "RESET",
    "IncrementalText",
    "StreamPrinter",
    "add_color_argument",
    "color_mode",
    "colorize",
    "decode_text",
    "draft_segments",
    "render",
]
