"""``LLM(model)``'s model argument: an engine directory, or a Hugging Face Llama directory
or GGUF file converted and built once into a cache folder and reused.

Cache layout: ``<cache_dir>/<key>/engine`` where ``key`` hashes the source's resolved
path, the (relative path, mtime, size) of its files, the build settings and the engine
format version; a changed source or setting gets a new key, so a stale engine is never
reused. ``cache_dir`` defaults to ``$PROMPTLOOKUP_CACHE`` or ``~/.cache/promptlookup``.
Both the checkpoint and the engine are written to temporary folders and renamed into
place, so an interrupted build leaves nothing that looks complete. Cost: a stat of the
source's files per ``LLM``; a conversion and build (seconds to minutes) on a cache miss.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError

CACHE_ENV = "PROMPTLOOKUP_CACHE"


@dataclass(frozen=True)
class AutoBuild:
    """Limits of an engine built from a model source (build.sh's flags)."""

    max_batch_size: int = 8
    max_input_len: int = 2048
    max_seq_len: int = 3072  # cut to the model's max_position_embeddings
    max_draft_len: int = 32
    tokens_per_block: int = 32
    dtype: str = "float32"


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "promptlookup")


def is_engine_dir(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        raw = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "build_config" in raw and "pretrained_config" in raw


def _fingerprint(source: Path) -> list[tuple[str, int, int]]:
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.relative_to(source)) if f != source else f.name, st.st_mtime_ns, st.st_size))
    return out


def cache_key(source: Path, build: AutoBuild) -> str:
    from ..engine.config import ENGINE_FORMAT_VERSION

    blob = json.dumps([str(source.resolve()), _fingerprint(source), asdict(build), ENGINE_FORMAT_VERSION])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def existing_source(model: str | os.PathLike[str]) -> Path:
    """``model`` as a path; one that does not exist is a one-line :class:`UserError` (cheap:
    the CLIs call it before importing torch)."""
    source = Path(model).expanduser()
    if not source.exists():
        raise UserError(f"model {source} does not exist; pass an engine directory, a Hugging Face Llama "
                        "directory or a GGUF file")
    return source


def resolve_engine(model: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                   build: AutoBuild | None = None) -> Path:
    """The engine directory for ``model`` (building it into the cache on first use, with
    ``build``'s limits, default :class:`AutoBuild`). ``cache_dir`` and ``build`` shape that
    build, so with a built engine directory, which is used as it is, they are refused."""
    source = existing_source(model)
    if source.is_dir() and is_engine_dir(source):
        given = [name for name, v in (("cache_dir", cache_dir), ("build", build)) if v is not None]
        if given:
            raise UserError(f"{source} is a built engine, used as it is: {' and '.join(given)} shape the build of a "
                            "source (a Hugging Face directory or a GGUF file); drop "
                            f"{'it' if len(given) == 1 else 'them'}, or rebuild the engine with build.sh")
        return source
    build = build if build is not None else AutoBuild()
    from ..checkpoint.source import check_gguf_file, check_model_dir

    gguf = source.is_file()
    if gguf:
        check_gguf_file(source)
    else:
        check_model_dir(source)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / cache_key(source, build) / "engine"
    if is_engine_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from ..checkpoint.convert import convert_model
    from ..checkpoint.source import load_source_model
    from ..engine.build import build_config, build_torch_engine

    model_obj, tokenizer = load_source_model(gguf_file=str(source)) if gguf else load_source_model(model_dir=str(source))
    max_pos = int(getattr(model_obj.config, "max_position_embeddings", build.max_seq_len))
    if build.max_seq_len > max_pos and build.max_seq_len != AutoBuild.max_seq_len:  # asked for, not the default
        raise UserError(f"max_seq_len {build.max_seq_len} (--max_seq_len) exceeds the model's max_position_embeddings "
                        f"{max_pos}; ask for at most {max_pos}")
    max_seq_len = min(build.max_seq_len, max_pos)  # the default, cut to the model's limit
    max_input_len = min(build.max_input_len, max_seq_len - 1)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".checkpoint-") as tmp:
        ckpt = convert_model(model_obj, tokenizer, Path(tmp) / "checkpoint", dtype=build.dtype)
        limits = build_config(
            max_batch_size=build.max_batch_size, max_input_len=max_input_len, max_seq_len=max_seq_len,
            max_draft_len=build.max_draft_len, speculative_decoding_mode="draft_tokens_external",
            use_paged_context_fmha=True, gemm_plugin="auto", tokens_per_block=build.tokens_per_block,
            max_position_embeddings=max_pos,
        )
        build_torch_engine(ckpt, target, limits)
    return target
