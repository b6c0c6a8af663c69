"""Tokenizer identity: what a persisted n-gram cache records about the tokenizer it was built with.

Token ids mean nothing without their tokenizer, so every cache file names one and a cache
is only used with a tokenizer whose vocabulary is identical. Two identities are
*compatible* when their vocabulary size and vocabulary hash agree; the name is for people
(the same tokenizer loaded from two folders has two names and is still compatible).

The vocabulary hash is SHA-256 over the vocabulary sorted by id, each entry encoded as
``<id as decimal ASCII> 0x00 <token string as UTF-8> 0x00``.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import UserError


@dataclass(frozen=True)
class TokenizerIdentity:
    name: str
    vocab_size: int
    vocab_sha256: bytes  # 32 bytes

    def __post_init__(self) -> None:
        if len(self.vocab_sha256) != 32:
            raise ValueError("vocab_sha256 must be 32 bytes")

    def compatible(self, other: "TokenizerIdentity") -> bool:
        return self.vocab_size == other.vocab_size and self.vocab_sha256 == other.vocab_sha256

    def describe(self) -> str:
        return f"'{self.name}' (vocab {self.vocab_size}, hash {self.vocab_sha256.hex()[:12]})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "vocab_sha256": self.vocab_sha256.hex()}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "TokenizerIdentity":
        """Parse ``{"name", "vocab_size", "vocab_sha256"}``; raise :class:`UserError` naming ``where``."""
        try:
            name = obj["name"]
            size = obj["vocab_size"]
            digest = bytes.fromhex(obj["vocab_sha256"])
            if not isinstance(name, str) or not isinstance(size, int) or size <= 0 or len(digest) != 32:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise UserError(
                f"{where}: 'tokenizer' must be an object with 'name' (string), 'vocab_size' (positive "
                "integer) and 'vocab_sha256' (64 hex digits)"
            ) from None
        return cls(name, size, digest)

    @classmethod
    def from_vocab(cls, vocab: Mapping[str, int], name: str) -> "TokenizerIdentity":
        h = hashlib.sha256()
        for token, idx in sorted(vocab.items(), key=lambda item: item[1]):
            h.update(str(idx).encode("ascii") + b"\0" + token.encode("utf-8") + b"\0")
        return cls(name, len(vocab), h.digest())

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, name: str | None = None) -> "TokenizerIdentity":
        """Identity of a Hugging Face tokenizer (anything with ``get_vocab()``)."""
        if isinstance(tokenizer, TokenizerIdentity):
            return tokenizer
        vocab = tokenizer.get_vocab()
        if name is None:
            path = str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
            name = os.path.basename(os.path.normpath(path)) or path
        return cls.from_vocab(vocab, name)
