"""Text handling, once for the CLI, the LLM API, the server and the evaluation: encode,
decode, the chat template, incremental detokenization and stop strings.

Text rule (used everywhere, so streamed text and final text always agree): the text of a
sequence is ``tokenizer.decode(ids, skip_special_tokens=True,
clean_up_tokenization_spaces=False)`` (:func:`decode_text`). Clean-up is off because it
rewrites text that is already on screen (``"word ,"`` becomes ``"word,"`` only once the
comma arrives); with it off, the decoders of byte-level BPE and SentencePiece tokenizers
are *prefix-stable*: the text of a token prefix is a prefix of the text of the whole
sequence, except for a trailing U+FFFD where a multi-byte character is still incomplete.

Chat template (:func:`chat_ids`): the messages rendered with ``add_generation_prompt=True``
and tokenized by the template (no extra BOS), whatever container the tokenizer returns.

Incremental detokenization (:class:`IncrementalDetokenizer`): each push decodes only a
window of the newest tokens (those not yet released plus the previous release's tokens as
context, so SentencePiece's and BPE's leading spaces stay right across chunk boundaries),
releases the window's new text unless it ends in U+FFFD (an incomplete character is held
back until its last byte arrives) and slides the window on. Cost: O(new tokens + previous
release) per push, independent of the sequence length; :meth:`IncrementalDetokenizer.flush`
decodes the whole sequence once to check the released text against the text rule.

Stop strings (:func:`find_stop`, :func:`stop_hold`, :func:`stop_token_count`): a text is
cut before the first stop string; while streaming, a tail that could still become a stop
string is held back; the tokens kept are the shortest prefix whose text contains it.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from .errors import UserError

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete (or invalid) UTF-8 sequence


class Tokenizer(Protocol):
    def decode(self, ids: Sequence[int], **kwargs: object) -> str: ...


def decode_text(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """The text rule of this module (see the module docstring). Cost: one decode of ``ids``."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of ``messages`` (``{"role", "content"}`` dicts) rendered by the tokenizer's chat
    template with ``add_generation_prompt=True``. Raises :class:`UserError` without a template
    (callers that want their own message check :func:`has_chat_template` first)."""
    if not has_chat_template(tokenizer):
        raise UserError("this tokenizer has no chat template")
    ids = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def encode_text(tokenizer: Any, text: str, use_chat_template: bool = False) -> list[int]:
    """Token ids of a text prompt: as one user turn of the chat template, or tokenized as given
    (with the tokenizer's special tokens, e.g. Llama's BOS)."""
    if use_chat_template:
        if not has_chat_template(tokenizer):
            raise UserError("--use_chat_template: this tokenizer has no chat template")
        return chat_ids(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text)["input_ids"])


class IncrementalDetokenizer:
    """One sequence's growing text, released only where it is stable.

    Invariants: ``text`` is the text rule's text of ``ids[:_read]`` (a prefix of the text of
    ``ids``, unless ``broken``) and never ends inside a multi-byte character; ``_prefix <=
    _read <= len(ids)``, and ``ids[_prefix:_read]`` is the context window of the last release.
    Cost per :meth:`push`: two decodes of ``ids[_prefix:]`` (the tokens since the previous
    release began), not of the whole sequence.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.broken = False  # set by flush when the decoder was not prefix-stable
        self._prefix = 0
        self._read = 0

    def push(self, tokens: Sequence[int]) -> str:
        """Append tokens; return the newly stable text (empty while a character is incomplete)."""
        self.ids.extend(int(t) for t in tokens)
        if self.broken or len(self.ids) == self._read:
            return ""
        before = decode_text(self.tokenizer, self.ids[self._prefix:self._read]) if self._read > self._prefix else ""
        after = decode_text(self.tokenizer, self.ids[self._prefix:])
        if after.endswith(REPLACEMENT) or not after.startswith(before):
            return ""  # an incomplete character (or a not yet stable window): wait for more tokens
        new = after[len(before):]
        self.text += new
        self._prefix, self._read = self._read, len(self.ids)
        return new

    def flush(self) -> str:
        """Release everything, including a trailing U+FFFD that never completed.

        Decodes the whole sequence once (O(n)) and checks the released text against it; if
        they disagree (a decoder that is not prefix-stable), ``broken`` is set, ``text``
        becomes the full text and nothing is returned.
        """
        full = decode_text(self.tokenizer, self.ids)
        self._prefix = self._read = len(self.ids)
        if self.broken or not full.startswith(self.text):
            self.broken = True
            self.text = full
            return ""
        new = full[len(self.text):]
        self.text = full
        return new


# --------------------------------------------------------------------------- stop strings


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest ``(position, stop)`` of a stop string in ``text`` that ends past ``start``
    (text before ``start`` was searched already). Cost: O((len(text) - start + longest stop) *
    len(stops))."""
    hits = [(i, s) for s in stops if (i := text.find(s, max(0, start - len(s) + 1))) >= 0]
    return min(hits, default=None)


def stop_hold(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still grow into a stop string (held back
    while streaming). Cost: O(sum of squared stop lengths)."""
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def stop_token_count(tokenizer: Tokenizer, ids: Sequence[int], stop: str, at: int | None = None) -> int:
    """The length of the shortest prefix of ``ids`` whose text contains ``stop`` (``ids``' text
    contains it), or, with ``at``, contains the occurrence of ``stop`` at text position ``at``.
    Cost: one decode per token dropped from the end (a few, once per request)."""
    keep = len(ids)
    while keep > 1 and (stop in decode_text(tokenizer, ids[: keep - 1]) if at is None
                        else decode_text(tokenizer, ids[: keep - 1]).find(stop, at) == at):
        keep -= 1
    return keep


__all__ = [
    "REPLACEMENT",
    "IncrementalDetokenizer",
    "Tokenizer",
    "chat_ids",
    "decode_text",
    "encode_text",
    "find_stop",
    "has_chat_template",
    "stop_hold",
    "stop_token_count",
]
