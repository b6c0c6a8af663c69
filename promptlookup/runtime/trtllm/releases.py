"""Which TensorRT-LLM release is installed, and what each release range can do.

``tensorrt_llm.__version__`` is read once per process (:func:`installed_release`). The
capability table (:data:`CAPABILITIES`) says, per feature this adapter uses, the range of
releases that ships it; :func:`require` refuses (one line, :class:`UserError`, exit 2)
anything the installed release lacks, naming the range that has it.

The ranges come from TensorRT-LLM's source (see docs/trtllm.md, "What was checked"):

- the TensorRT engine workflow (``ModelRunnerCpp``, ``trtllm-build``, the TensorRT-engine
  ``tensorrt_llm._tensorrt_engine.LLM``) was deleted from main in June-July 2026
  (pull requests #15763, #15918, #16369, #15907), during the 1.3 cycle, so it ships in
  releases before 1.3;
- the PyTorch-backend LLM API with ``NGramDecodingConfig(max_draft_len=...)``,
  ``UserProvidedDecodingConfig`` and ``DecodingBaseConfig.max_concurrency`` from 1.0 (the
  0.1x/0.2x releases named the draft length ``prompt_lookup_num_tokens``);
- ``SADecodingConfig`` and ``DecodingBaseConfig.draft_len_schedule`` on main (1.3 and later).

Invariant: a capability is either in the table or not used by the adapter; every use goes
through :func:`require` (or :meth:`Release.has`), never through a bare ``hasattr``.
"""
from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass

from ...errors import UserError

Version = tuple[int, int]


@dataclass(frozen=True)
class Range:
    """Releases ``since <= v < until`` (``None``: unbounded on that side)."""

    since: Version | None
    until: Version | None

    def __contains__(self, version: Version) -> bool:
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)

    def __str__(self) -> str:
        lo = None if self.since is None else f"{self.since[0]}.{self.since[1]}"
        hi = None if self.until is None else f"{self.until[0]}.{self.until[1]}"
        if lo and hi:
            return f">= {lo} and < {hi}"
        if lo:
            return f">= {lo}"
        return f"< {hi}" if hi else "any"


@dataclass(frozen=True)
class Capability:
    """One feature the adapter uses, what it is called upstream, and the releases that ship it."""

    name: str
    what: str  # upstream names, for messages
    releases: Range


_PRE_1_0, _V1_0, _V1_3 = None, (1, 0), (1, 3)
CAPABILITIES: dict[str, Capability] = {c.name: c for c in (
    Capability("engine_workflow", "the TensorRT engine workflow (ModelRunnerCpp, trtllm-build)", Range(None, _V1_3)),
    Capability("engine_llm", "the TensorRT-engine LLM (tensorrt_llm._tensorrt_engine.LLM, which runs Lookahead)",
               Range(_V1_0, _V1_3)),
    Capability("pytorch_llm_api", "the PyTorch-backend LLM API (tensorrt_llm.LLM)", Range(None, None)),
    Capability("max_draft_len", "NGramDecodingConfig(max_draft_len=...)", Range(_V1_0, None)),
    Capability("prompt_lookup_num_tokens", "NGramDecodingConfig(prompt_lookup_num_tokens=...)", Range(None, _V1_0)),
    Capability("user_provided_drafter", "UserProvidedDecodingConfig(drafter=...)", Range(_V1_0, None)),
    Capability("max_concurrency", "DecodingBaseConfig.max_concurrency", Range(_V1_0, None)),
    Capability("sa_decoding", "SADecodingConfig (suffix-automaton longest match)", Range(_V1_3, None)),
    Capability("draft_len_schedule", "DecodingBaseConfig.draft_len_schedule", Range(_V1_3, None)),
)}


def parse_version(text: str) -> Version:
    """``"1.0.0rc4"`` -> ``(1, 0)``; ``"1.3.0.post1"`` -> ``(1, 3)``. Pre-releases count as their
    release (main carries the next release's ``rcN``)."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(text))
    if m is None:
        raise UserError(f"cannot read TensorRT-LLM's version {text!r}; expected MAJOR.MINOR[...] such as 1.0.0")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Release:
    """An installed (or simulated) TensorRT-LLM release."""

    version_text: str

    @property
    def version(self) -> Version:
        return parse_version(self.version_text)

    def has(self, capability: str) -> bool:
        return self.version in CAPABILITIES[capability].releases

    def require(self, capability: str, asked: str) -> None:
        """Raise a one-line :class:`UserError` unless this release has ``capability``.

        ``asked`` names what the user asked for (a flag or a config field)."""
        if not self.has(capability):
            cap = CAPABILITIES[capability]
            raise UserError(
                f"{asked} needs {cap.what}, which TensorRT-LLM {self.version_text} (installed) lacks; it ships in "
                f"releases {cap.releases}: install one of those, or use --backend torch"
            )


@functools.lru_cache(maxsize=1)
def installed_release() -> Release:
    """The installed release, from ``tensorrt_llm.__version__`` (read once per process; call
    only after :func:`~.env.require_trtllm`). Tests clear it with ``installed_release.cache_clear()``."""
    module = importlib.import_module("tensorrt_llm")
    text = getattr(module, "__version__", None)
    if not isinstance(text, str):
        raise UserError("the installed tensorrt_llm has no __version__; reinstall TensorRT-LLM or use --backend torch")
    return Release(text)


__all__ = ["CAPABILITIES", "Capability", "Range", "Release", "installed_release", "parse_version"]
