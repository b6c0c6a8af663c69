"""OpenAI's two shapes of log-probabilities, from a completion's per-token entries.

The values are the engine's (:mod:`promptlookup.runtime.logprobs`: the target's raw logits
at each emitted token's position, equal under prompt lookup to plain decoding's). This
module only names the tokens and lays the values out:

- completions (the legacy shape, ``logprobs: int``)::

    {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}], "text_offset": [int]}

  ``top_logprobs[i]`` holds the ``logprobs`` most likely tokens at position ``i`` plus the
  chosen one (so up to ``logprobs + 1`` entries, as OpenAI documents); ``text_offset[i]``
  is where token ``i``'s text starts in the choice's ``text``: the characters the earlier
  tokens' bytes complete (a character split over tokens counts once, where it completes).
- chat (``logprobs: true``, ``top_logprobs: int``)::

    {"content": [{"token": str, "logprob": float, "bytes": [int], "top_logprobs": [{"token", "logprob", "bytes"}]}],
     "refusal": None}

A token's string is its UTF-8 bytes decoded; a token holding part of a character (byte-level
BPE splits multi-byte characters) is written ``"bytes:\\xe2\\x80"``, as OpenAI writes such
tokens, and its ``bytes`` are exact. Streaming sends each chunk the entries of the tokens
that arrived since the last chunk (:class:`LogprobWriter` keeps the count), so the chunks'
entries concatenate to the non-streamed response's.

Cost: O(tokens x (1 + top)) per choice; a token's string is computed once per server.
"""
from __future__ import annotations

import codecs
import re
from typing import Any, Sequence

from ..runtime.results import TokenLogprob

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_table()


class TokenTexts:
    """Each token id's bytes and display string for one tokenizer, computed once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self._cache: dict[int, tuple[bytes, str]] = {}

    def bytes_of(self, token: int) -> bytes:
        """The token's UTF-8 bytes: byte-level BPE pieces mapped back to bytes, ``<0xAB>``
        byte-fallback pieces as that byte, anything else as the tokenizer writes it."""
        piece = self.tokenizer.convert_ids_to_tokens(int(token))
        if piece is None:
            return b""
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        if self.byte_level and all(c in _BYTE_LEVEL for c in piece):
            return bytes(_BYTE_LEVEL[c] for c in piece)
        return self.tokenizer.convert_tokens_to_string([piece]).encode("utf-8", "surrogatepass")

    def get(self, token: int) -> tuple[bytes, str]:
        """(bytes, string): the string is ``"bytes:\\x.."`` where the bytes are not whole UTF-8."""
        hit = self._cache.get(token)
        if hit is None:
            raw = self.bytes_of(token)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token] = (raw, text)
        return hit


class LogprobWriter:
    """One choice's log-probabilities in OpenAI's shape (``chat`` or legacy), written in
    pieces: :meth:`take` formats the entries not yet sent, up to the output's length."""

    def __init__(self, texts: TokenTexts, chat: bool, top: int, text_offset: int = 0) -> None:
        self.texts, self.chat, self.top = texts, chat, top
        self.sent = 0  # entries already written
        self.text_offset = text_offset  # where the next token's text starts (legacy shape)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # holds a character's first bytes

    def take(self, entries: Sequence[TokenLogprob] | None, upto: int) -> dict[str, Any] | None:
        """The entries ``[sent, upto)`` (``upto``: the output's token count now, after any stop
        cut), formatted; None when ``entries`` is None (the request asked for none)."""
        if entries is None:
            return None
        new = list(entries[self.sent : max(self.sent, upto)])
        self.sent += len(new)
        return self._chat(new) if self.chat else self._legacy(new)

    def _chat(self, new: Sequence[TokenLogprob]) -> dict[str, Any]:
        content = []
        for e in new:
            raw, text = self.texts.get(e.token)
            tops = []
            for token, value in e.top[: self.top]:
                t_raw, t_text = self.texts.get(token)
                tops.append({"token": t_text, "logprob": value, "bytes": list(t_raw)})
            content.append({"token": text, "logprob": e.logprob, "bytes": list(raw), "top_logprobs": tops})
        return {"content": content, "refusal": None}

    def _legacy(self, new: Sequence[TokenLogprob]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for e in new:
            raw, text = self.texts.get(e.token)
            tokens.append(text)
            values.append(e.logprob)
            top = {self.texts.get(t)[1]: v for t, v in e.top[: self.top]}
            top.setdefault(text, e.logprob)  # the chosen token is always there (OpenAI: up to logprobs + 1)
            tops.append(top)
            offsets.append(self.text_offset)
            self.text_offset += len(self._utf8.decode(raw))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
