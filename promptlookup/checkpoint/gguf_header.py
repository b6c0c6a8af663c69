"""Reading a GGUF file's metadata: the model geometry, and where each tensor lies (no torch).

``convert_checkpoint.py --gguf_file`` checks ``--tp_size``/``--pp_size`` against the
model's heads and layers with this before the (tens of seconds long) dequantizing load,
as ``--model_dir`` does with ``config.json``.

Layout read (GGUF v2/v3, little endian, as documented in ggml's ``docs/gguf.md``): the
magic ``GGUF``, ``uint32`` version, ``uint64`` tensor count, ``uint64`` key/value count,
then the key/value pairs, each a string key (``uint64`` length + UTF-8 bytes), a ``uint32``
value type and the value; then one record per tensor (its name, ``uint32`` dimension count,
``uint64`` dimensions fastest first, ``uint32`` GGML type, ``uint64`` offset), and the tensor
data from the next multiple of ``general.alignment`` (default 32). :func:`read_gguf_geometry`
stops as soon as the wanted keys are known, so its cost is O(metadata before them), usually a
few kilobytes; :func:`read_gguf_tensors` reads all the metadata (a vocabulary's strings
included: about 0.1 s for 49,152 tokens), never the tensor data.
"""
from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

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
# GGML type ids -> names (ggml.h); gguf_blocks.py reads F32, F16, BF16, Q4_0, Q4_1 and Q8_0
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
              18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
              26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16"}
_MAX_DIMS = 4


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor lies: ``shape`` rows first (GGUF lists the fastest dimension first),
    ``offset`` in bytes from the start of the file."""

    name: str
    kind: str
    shape: tuple[int, ...]
    offset: int


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


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[BinaryIO]:
    """``path`` open for reading; a damaged or unreadable file is one :class:`UserError`."""
    try:
        with path.open("rb") as fh:
            yield fh
    except (_Damaged, struct.error, OSError, ValueError) as exc:
        raise UserError(f"cannot read GGUF file {path}; it is corrupt, truncated or unsupported ({exc})") from None


def _counts(fh: BinaryIO) -> tuple[int, int]:
    """Check the magic and the version; return the tensor and key/value counts."""
    if _read(fh, 4) != b"GGUF":
        raise _Damaged("no GGUF magic")
    version = _unpack(fh, "<I")
    if version not in (2, 3):
        raise _Damaged(f"GGUF version {version}")
    return _unpack(fh, "<Q"), _unpack(fh, "<Q")


def _pairs(fh: BinaryIO, count: int) -> Iterator[tuple[str, Any]]:
    """The next ``count`` key/value pairs (arrays as their length, see :func:`_value`)."""
    for _ in range(count):
        key, vtype = _string(fh), _unpack(fh, "<I")
        yield key, _value(fh, vtype)


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
    with _reading(path) as fh:
        _, pairs = _counts(fh)
        for key, value in _pairs(fh, pairs):
            if key == "general.architecture":
                arch = str(value)
            elif key == _TOKENS:
                tokens = int(value)
            elif arch is not None and key.startswith(arch + ".") and key[len(arch) + 1:] in _GEOMETRY:
                if isinstance(value, int) and not isinstance(value, bool):
                    found[_GEOMETRY[key[len(arch) + 1:]]] = value
            if arch is not None and len(found) == len(_GEOMETRY):
                break
    if arch is None:
        raise UserError(f"cannot read GGUF file {path}; its metadata names no general.architecture")
    if "vocab_size" not in found and tokens is not None:
        found["vocab_size"] = tokens
    return arch, found


def read_gguf_tensors(path: str | Path) -> list[GGUFTensor]:
    """Every tensor record of a GGUF file, in file order. Raises :class:`UserError` for a file
    whose metadata cannot be parsed or whose tensors would lie past its end."""
    path = Path(path)
    alignment = 32
    tensors: list[tuple[str, str, tuple[int, ...], int]] = []
    with _reading(path) as fh:
        count, pairs = _counts(fh)
        for key, value in _pairs(fh, pairs):
            if key == "general.alignment":
                alignment = int(value)
        if alignment < 1:
            raise _Damaged(f"general.alignment {alignment}")
        for _ in range(count):
            name, dims = _string(fh), _unpack(fh, "<I")
            if not 1 <= dims <= _MAX_DIMS:
                raise _Damaged(f"tensor {name} has {dims} dimensions")
            shape = tuple(_unpack(fh, "<Q") for _ in range(dims))[::-1]
            kind = _unpack(fh, "<I")
            tensors.append((name, GGML_TYPES.get(kind, f"type {kind}"), shape, _unpack(fh, "<Q")))
        start = -(-fh.tell() // alignment) * alignment
        size = fh.seek(0, 2)
    out = [GGUFTensor(name, kind, shape, start + offset) for name, kind, shape, offset in tensors]
    if any(t.offset > size for t in out):
        raise UserError(f"cannot read GGUF file {path}; it is truncated (a tensor starts past its end)")
    return out
