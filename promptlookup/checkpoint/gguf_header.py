"""Reading a GGUF file's model geometry from its metadata alone (no tensors, no torch).

``convert_checkpoint.py --gguf_file`` checks ``--tp_size``/``--pp_size`` against the
model's heads and layers with this before the (tens of seconds long) dequantizing load,
as ``--model_dir`` does with ``config.json``.

Layout read (GGUF v2/v3, little endian, as documented in ggml's ``docs/gguf.md``): the
magic ``GGUF``, ``uint32`` version, ``uint64`` tensor count, ``uint64`` key/value count,
then the key/value pairs, each a string key (``uint64`` length + UTF-8 bytes), a ``uint32``
value type and the value. Reading stops as soon as the wanted keys are known, so the cost
is O(metadata before them), usually a few kilobytes.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import UserError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # no metadata string is this long; a larger length means a damaged file

# GGUF key (after "<arch>.") -> the Hugging Face config name Layout.from_hf_config reads.
_GEOMETRY = {
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "vocab_size": "vocab_size",
}
_TOKENS = "tokenizer.ggml.tokens"


class _Damaged(Exception):
    pass


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Damaged("truncated metadata")
    return data


def _unpack(fh: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]


def _string(fh: BinaryIO) -> str:
    n = _unpack(fh, "<Q")
    if n > _MAX_STRING:
        raise _Damaged(f"a string of {n} bytes")
    return _read(fh, n).decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int) -> Any:
    """The value of type ``vtype``; arrays are skipped and returned as their length."""
    if vtype in _SCALARS:
        return _unpack(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype == _ARRAY:
        item_type, count = _unpack(fh, "<I"), _unpack(fh, "<Q")
        if item_type in _SCALARS:
            fh.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        elif item_type in (_STRING, _ARRAY):
            for _ in range(count):
                _value(fh, item_type)
        else:
            raise _Damaged(f"array item type {item_type}")
        return count
    raise _Damaged(f"value type {vtype}")


def read_gguf_geometry(path: str | Path) -> tuple[str, dict[str, int]]:
    """The architecture and the Hugging Face-named geometry of a GGUF model.

    Returns ``(architecture, config)`` where ``config`` holds whichever of
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``,
    ``intermediate_size`` and ``vocab_size`` the file records (the vocabulary size falls
    back to the length of ``tokenizer.ggml.tokens``). Raises :class:`UserError` for a file
    whose metadata cannot be parsed.
    """
    path = Path(path)
    arch: str | None = None
    found: dict[str, int] = {}
    tokens: int | None = None
    try:
        with path.open("rb") as fh:
            if _read(fh, 4) != b"GGUF":
                raise _Damaged("no GGUF magic")
            version = _unpack(fh, "<I")
            if version not in (2, 3):
                raise _Damaged(f"GGUF version {version}")
            _unpack(fh, "<Q")  # tensor count
            for _ in range(_unpack(fh, "<Q")):
                key, vtype = _string(fh), _unpack(fh, "<I")
                value = _value(fh, vtype)
                if key == "general.architecture":
                    arch = str(value)
                elif key == _TOKENS:
                    tokens = int(value)
                elif arch is not None and key.startswith(arch + ".") and key[len(arch) + 1:] in _GEOMETRY:
                    if isinstance(value, int) and not isinstance(value, bool):
                        found[_GEOMETRY[key[len(arch) + 1:]]] = value
                if arch is not None and len(found) == len(_GEOMETRY):
                    break
    except (_Damaged, struct.error, OSError, ValueError) as exc:
        raise UserError(f"cannot read GGUF file {path}; it is corrupt, truncated or unsupported ({exc})") from None
    if arch is None:
        raise UserError(f"cannot read GGUF file {path}; its metadata names no general.architecture")
    if "vocab_size" not in found and tokens is not None:
        found["vocab_size"] = tokens
    return arch, found
