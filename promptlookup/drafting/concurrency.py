"""Speculation under load: TensorRT-LLM's ``max_concurrency`` and ``draft_len_schedule``.

Semantics (TensorRT-LLM's ``DecodingBaseConfig``, PyTorch backend):

- ``max_concurrency = C``: speculation is off while more than ``C`` requests are live.
- ``draft_len_schedule = {b1: d1, b2: d2, ...}`` (``b1 < b2 < ...``): with ``B`` live
  requests the draft length is ``d_i`` for the smallest ``b_i >= B``, and 0 (speculation off)
  above the largest key. The smallest key must map to ``max_draft_len`` and no length may
  exceed it; every key is >= 1 and every length >= 0.
- The two are mutually exclusive (a schedule already caps concurrency).

Here a schedule is held as a sorted tuple of ``(batch_size, draft_len)`` pairs, so that the
frozen :class:`~.base.DraftConfig` stays hashable.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import UserError

Schedule = tuple[tuple[int, int], ...]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def normalize_schedule(schedule: Mapping[int, int] | Schedule | None, max_draft_len: int) -> Schedule | None:
    """``schedule`` checked (TensorRT-LLM's rules) and sorted by batch size; None stays None."""
    if schedule is None:
        return None
    pairs = list(schedule.items()) if isinstance(schedule, Mapping) else list(schedule)
    if not pairs or any(not (isinstance(p, (tuple, list)) and len(p) == 2) for p in pairs):
        raise UserError(f"draft_len_schedule must map batch sizes to draft lengths, e.g. {{4: 4, 8: 2}}; got {schedule!r}")
    for b, d in pairs:
        if not _is_int(b) or b < 1 or not _is_int(d) or d < 0:
            raise UserError(f"draft_len_schedule: batch sizes must be integers >= 1 and draft lengths integers >= 0, "
                            f"got {b!r}: {d!r}")
        if d > max_draft_len:
            raise UserError(f"draft_len_schedule: draft length {d} (batch size {b}) exceeds max_draft_len {max_draft_len}")
    ordered = tuple(sorted((int(b), int(d)) for b, d in pairs))
    if len({b for b, _ in ordered}) != len(ordered):
        raise UserError(f"draft_len_schedule names a batch size twice: {schedule!r}")
    if ordered[0][1] != max_draft_len:
        raise UserError(f"draft_len_schedule[{ordered[0][0]}] must equal max_draft_len {max_draft_len} (it is the "
                        f"smallest batch-size key), got {ordered[0][1]}")
    return ordered


def check_concurrency(max_concurrency: int | None, schedule: Schedule | None) -> None:
    """Refuse (one line) a bad ``max_concurrency`` or one given together with a schedule."""
    if max_concurrency is not None and (not _is_int(max_concurrency) or max_concurrency < 1):
        raise UserError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    if max_concurrency is not None and schedule is not None:
        raise UserError("max_concurrency and draft_len_schedule are mutually exclusive (as in TensorRT-LLM): "
                        "give max_concurrency for a cut-off or draft_len_schedule for lengths by batch size")


def refuse_unrouted(config: object, inside_tensorrt_llm: bool) -> None:
    """Refuse (one line) ``max_concurrency``/``draft_len_schedule`` on a path that would not
    honour them: only TensorRT-LLM's V2 (``inside_tensorrt_llm``) and ``promptlookup.LLM``'s
    scheduler do."""
    if config is None or inside_tensorrt_llm:
        return
    if getattr(config, "max_concurrency", None) is not None or getattr(config, "draft_len_schedule", None) is not None:
        raise UserError("max_concurrency/draft_len_schedule (--max_concurrency, --draft_len_schedule) are honoured by "
                        "TensorRT-LLM (--backend trtllm --workflow v2) and by promptlookup.LLM's scheduler, not by "
                        "this loop; drop them here")


def draft_len_for(live: int, max_draft_len: int, max_concurrency: int | None = None,
                  schedule: Schedule | None = None) -> int:
    """The draft length to use with ``live`` requests in the batch (0: speculation off)."""
    if schedule is not None:
        for batch_size, draft_len in schedule:
            if live <= batch_size:
                return draft_len
        return 0
    if max_concurrency is not None and live > max_concurrency:
        return 0
    return max_draft_len


def schedule_as_dict(schedule: Schedule | None) -> dict[int, int] | None:
    """The ``dict`` TensorRT-LLM's ``draft_len_schedule`` field takes."""
    return None if schedule is None else {b: d for b, d in schedule}


__all__ = ["Schedule", "check_concurrency", "draft_len_for", "normalize_schedule", "refuse_unrouted",
           "schedule_as_dict"]
