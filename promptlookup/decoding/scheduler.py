"""Continuous batching: requests join and leave one live V2 batch between steps.

A :class:`Scheduler` owns a background thread and one
:class:`~promptlookup.runtime.torch_runner.DecodeBatch`. Each loop iteration:

1. admits waiting requests (FIFO) while the batch has room (``max_batch_size`` live
   sequences) and the KV cache can hold each one's worst case (prompt plus
   ``max_new_tokens`` plus a full draft, reserved at admission, so a step never runs out
   of blocks); drops cancelled requests, releasing their blocks;
2. drafts for every live request (its own :class:`~promptlookup.decoding.loop_state.LoopState`,
   the same drafting, draft-length policy and bookkeeping as ``decoding.generate``), then
   cuts the drafts to the batch-aware budget (:mod:`.draft_budget`);
3. verifies all drafts in one ``DecodeBatch.step`` per distinct (sampling, end_id) group
   (one forward pass when all requests sample alike, e.g. all greedy);
4. sends each request the tokens it gained (a :class:`TokenEvent`) and retires the
   finished ones, which leave the batch at once and free their blocks.

No request waits for another to finish: a new one joins at the next step. Results reach
callers through per-request sinks: a thread-safe queue (:meth:`RequestHandle.events`) or
an asyncio queue on the caller's loop (:meth:`RequestHandle.aevents`).

Output equals ``decoding.generate``'s for the same prompt: greedy choices do not depend on
the batch (up to floating-point differences of batched kernels), and sampling noise is
keyed by (seed, request id, position), with the request id given by the caller.
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from ..decoding.lookahead import LookaheadConfig, step_tokens
from ..decoding.loop_state import LoopState
from ..runtime.results import SequenceResult
from ..drafting.base import Drafter
from ..errors import UserError, one_line
from ..runtime.batch_costs import BatchStepCosts
from ..runtime.base import SamplingConfig
from ..runtime.torch_runner import TorchRunner
from ..runtime.tree import DraftTree
from ..drafting.concurrency import draft_len_for
from .draft_budget import allot, allot_by_cost, default_token_budget

FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR = "stop", "length", "cancelled", "error"


@dataclass
class GenerationRequest:
    """One request: token ids in, up to ``max_new_tokens`` tokens out (ending at ``end_id``)."""

    prompt: list[int]
    max_new_tokens: int
    end_id: int
    sampling: SamplingConfig = SamplingConfig()
    request_id: int = 0  # keys the sampling noise: same (seed, request_id) -> same sample


@dataclass(frozen=True)
class TokenEvent:
    """Tokens a request gained in one step; the last event has ``finish_reason`` set."""

    tokens: list[int]
    accepted: int  # draft tokens kept: the first ``accepted`` of ``tokens`` came from the draft
    finish_reason: str | None = None  # stop (end_id), length, cancelled or error
    error: str | None = None
    drafted: int = 0  # draft tokens offered in the step


@dataclass
class SchedulerStats:
    """Counters since start (exported by ``/metrics``)."""

    requests_submitted: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    generated_tokens: int = 0
    drafted: int = 0  # draft tokens offered
    accepted: int = 0  # draft tokens kept
    sequence_steps: int = 0  # one per live sequence per step
    batch_steps: int = 0  # forward passes
    live: int = 0
    waiting: int = 0


class RequestHandle:
    """A submitted request: its events, its result so far, and ``cancel()``."""

    def __init__(self, scheduler: "Scheduler", request: GenerationRequest, sink: Callable[[TokenEvent], None]) -> None:
        self.scheduler = scheduler
        self.request = request
        self.id = next(scheduler._ids)
        self._sink = sink
        self.result: SequenceResult = SequenceResult()  # replaced by the live one on admission
        self.finish_reason: str | None = None
        self.cancelled = False
        self.state: LoopState | None = None
        self.index: int | None = None  # slot in the batch while live
        self.reserved_blocks = 0

    def cancel(self) -> None:
        """Stop generating; the request leaves the batch (freeing its blocks) before the next step."""
        self.scheduler._cancel(self)

    def _emit(self, event: TokenEvent) -> None:
        try:
            self._sink(event)
        except RuntimeError:  # the consumer's event loop is gone: treat as a disconnect
            self.cancelled = True

    # Consumers -------------------------------------------------------------
    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Blocking iteration (for handles submitted without a ``loop``)."""
        q = getattr(self, "_queue", None)
        if q is None:
            raise RuntimeError("this request was submitted from an event loop; use `async for` or `await aresult()`")
        while True:
            event = q.get(timeout=timeout)
            yield event
            if event.finish_reason is not None:
                return

    async def aevents(self) -> AsyncIterator[TokenEvent]:
        """Async iteration (for handles submitted with ``loop``)."""
        q = getattr(self, "_aqueue", None)
        if q is None:
            raise RuntimeError("this request was submitted outside an event loop; iterate it or call result()")
        while True:
            event = await q.get()
            yield event
            if event.finish_reason is not None:
                return


class Scheduler:
    """The continuous-batching loop over one :class:`TorchRunner` (see the module doc).

    ``token_budget`` caps the tokens one step feeds (:mod:`.draft_budget`; default
    ``k + 1``, k the drafter's ``prompt_lookup_num_tokens``); ``step_costs`` enables the per-request cost-aware draft
    length (``decoding.draft_policy``), as ``decoding.generate`` does, and ``batch_costs``
    (the engine's batched table, :mod:`promptlookup.runtime.batch_costs`) prices batched steps.
    """

    def __init__(
        self,
        runner: TorchRunner,
        drafter: Drafter | None,
        *,
        token_budget: int | None = None,
        step_costs: Sequence[float] | None = None,
        lookahead: LookaheadConfig | None = None,
        batch_costs: BatchStepCosts | None = None,
    ) -> None:
        if not isinstance(runner, TorchRunner):
            raise UserError("continuous batching needs a PyTorch engine (TorchRunner)")
        self.runner = runner
        self.drafter = drafter
        limits = runner.limits
        self.k = drafter.config.prompt_lookup_num_tokens if drafter is not None else 0
        self.lookahead = lookahead
        self.max_candidates = drafter.config.max_candidates if drafter is not None else 1
        self.trees = lookahead is not None or self.max_candidates > 1  # steps verify token trees
        if lookahead is not None:
            self.k = step_tokens(lookahead, self.k)  # the widest step a request can feed
        config = drafter.config if drafter is not None else None
        # speculation under load (TensorRT-LLM's semantics, drafting.concurrency): off above
        # max_concurrency live requests, or draft lengths by live batch size
        self.max_concurrency = config.max_concurrency if config is not None else None
        self.draft_len_schedule = config.draft_len_schedule if config is not None else None
        if self.trees and (self.max_concurrency is not None or self.draft_len_schedule is not None):
            raise UserError("max_concurrency/draft_len_schedule size chain drafts; they do not combine with Lookahead "
                            "or several candidates per step: drop one of them")
        self.token_budget = token_budget if token_budget is not None else default_token_budget(self.k)
        if self.token_budget < 1:
            raise UserError(f"draft token budget must be >= 1, got {self.token_budget}")
        self.step_costs = list(step_costs) if step_costs else None
        self.batch_costs = batch_costs if self.step_costs else None
        self.stats = SchedulerStats()
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._waiting: deque[RequestHandle] = deque()
        self._live: list[RequestHandle] = []
        self._reserved = 0
        self._capacity = runner.pool.num_blocks - 1  # block 0 is scratch
        self._closed = False
        self._batch = runner.open([])
        self._thread = threading.Thread(target=self._run, name="promptlookup-scheduler", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public
    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> RequestHandle:
        """Queue ``request``; bad requests raise :class:`UserError` here, synchronously.

        With ``loop``, events go to an asyncio queue on that loop (read with ``aevents``),
        else to a thread-safe queue (read with ``events``).
        """
        limits = self.runner.limits
        from ..runtime.base import validate_batch

        if request.max_new_tokens < 1:
            raise UserError(f"max_tokens must be at least 1, got {request.max_new_tokens}")
        validate_batch([request.prompt], limits, max_new_tokens=request.max_new_tokens)
        need = self._blocks_needed(request)
        if need > self._capacity:
            raise UserError(f"the request needs {need} KV blocks but the cache has {self._capacity}; "
                            "lower max_tokens or raise --max_tokens_in_paged_kv_cache")
        if loop is None:
            q: queue.Queue[TokenEvent] = queue.Queue()
            handle = RequestHandle(self, request, q.put)
            handle._queue = q  # type: ignore[attr-defined]
        else:
            aq: asyncio.Queue[TokenEvent] = asyncio.Queue()
            handle = RequestHandle(self, request, lambda ev: loop.call_soon_threadsafe(aq.put_nowait, ev))
            handle._aqueue = aq  # type: ignore[attr-defined]
        handle.reserved_blocks = need
        with self._lock:
            if self._closed:
                raise UserError("the scheduler is closed")
            self._waiting.append(handle)
            self.stats.requests_submitted += 1
            self.stats.waiting = len(self._waiting)
            self._lock.notify_all()
        return handle

    def wait_idle(self, timeout: float) -> bool:
        """Block until no request is waiting or live (True), or ``timeout`` seconds pass."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._waiting and not self._live, timeout)

    def close(self) -> None:
        """Cancel everything, stop the thread and release the batch."""
        with self._lock:
            self._closed = True
            for h in list(self._waiting) + self._live:
                h.cancelled = True
            self._lock.notify_all()
        self._thread.join()

    # ---------------------------------------------------------------- internals
    def _blocks_needed(self, request: GenerationRequest) -> int:
        slots = len(request.prompt) + request.max_new_tokens + self.k + 1
        return -(-slots // self.runner.pool.block_size)

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            handle.cancelled = True
            self._lock.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    self._lock.wait_for(lambda: self._closed or self._waiting or self._live)
                    if self._closed:
                        break
                    self._retire_cancelled()
                    self._admit()
                    live = list(self._live)
                if live:
                    try:
                        self._step(live)
                    except Exception as exc:  # a failed step fails its requests, not the server
                        message = one_line(exc, None)
                        with self._lock:
                            for h in live:
                                if h in self._live:
                                    self.stats.requests_failed += 1
                                    self._leave(h, FINISH_ERROR, error=message)
        finally:
            with self._lock:
                for h in list(self._waiting):
                    h._emit(TokenEvent([], 0, FINISH_CANCELLED))
                self._waiting.clear()
                for h in list(self._live):
                    self._leave(h, FINISH_CANCELLED)
                self._batch.close()
                self._lock.notify_all()

    def _retire_cancelled(self) -> None:
        for h in [h for h in self._waiting if h.cancelled]:
            self._waiting.remove(h)
            self.stats.requests_cancelled += 1
            h.finish_reason = FINISH_CANCELLED
            h._emit(TokenEvent([], 0, FINISH_CANCELLED))
        for h in [h for h in self._live if h.cancelled]:
            self.stats.requests_cancelled += 1
            self._leave(h, FINISH_CANCELLED)
        self.stats.waiting = len(self._waiting)
        self._lock.notify_all()

    def _admit(self) -> None:
        limits = self.runner.limits
        while self._waiting and len(self._live) < limits.max_batch_size:
            h = self._waiting[0]
            if self._reserved + h.reserved_blocks > self._capacity:
                break  # waits for a live request to finish
            self._waiting.popleft()
            r = h.request
            try:
                h.index = self._batch.add(r.prompt, r.request_id)
            except Exception as exc:  # fails this request only; the loop goes on
                self.stats.requests_failed += 1
                h.finish_reason = FINISH_ERROR
                h._emit(TokenEvent([], 0, FINISH_ERROR, one_line(exc, None)))
                continue
            h.state = LoopState([r.prompt], self.drafter, r.max_new_tokens, limits.max_seq_len, r.end_id,
                                None, self.step_costs, max_candidates=self.max_candidates, lookahead=self.lookahead,
                                max_tree_nodes=limits.max_draft_len)
            h.result = h.state.results[0]
            self._reserved += h.reserved_blocks
            self._live.append(h)
        self.stats.waiting = len(self._waiting)
        self.stats.live = len(self._live)
        self._lock.notify_all()

    def _leave(self, h: RequestHandle, reason: str, error: str | None = None) -> None:
        """Remove a live request from the batch (its blocks are released) and tell its consumer."""
        self._live.remove(h)
        self._reserved -= h.reserved_blocks
        if h.index is not None:
            self._batch.remove(h.index)
            h.index = None
        if h.state is not None:
            for p in h.state.proposers:
                p.finish()
        h.finish_reason = reason
        h._emit(TokenEvent([], 0, reason, error))
        self.stats.live = len(self._live)
        self._lock.notify_all()

    def _step(self, live: list[RequestHandle]) -> None:
        if self.trees:  # Lookahead or several candidates: each request's proposer sizes its own tree
            trees = [h.state.trees()[0] for h in live]  # type: ignore[union-attr]
        else:
            proposals = [h.state.drafts()[0] for h in live]  # type: ignore[union-attr]
            lengths = [len(p) for p in proposals]
            policies = [getattr(h.state.proposers[0], "policy", None) for h in live]  # type: ignore[union-attr]
            if self.step_costs and all(policies):  # the budget, then only what pays off on this device
                rates = [(p.first.value, p.later.value) for p in policies]
                granted = allot_by_cost(lengths, rates, self.step_costs, self.token_budget, self.batch_costs)
            else:
                granted = allot(lengths, self.token_budget)
            if self.max_concurrency is not None or self.draft_len_schedule is not None:
                cap = draft_len_for(len(live), self.k, self.max_concurrency, self.draft_len_schedule)
                granted = [min(g, cap) for g in granted]
            trees = [DraftTree.chain(p[:g]) for p, g in zip(proposals, granted)]
            for h, tree in zip(live, trees):  # what is verified is the granted part
                h.state.last_trees[0] = tree  # type: ignore[union-attr]
        groups: dict[tuple[SamplingConfig, int], list[int]] = {}
        for j, h in enumerate(live):
            groups.setdefault((h.request.sampling, h.request.end_id), []).append(j)
        for (sampling, end_id), members in groups.items():
            steps = self._batch.step_trees([live[j].index for j in members], [trees[j] for j in members],
                                           end_id, sampling)
            self.stats.batch_steps += 1
            for j, step in zip(members, steps):
                h, tree = live[j], trees[j]
                state = h.state
                assert state is not None
                before = len(state.results[0].output_ids)
                state.commit(0, tree.num_walkable, step.tokens, step.accepted, step.choices)
                state.retire_finished()
                res = state.results[0]
                gained = res.output_ids[before:]
                accepted = min(step.accepted, len(gained))
                self.stats.sequence_steps += 1
                self.stats.generated_tokens += len(gained)
                self.stats.drafted += tree.num_walkable
                self.stats.accepted += accepted
                if gained:
                    h._emit(TokenEvent(gained, accepted, drafted=tree.num_walkable))
                if not state.active:
                    with self._lock:
                        self.stats.requests_finished += 1
                        self._leave(h, FINISH_STOP if res.finished else FINISH_LENGTH)
