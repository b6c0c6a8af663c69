"""Continuous batching: requests join and leave one live V2 batch between steps.

A :class:`Scheduler` owns a background thread and one
:class:`~promptlookup.runtime.torch_runner.DecodeBatch`. Each loop iteration:

1. admits waiting requests (FIFO) while the batch has room (``max_batch_size`` live
   sequences) and the KV cache can hold each one's worst case (prompt plus
   ``max_new_tokens`` plus a full draft, reserved at admission, so a step never runs out
   of blocks); drops cancelled requests, releasing their blocks. Prefix sharing: first the
   full prompt blocks of every request live since an earlier round (so past a step: their
   K/V are final) are registered in the prefix cache
   (:meth:`~promptlookup.runtime.kv_cache.BlockManager.register_prefix`), so a request
   admitted now maps them while their owner still decodes; and a request whose prompt
   shares whole blocks with a prompt admitted in this same round, beyond what the cache
   holds, waits for the next round (FIFO: so do those behind it), when the coming step will
   have computed them. So the ``n`` choices of one prompt (the server's ``n``), or requests
   with one system prompt, compute the shared prefix once; the cost is one step of latency
   for a held-back request, at most once each;
2. runs :func:`~.step.step` over the live requests (each a :class:`~.request.RequestState`):
   the same step as ``decoding.generate``'s V2 loop (drafting, draft-length policy,
   verification per (sampling, end_id) group, the commit rule), with the batch-aware
   budget (:class:`~.draft_budget.BatchBudget`) passed into tree building;
3. sends each request the tokens it gained (a :class:`~promptlookup.runtime.results.StepEvent`)
   and retires the finished ones, which leave the batch at once and free their blocks.

No request waits for another to finish: a new one joins at the next step. Results reach
callers through per-request sinks: a thread-safe queue (:meth:`RequestHandle.events`) or
an asyncio queue on the caller's loop (:meth:`RequestHandle.aevents`).

Output equals ``decoding.generate``'s for the same prompt, by construction (the same step
function): greedy choices do not depend on the batch (up to floating-point differences of
batched kernels), and sampling noise is keyed by (seed, request id, position), with the
request id given by the caller. Only the batch budget, which shortens drafts as the batch
grows, can make drafted counts differ from ``generate``'s (never for a lone request).
"""
from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from .lookahead import LookaheadConfig, step_tokens
from .request import FINISH_LENGTH, FINISH_STOP, RequestState, make_proposer
from .step import sampling_groups, step
from ..runtime.results import SequenceResult, StepEvent
from ..drafting.base import Drafter
from ..drafting.tree import common_prefix_len
from ..errors import UserError, one_line
from ..runtime.batch_costs import BatchStepCosts
from ..runtime.base import LiveBatchRunner, SamplingConfig
from .draft_budget import BatchBudget, default_token_budget

FINISH_CANCELLED, FINISH_ERROR = "cancelled", "error"
__all__ = ["FINISH_STOP", "FINISH_LENGTH", "FINISH_CANCELLED", "FINISH_ERROR", "GenerationRequest", "TokenEvent",
           "SchedulerStats", "RequestHandle", "Scheduler"]


@dataclass
class GenerationRequest:
    """One request: token ids in, up to ``max_new_tokens`` tokens out (ending at ``end_id``)."""

    prompt: list[int]
    max_new_tokens: int
    end_id: int
    sampling: SamplingConfig = SamplingConfig()
    request_id: int = 0  # keys the sampling noise: same (seed, request_id) -> same sample


TokenEvent = StepEvent  # what a request's stream carries: one per step, then one with finish_reason


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
    prefill_tokens_computed: int = 0  # prompt tokens admitted requests compute
    prefix_tokens_reused: int = 0  # prompt tokens admitted requests map from cached KV blocks
    live: int = 0
    waiting: int = 0


class RequestHandle:
    """A submitted request: its events, its result so far, and ``cancel()``."""

    def __init__(self, scheduler: "Scheduler", request: GenerationRequest, sink: Callable[[TokenEvent], None],
                 sync_queue: "queue.Queue[TokenEvent] | None" = None,
                 async_queue: "asyncio.Queue[TokenEvent] | None" = None) -> None:
        self.scheduler = scheduler
        self.request = request
        self.id = next(scheduler._ids)
        self._sink = sink
        self._queue, self._aqueue = sync_queue, async_queue
        self.result: SequenceResult = SequenceResult()  # replaced by the live one on admission
        self.finish_reason: str | None = None
        self.cancelled = False
        self.stopped = False  # ended by its consumer (a stop string): counted as finished
        self.abort_error: str | None = None  # ended by Scheduler.abort_all: finishes with this error
        self.state: RequestState | None = None
        self.index: int | None = None  # slot in the batch while live
        self.reserved_blocks = 0

    def cancel(self) -> None:
        """Stop generating; the request leaves the batch (freeing its blocks) before the next step."""
        self.scheduler._cancel(self)

    def stop(self) -> None:
        """As :meth:`cancel`, for a request its consumer ended normally (a stop string
        found in its text): counted as finished, not cancelled."""
        self.stopped = True
        self.scheduler._cancel(self)

    def _final(self, reason: str, error: str | None = None) -> None:
        """The stream's last event: no tokens, ``finish_reason`` set."""
        self.finish_reason = reason
        self._emit(StepEvent(self.id, [], 0, finish_reason=reason, error=error))

    def _emit(self, event: TokenEvent) -> None:
        try:
            self._sink(event)
        except RuntimeError:  # the consumer's event loop is gone: treat as a disconnect
            self.cancelled = True

    # Consumers -------------------------------------------------------------
    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Blocking iteration (for handles submitted without a ``loop``)."""
        q = self._queue
        if q is None:
            raise RuntimeError("this request was submitted from an event loop; use `async for` or `await aresult()`")
        while True:
            event = q.get(timeout=timeout)
            yield event
            if event.finish_reason is not None:
                return

    async def aevents(self) -> AsyncIterator[TokenEvent]:
        """Async iteration (for handles submitted with ``loop``)."""
        q = self._aqueue
        if q is None:
            raise RuntimeError("this request was submitted outside an event loop; iterate it or call result()")
        while True:
            event = await q.get()
            yield event
            if event.finish_reason is not None:
                return


class Scheduler:
    """The continuous-batching loop over one :class:`~promptlookup.runtime.base.LiveBatchRunner`
    (see the module doc).

    ``token_budget`` caps the tokens one step feeds (:mod:`.draft_budget`; default
    ``k + 1``, k the drafter's ``prompt_lookup_num_tokens``); ``step_costs`` enables the per-request cost-aware draft
    length (``decoding.draft_policy``), as ``decoding.generate`` does, and ``batch_costs``
    (the engine's batched table, :mod:`promptlookup.runtime.batch_costs`) prices batched steps.
    """

    def __init__(
        self,
        runner: LiveBatchRunner,
        drafter: Drafter | None,
        *,
        token_budget: int | None = None,
        step_costs: Sequence[float] | None = None,
        lookahead: LookaheadConfig | None = None,
        batch_costs: BatchStepCosts | None = None,
    ) -> None:
        if not runner.capabilities.live_batch:
            raise UserError("continuous batching needs a runner that opens live batches (a PyTorch engine)")
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
        if self.trees and token_budget is not None:
            raise UserError("a draft token budget sizes chain drafts; Lookahead and several candidates per step are "
                            "sized by each request alone: drop the budget")
        self.token_budget = token_budget if token_budget is not None else default_token_budget(self.k)
        if self.token_budget < 1:
            raise UserError(f"draft token budget must be >= 1, got {self.token_budget}")
        self.step_costs = list(step_costs) if step_costs else None
        self.batch_costs = batch_costs if self.step_costs else None
        # trees (Lookahead, several candidates) are sized by each request's proposer alone
        self.budget = None if self.trees else BatchBudget(self.token_budget, self.step_costs, self.batch_costs, self.k,
                                                          self.max_concurrency, self.draft_len_schedule,
                                                          ragged=runner.skips_padding)
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
                            "lower max_tokens or give the cache more tokens (KvCacheConfig(max_tokens=...), "
                            "serve.py --max_tokens_in_paged_kv_cache)")
        if loop is None:
            q: queue.Queue[TokenEvent] = queue.Queue()
            handle = RequestHandle(self, request, q.put, sync_queue=q)
        else:
            aq: asyncio.Queue[TokenEvent] = asyncio.Queue()
            handle = RequestHandle(self, request, lambda ev: loop.call_soon_threadsafe(aq.put_nowait, ev),
                                   async_queue=aq)
        handle.reserved_blocks = need
        with self._lock:
            if self._closed:
                raise UserError("the scheduler is closed")
            self._waiting.append(handle)
            self.stats.requests_submitted += 1
            self.stats.waiting = len(self._waiting)
            self._lock.notify_all()
        return handle

    @property
    def alive(self) -> bool:
        """Whether the scheduler thread is running (``/health``)."""
        return self._thread.is_alive()

    @property
    def kv_capacity(self) -> int:
        """KV blocks a request may reserve at most (the pool less the scratch block)."""
        return self._capacity

    def kv_blocks_for(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV blocks reserved at admission for a request of this size (its worst case)."""
        return -(-(prompt_len + max_new_tokens + self.k + 1) // self.runner.pool.block_size)

    def kv_room(self, prompt_len: int) -> int:
        """The most new tokens a request with this prompt may ask for within :attr:`kv_capacity`
        (the largest ``max_new_tokens`` that :meth:`kv_blocks_for` fits; below 1: none)."""
        return self._capacity * self.runner.pool.block_size - prompt_len - self.k - 1

    def abort_all(self, error: str) -> int:
        """End every waiting and live request before the next step with finish reason
        ``error`` and this message (their blocks freed); return how many. For a bounded
        shutdown: the requests' consumers see an error, not a silent end."""
        with self._lock:
            handles = list(self._waiting) + self._live
            for h in handles:
                h.abort_error = error
                h.cancelled = True
            self._lock.notify_all()
        return len(handles)

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
        return self.kv_blocks_for(len(request.prompt), request.max_new_tokens)

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
                    h._final(FINISH_CANCELLED)
                self._waiting.clear()
                for h in list(self._live):
                    self._leave(h, FINISH_CANCELLED)
                self._batch.close()
                self._lock.notify_all()

    def _retire_cancelled(self) -> None:
        for h in [h for h in self._waiting if h.cancelled]:
            self._waiting.remove(h)
            if h.abort_error is None:
                self.stats.requests_cancelled += 1
                h._final(FINISH_CANCELLED)
            else:
                self.stats.requests_failed += 1
                h._final(FINISH_ERROR, h.abort_error)
        for h in [h for h in self._live if h.cancelled]:
            if h.stopped:
                self.stats.requests_finished += 1
                self._leave(h, FINISH_STOP)
            elif h.abort_error is not None:
                self.stats.requests_failed += 1
                self._leave(h, FINISH_ERROR, error=h.abort_error)
            else:
                self.stats.requests_cancelled += 1
                self._leave(h, FINISH_CANCELLED)
        self.stats.waiting = len(self._waiting)
        self._lock.notify_all()

    def _awaits_prefix(self, prompt: list[int], prefilling: list[list[int]]) -> bool:
        """Whether ``prompt`` would share more whole KV blocks with a prompt admitted in this
        round (computed by the coming step, shareable after it) than the prefix cache
        holds now; then it is worth one step's wait. Cost: O(len(prompt)) per prompt
        admitted this round."""
        blocks = self.runner.blocks
        if not prefilling or not blocks.enable_reuse:
            return False
        usable = prompt[: len(prompt) - 1]  # as match_prefix: the last token is always computed
        shared = max(common_prefix_len(p, usable) for p in prefilling) // self.runner.pool.block_size
        return shared > 0 and shared > blocks.cached_blocks(prompt)

    def _share_prompts(self) -> None:
        """Register the full prompt blocks of every live request in the prefix cache. Each
        was admitted in an earlier round and has run a step since (a failed step removes its
        requests), so its prompt's K/V are final. O(prompt) once per request, then O(1)."""
        for h in self._live:
            s = self._batch.seqs[h.index] if h.index is not None else None
            if s is not None:
                self.runner.blocks.register_prefix(s.blocks, s.tokens, s.prompt_len)

    def _admit(self) -> None:
        limits = self.runner.limits
        if self._waiting:
            self._share_prompts()
        prefilling: list[list[int]] = []  # prompts admitted in this round
        while self._waiting and len(self._live) < limits.max_batch_size:
            h = self._waiting[0]
            if self._reserved + h.reserved_blocks > self._capacity:
                break  # waits for a live request to finish
            if self._awaits_prefix(h.request.prompt, prefilling):
                break  # joins next round, mapping the blocks the coming step computes
            self._waiting.popleft()
            r = h.request
            reused = self.runner.blocks.stats.matched_tokens
            try:
                h.index = self._batch.add(r.prompt, r.request_id)
            except Exception as exc:  # fails this request only; the loop goes on
                self.stats.requests_failed += 1
                h._final(FINISH_ERROR, one_line(exc, None))
                continue
            reused = self.runner.blocks.stats.matched_tokens - reused
            self.stats.prefix_tokens_reused += reused
            self.stats.prefill_tokens_computed += len(r.prompt) - reused
            prefilling.append(r.prompt)
            proposer = make_proposer(r.prompt, self.drafter, limits.max_seq_len, step_costs=self.step_costs,
                                     max_candidates=self.max_candidates, lookahead=self.lookahead,
                                     seed=r.request_id)
            h.state = RequestState(h.id, r.prompt, proposer, max_new_tokens=r.max_new_tokens, end_id=r.end_id,
                                   max_seq_len=limits.max_seq_len, sampling=r.sampling,
                                   max_tree_nodes=limits.max_draft_len, slot=h.index)
            h.result = h.state.result
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
            h.state.finish()
        h._final(reason, error)
        self.stats.live = len(self._live)
        self._lock.notify_all()

    def _step(self, live: list[RequestHandle]) -> None:
        states = [h.state for h in live]
        events = step(self._batch, states, self.budget)  # type: ignore[arg-type]
        self.stats.batch_steps += len(sampling_groups(states))  # type: ignore[arg-type]
        for h, event in zip(live, events):
            state = h.state
            assert state is not None
            self.stats.sequence_steps += 1
            self.stats.generated_tokens += len(event.tokens)
            self.stats.drafted += event.drafted
            self.stats.accepted += event.accepted
            if event.tokens:
                h._emit(event)
            if state.done:
                with self._lock:
                    self.stats.requests_finished += 1
                    self._leave(h, state.finish_reason)
