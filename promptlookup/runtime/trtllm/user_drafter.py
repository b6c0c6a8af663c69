"""This project's drafters inside TensorRT-LLM: a ``Drafter`` for ``UserProvidedDecodingConfig``.

TensorRT-LLM's PyTorch executor calls ``drafter.prepare_draft_tokens(scheduled_requests,
resource_manager)`` before each target forward; the drafter sets ``request.py_draft_tokens``
on every request of ``scheduled_requests.generation_requests`` and reads the request's
tokens so far with ``request.get_tokens(0)`` (beam 0). :class:`ScheduledDrafting` does that
with this project's per-request drafters (:func:`promptlookup.drafting.make_drafter`: the
pool with V1 or V2 rules, longest match, llama.cpp caches, adaptive lengths), so they keep
their meaning with TensorRT-LLM's tensor/pipeline parallelism and serving.

:func:`make_user_drafter` subclasses the *installed* ``Drafter`` base class
(``tensorrt_llm._torch.speculative.drafter.Drafter``) when it is called, so this module
imports without TensorRT-LLM. The base's constructor differs by release (1.0:
``max_concurrency``; main: also ``max_draft_len``, ``max_total_draft_tokens``,
``draft_len_schedule``): only the keywords it takes are passed.

Invariants:
- every draft has at most ``max_draft_len`` tokens (and at most the runtime length the
  executor sets through ``update_max_total_draft_tokens``, where the release has it), and
  obeys the request drafter's own ``max_seq_len`` rule (prompt + max new tokens);
- each request's text is extended only by the tokens TensorRT-LLM accepted since the last
  call (``get_tokens`` returns the accepted sequence), so drafting cost per step is
  O(new tokens) amortised;
- a request's drafter is finished (its output absorbed by learning caches) once TensorRT-LLM
  reports it ``GENERATION_COMPLETE`` or when :meth:`ScheduledDrafting.finish_all` runs.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ...drafting.tree import common_prefix_len
from .env import lazy

DRAFTER_BASE = ("tensorrt_llm._torch.speculative.drafter", "Drafter")


@dataclass
class _Tracked:
    request: Any  # this project's per-request drafter
    seen: int  # tokens of the request already given to it
    last_draft: list[int] = field(default_factory=list)


class ScheduledDrafting:
    """Drafts for TensorRT-LLM's scheduled requests with one of this project's drafters.

    ``drafter``: an :class:`~promptlookup.drafting.drafter.NgramDrafter` (shared across
    requests: it owns the public pool and the caches). ``drafted``/``accepted`` count
    draft tokens offered and kept, as this side sees them (``accepted`` is inferred from the
    tokens that follow each draft)."""

    def __init__(self, drafter: Any, max_draft_len: int) -> None:
        self.drafter = drafter
        self.max_draft_len = int(max_draft_len)
        self.runtime_draft_len = self.max_draft_len
        self._tracked: dict[int, _Tracked] = {}
        self.drafted = 0
        self.accepted = 0

    def draft(self, scheduled_requests: Any) -> None:
        """Set ``py_draft_tokens`` on every generation request of ``scheduled_requests``."""
        for request in chain(getattr(scheduled_requests, "context_requests", ()),
                             scheduled_requests.generation_requests):
            if _is_complete(request):
                self._finish(request.request_id)
        for request in scheduled_requests.generation_requests:
            if _is_complete(request):
                continue
            tokens = [int(t) for t in request.get_tokens(0)]
            tracked = self._tracked.get(request.request_id)
            if tracked is None:
                prompt_len = int(request.py_orig_prompt_len)
                max_seq_len = prompt_len + int(request.py_max_new_tokens)
                tracked = _Tracked(self.drafter.new_request(tokens[:prompt_len], max_seq_len=max_seq_len), len(tokens))
                if tokens[prompt_len:]:  # what the context step generated: as this project's V2 loop feeds it
                    tracked.request.extend(tokens[prompt_len:])
                self._tracked[request.request_id] = tracked
            else:
                new = tokens[tracked.seen:]
                if tracked.last_draft:
                    kept = min(common_prefix_len(tracked.last_draft, new), max(0, len(new) - 1))
                    tracked.request.record(len(tracked.last_draft), kept)
                    self.accepted += kept
                if new:
                    tracked.request.extend(new)
                tracked.seen = len(tokens)
            draft = list(tracked.request.propose())[: min(self.max_draft_len, self.runtime_draft_len)]
            tracked.last_draft = draft
            self.drafted += len(draft)
            request.py_draft_tokens = draft

    def _finish(self, request_id: int) -> None:
        tracked = self._tracked.pop(request_id, None)
        if tracked is not None:
            tracked.request.finish()

    def finish_all(self) -> None:
        """Finish every request still tracked (the LLM is shutting down)."""
        for request_id in list(self._tracked):
            self._finish(request_id)


def _is_complete(request: Any) -> bool:
    state = getattr(request, "state", None)
    return str(getattr(state, "name", state)).endswith("GENERATION_COMPLETE")


def make_user_drafter(drafter: Any, *, max_draft_len: int, max_concurrency: int | None = None,
                      draft_len_schedule: dict[int, int] | None = None, base_cls: Any = None) -> Any:
    """A ``Drafter`` (the installed TensorRT-LLM's base class, or ``base_cls``) that runs
    ``drafter`` through :class:`ScheduledDrafting`; pass it as
    ``UserProvidedDecodingConfig(drafter=...)``. Its ``.drafting`` attribute is the
    :class:`ScheduledDrafting`."""
    base = base_cls if base_cls is not None else lazy(*DRAFTER_BASE)

    class PromptLookupDrafter(base):  # type: ignore[misc, valid-type]
        """This project's drafters behind TensorRT-LLM's ``Drafter`` interface."""

        def __init__(self) -> None:
            offered = dict(max_draft_len=max_draft_len, max_total_draft_tokens=max_draft_len,
                           max_concurrency=max_concurrency, draft_len_schedule=draft_len_schedule)
            params = inspect.signature(base.__init__).parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            kwargs = {k: v for k, v in offered.items() if takes_any or k in params}
            dropped = [k for k in ("max_concurrency", "draft_len_schedule")
                       if offered[k] is not None and k not in kwargs]
            if dropped:  # the plan checked the release first; this is a guard, not a path
                raise TypeError(f"this TensorRT-LLM's Drafter takes no {', '.join(dropped)}")
            super().__init__(**kwargs)
            self.drafting = ScheduledDrafting(drafter, max_draft_len)

        def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
            self.drafting.draft(scheduled_requests)

        def update_max_total_draft_tokens(self, new_max_total_draft_tokens: int) -> None:
            parent = getattr(super(), "update_max_total_draft_tokens", None)
            if parent is not None:
                parent(new_max_total_draft_tokens)
            self.drafting.runtime_draft_len = int(new_max_total_draft_tokens)

    return PromptLookupDrafter()


__all__ = ["DRAFTER_BASE", "ScheduledDrafting", "make_user_drafter"]
