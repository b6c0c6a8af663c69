"""run.py's flags from TensorRT-LLM's ``examples/run.py`` that shape generation.

``--num_beams`` (1 only), ``--repetition_penalty``/``--presence_penalty``/
``--frequency_penalty``, ``--stop_words``/``--bad_words``, ``--max_input_length`` and
``--log_level``. Semantics are TensorRT-LLM's (see :mod:`promptlookup.runtime.logits_processors`
and the README); the differences are stated where they occur.
"""
from __future__ import annotations

import argparse
import logging
import logging.handlers
import math
import os
import sys
from typing import Any, Sequence

from ..errors import UserError

LOG_LEVELS = {  # TensorRT-LLM's names -> Python logging levels
    "verbose": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "internal_error": logging.CRITICAL,
}

log = logging.getLogger("promptlookup")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("TensorRT-LLM run.py generation flags")
    g.add_argument("--num_beams", type=int, default=1,
                   help="beam width; only 1 (prompt lookup does not support beam search, as in TensorRT-LLM)")
    g.add_argument("--repetition_penalty", type=float, default=1.0,
                   help="seen tokens (prompt included): logit/p if positive, logit*p if negative; 1.0 is off")
    g.add_argument("--presence_penalty", type=float, default=0.0,
                   help="subtracted once from each seen token's logit (prompt included); 0 is off")
    g.add_argument("--frequency_penalty", type=float, default=0.0,
                   help="subtracted per occurrence of a seen token (prompt included); 0 is off")
    g.add_argument("--stop_words", nargs="+", action="append", default=None,
                   help='strings that end a sequence once its text ends with one, e.g. --stop_words " London" " chef"')
    g.add_argument("--bad_words", nargs="+", action="append", default=None,
                   help='strings never generated, e.g. --bad_words " London" "was not"')
    g.add_argument("--max_input_length", type=int, default=None,
                   help="keep only the last N tokens of each prompt, as TensorRT-LLM (default: no truncation)")
    g.add_argument("--log_level", choices=list(LOG_LEVELS), default="info",
                   help="messages on stderr (and TensorRT-LLM's TLLM_LOG_LEVEL) at this level and above")


def configure_logging(level: str) -> logging.handlers.MemoryHandler:
    """Route the ``promptlookup`` logger to stderr at ``level``; pass the level to
    TensorRT-LLM too (``TLLM_LOG_LEVEL``, read when it is imported; a value the user set wins).

    Messages are held back and written by :func:`release_logs` when the run ends, so that
    a run refused with a one-line error prints that line only.
    """
    import logging.handlers

    log.setLevel(LOG_LEVELS[level])
    for old in [h for h in log.handlers if getattr(h, "_promptlookup", False)]:
        log.removeHandler(old)  # main() may run repeatedly (tests); follow today's sys.stderr
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    held = logging.handlers.MemoryHandler(capacity=1 << 20, flushLevel=logging.CRITICAL + 1, target=stream,
                                          flushOnClose=False)
    held._promptlookup = True  # type: ignore[attr-defined]
    log.addHandler(held)
    log.propagate = False
    os.environ.setdefault("TLLM_LOG_LEVEL", level.upper())
    return held


def release_logs(held: logging.handlers.MemoryHandler, ok: bool) -> None:
    """Write the held messages (``ok``) or drop them (the run failed: its error says why)."""
    if ok:
        held.flush()
    held.buffer.clear()


def check_run_flags(args: argparse.Namespace) -> None:
    """Refuse bad values before anything is loaded (one line each)."""
    if args.num_beams != 1:
        raise UserError(f"--num_beams {args.num_beams}: beam search is not supported with prompt lookup "
                        "(TensorRT-LLM refuses it too); use --num_beams 1")
    r = args.repetition_penalty
    if not (math.isfinite(r) and r > 0):
        raise UserError(f"--repetition_penalty must be a finite number > 0, got {r}")
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(args, name)
        if not math.isfinite(v):
            raise UserError(f"--{name} must be a finite number, got {v}")
    if args.max_input_length is not None and args.max_input_length < 1:
        raise UserError(f"--max_input_length must be at least 1, got {args.max_input_length}")
    for name in ("stop_words", "bad_words"):
        groups = getattr(args, name)
        if groups and len(groups) > 1 and any(list(g) != list(groups[0]) for g in groups[1:]):
            raise UserError(f"--{name} was given {len(groups)} times with different words; per-prompt word lists "
                            f"are not supported: give one --{name} with every word")


def encode_words(groups: Sequence[Sequence[str]] | None, tokenizer: Any, flag: str) -> tuple[tuple[int, ...], ...]:
    """Token sequences of the strings of ``--stop_words``/``--bad_words`` (no special tokens,
    as TensorRT-LLM's ``decode_words_list``); a string with no tokens is refused."""
    if not groups:
        return ()
    words: list[tuple[int, ...]] = []
    for text in groups[0]:
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        if not ids:
            raise UserError(f"--{flag} {text!r} has no tokens; give a non-empty string")
        if ids not in words:
            words.append(ids)
    return tuple(words)


def sampling_with_run_flags(sampling: Any, args: argparse.Namespace, tokenizer: Any) -> Any:
    """``sampling`` (a SamplingConfig) with the penalties, bad words and stop words of ``args``."""
    from dataclasses import replace

    return replace(
        sampling,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        bad_words=encode_words(args.bad_words, tokenizer, "bad_words"),
        stop_words=encode_words(args.stop_words, tokenizer, "stop_words"),
    )


def truncate_prompts(prompts: list[Any], max_input_length: int | None, tokenizer: Any) -> None:
    """Keep the last ``max_input_length`` tokens of each prompt, in place.

    TensorRT-LLM's ``run.py`` does this for every input type (its tokenizer truncates on
    the left; CSV and NumPy rows keep ``ids[-max_input_length:]``). Each cut is reported
    (warning level), and a cut text prompt's text becomes what is actually used.
    """
    if max_input_length is None:
        return
    for i, p in enumerate(prompts):
        if len(p.ids) > max_input_length:
            log.warning("prompt %d: kept its last %d of %d tokens (--max_input_length)",
                        i, max_input_length, len(p.ids))
            p.ids = p.ids[-max_input_length:]
            if p.text is not None:
                p.text = tokenizer.decode(p.ids)
