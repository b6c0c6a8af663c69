"""Streaming and coloured text output for ``run.py`` and the MLX-style decoder.

Text rule and incremental detokenization: :mod:`promptlookup.text` (the text of a sequence
is ``decode_text(tokenizer, ids)``; :class:`IncrementalText` releases it through one
:class:`~promptlookup.text.IncrementalDetokenizer`, O(new tokens) per step, holding back
incomplete characters). If a decoder ever breaks prefix stability,
:meth:`StreamPrinter.finish` reprints the sequence's full text on a new line.

Several sequences: only a batch of one is streamed live. With more, interleaved chunks
would be unreadable, so the printer collects tokens and :meth:`StreamPrinter.finish`
prints each text as a block, the first line prefixed ``[i] `` and the following lines
indented to match.

A closed pipe (``run.py --streaming | head -1``): the printer's writes stop at the first
:class:`BrokenPipeError`, the stream's file descriptor is pointed at ``/dev/null`` (so later
prints of the script cannot fail half-way), and :attr:`StreamPrinter.pipe_closed` is set;
generation goes on, and the script writes the files it was asked for before it exits 141.

Colour (``--color``): tokens that came from accepted drafts (the first ``accepted``
tokens of each step event, or ``SequenceResult.draft_flags``) are shown in
:data:`DRAFT_COLOR`, as the MLX and llama.cpp prompt-lookup demos highlight them. Colour
is off by default and is only emitted to a terminal unless forced with ``always``.
"""
from __future__ import annotations

import argparse
import os
from typing import Protocol, Sequence, TextIO

from .errors import UserError
from .text import REPLACEMENT, IncrementalDetokenizer, Tokenizer, decode_text

DRAFT_COLOR = "\x1b[32m"  # green: text the target accepted from a draft
RESET = "\x1b[0m"
COLOR_CHOICES = ("auto", "always", "never")

Segment = tuple[str, bool]  # (text, came from an accepted draft)


class StepEvent(Protocol):
    """What the printer reads of a step event (``runtime.results.StepEvent``)."""

    index: int
    tokens: list[int]
    accepted: int


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
    """One sequence's growing text as segments, released only where it is stable.

    A thin view of one :class:`~promptlookup.text.IncrementalDetokenizer`: a step's accepted
    draft tokens and its other tokens are pushed separately, so a character belongs to the
    run whose last token completes it. Cost: the detokenizer's, O(new tokens) per push.
    """

    def __init__(self, tokenizer: Tokenizer, track_drafts: bool = True) -> None:
        self.tokenizer = tokenizer
        self.track_drafts = track_drafts
        self._detok = IncrementalDetokenizer(tokenizer)

    @property
    def ids(self) -> list[int]:
        return self._detok.ids

    @property
    def shown(self) -> str:
        return self._detok.text

    @property
    def broken(self) -> bool:
        return self._detok.broken

    def push(self, tokens: Sequence[int], accepted: int = 0) -> list[Segment]:
        """Append one step's tokens; return the newly stable text as segments."""
        tokens = [int(t) for t in tokens]
        cut = min(accepted, len(tokens)) if self.track_drafts and accepted > 0 else 0
        segments: list[Segment] = []
        for part, drafted in ((tokens[:cut], True), (tokens[cut:], False)):
            text = self._detok.push(part) if len(part) else ""
            if text:
                segments.append((text, drafted))
        return segments

    def flush(self) -> list[Segment]:
        """Release everything, including a trailing U+FFFD that never completed (nothing if ``broken``)."""
        text = self._detok.flush()
        return [(text, False)] if text else []


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
            tail = seq.flush()
            if seq.broken:
                self._emit("\n" + render(draft_segments(self.tokenizer, seq.ids, self._flags[0]), self.color))
            else:
                self._write(tail)
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
