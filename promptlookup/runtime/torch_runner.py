"""The PyTorch runner: batched verification of external drafts over the paged KV cache.

Two levels of API:

- :class:`DecodeBatch` (used by the V2 single-call loop): a set of live sequences that
  keep their KV blocks between steps. ``step`` feeds every selected sequence its pending
  tokens plus its draft in one forward pass and keeps, per sequence, the longest draft
  prefix that equals the target's own choices, plus one token of the target's own.
- :meth:`TorchRunner.generate` (the V1 orchestrator call, TensorRT-LLM's
  ``ModelRunnerCpp.generate`` in orchestrator mode): opens a batch for whole sequences
  (block reuse maps each one's cached prefix, so a re-submitted prefix costs nothing),
  runs one verification step (or plain decoding steps when no drafts are given), and
  releases the blocks back to the reuse cache.

Per-sequence invariant between steps: the KV of ``tokens[:cached]`` is in the cache and
``cached == len(tokens) - 1`` (the last token is fed at the next step), except right
after opening, when ``cached`` is the reused prefix length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..errors import UserError
from .base import EngineLimits, GenerationOutput, RunnerStats, SamplingConfig, validate_batch
from .cuda_graphs import CudaGraphs
from .kv_cache import BlockManager, KVPool, SequenceBlocks
from .paged_llama import PagedLlama, build_layout
from .sampling import select_tokens


@dataclass
class LiveSequence:
    request: int  # keys the sampling noise
    tokens: list[int]
    cached: int
    blocks: SequenceBlocks
    prompt_len: int
    stats: GenerationOutput = field(default_factory=lambda: GenerationOutput(output_ids=[]))


@dataclass
class StepResult:
    tokens: list[int]  # accepted draft tokens, then the target's own token (cut at end_id)
    accepted: int
    finished: bool


class DecodeBatch:
    """Live sequences sharing one forward pass per step. Close it to release the blocks."""

    def __init__(self, runner: "TorchRunner", prompts: Sequence[Sequence[int]], requests: Sequence[int]) -> None:
        self.runner = runner
        self.seqs: list[LiveSequence | None] = []  # None: a slot freed by remove()
        try:
            for prompt, request in zip(prompts, requests):
                blocks, cached = runner.blocks.match_prefix(prompt)
                self.seqs.append(LiveSequence(request, list(prompt), cached, blocks, len(prompt)))
                runner.stats.reused_tokens += cached
        except BaseException:
            self.close()
            raise

    def step(
        self,
        indices: Sequence[int],
        drafts: Sequence[Sequence[int]],
        end_id: int,
        sampling: SamplingConfig,
    ) -> list[StepResult]:
        """Verify ``drafts[j]`` for sequence ``indices[j]``; all in one forward pass."""
        runner = self.runner
        seqs = [self.seqs[i] for i in indices]
        new_tokens, contexts, tables, n_logits = [], [], [], []
        for s, draft in zip(seqs, drafts):
            feed = s.tokens[s.cached :] + list(draft)
            ctx = len(s.tokens) + len(draft)
            if ctx > runner.limits.max_seq_len:
                raise UserError(
                    f"sequence length {ctx} exceeds the engine's max_seq_len {runner.limits.max_seq_len}; "
                    "lower --max_output_len or rebuild with a larger --max_seq_len"
                )
            runner.blocks.ensure_capacity(s.blocks, ctx)
            new_tokens.append(feed)
            contexts.append(ctx)
            tables.append(s.blocks.blocks)
            n_logits.append(len(draft) + 1)
        logits = runner.forward(new_tokens, contexts, tables, n_logits)
        runner.stats.forward_calls += 1
        runner.stats.forward_tokens += sum(len(t) for t in new_tokens)

        requests, positions = [], []
        for s, draft in zip(seqs, drafts):
            requests.extend([s.request] * (len(draft) + 1))
            positions.extend(range(len(s.tokens), len(s.tokens) + len(draft) + 1))
        chosen = select_tokens(logits, sampling, requests, positions)

        results = []
        row = 0
        for s, draft in zip(seqs, drafts):
            mine = chosen[row : row + len(draft) + 1]
            row += len(draft) + 1
            accepted = 0
            while accepted < len(draft) and draft[accepted] == mine[accepted] and draft[accepted] != end_id:
                accepted += 1
            out = mine[: accepted + 1]
            finished = out[-1] == end_id
            s.cached = len(s.tokens) + accepted
            s.tokens.extend(out)
            s.stats.output_ids.extend(out)
            s.stats.num_draft_tokens += len(draft)
            s.stats.num_accepted_draft_tokens += accepted
            s.stats.finished = finished
            results.append(StepResult(out, accepted, finished))
        return results

    def add(self, prompt: Sequence[int], request: int) -> int:
        """Join a new sequence between steps (continuous batching); return its index.

        The prompt is checked against the engine limits (``max_input_len``, vocabulary,
        ``max_batch_size`` live sequences); its cached prefix is mapped as in ``open``.
        Indices of the other sequences do not change; a freed slot is reused.
        """
        live = sum(s is not None for s in self.seqs)
        validate_batch([prompt], self.runner.limits)
        if live >= self.runner.limits.max_batch_size:
            raise UserError(f"the batch already holds max_batch_size={self.runner.limits.max_batch_size} sequences")
        blocks, cached = self.runner.blocks.match_prefix(prompt)
        self.runner.stats.reused_tokens += cached
        seq = LiveSequence(request, list(prompt), cached, blocks, len(prompt))
        for i, s in enumerate(self.seqs):
            if s is None:
                self.seqs[i] = seq
                return i
        self.seqs.append(seq)
        return len(self.seqs) - 1

    def remove(self, index: int) -> LiveSequence:
        """Leave the batch between steps: release the sequence's blocks (registered for
        reuse) and free its slot. O(blocks)."""
        s = self.seqs[index]
        if s is None:
            raise KeyError(f"sequence {index} is not in the batch")
        self.seqs[index] = None
        self.runner.blocks.release(s.blocks, s.tokens[: s.cached])
        return s

    def close(self) -> None:
        """Release every sequence's blocks (registering them for reuse)."""
        for s in self.seqs:
            if s is not None:
                self.runner.blocks.release(s.blocks, s.tokens[: s.cached])
        self.seqs = []


class TorchRunner:
    """Runs a ``LlamaForCausalLM`` with the paged KV cache; implements ``Runner``."""

    def __init__(
        self,
        hf_model: torch.nn.Module,
        limits: EngineLimits,
        *,
        tokens_per_block: int = 32,
        max_tokens_in_paged_kv_cache: int | None = None,
        kv_cache_enable_block_reuse: bool = True,
        cuda_graph_mode: bool | None = None,
    ) -> None:
        """``cuda_graph_mode``: replay captured CUDA graphs for decoding steps
        (:mod:`.cuda_graphs`); ``None`` turns them on when the model is on a CUDA device."""
        self.hf_model = hf_model  # the weights container (shared with the fused copies in self.model)
        self.model = PagedLlama(hf_model)
        self.limits = limits
        cfg = hf_model.config
        if max_tokens_in_paged_kv_cache is None:
            # Room for a full batch at max length, plus as much again for reuse.
            max_tokens_in_paged_kv_cache = 2 * limits.max_batch_size * limits.max_seq_len
        num_blocks = 1 + -(-max_tokens_in_paged_kv_cache // tokens_per_block)
        self.pool = KVPool(
            cfg.num_hidden_layers,
            self.model.num_kv_heads,
            self.model.head_dim,
            tokens_per_block,
            num_blocks,
            dtype=self.model.dtype,
            device=self.model.device,
        )
        self.blocks = BlockManager(self.pool, enable_reuse=kv_cache_enable_block_reuse)
        self.stats = RunnerStats()
        self._step_costs: list[float] = []
        on_cuda = self.model.device.type == "cuda"
        if cuda_graph_mode and not on_cuda:
            raise UserError(f"--cuda_graph_mode needs the model on a CUDA device, but it is on {self.model.device}; "
                            "pass --device cuda or drop --cuda_graph_mode")
        self.graphs: CudaGraphs | None = None
        if on_cuda and cuda_graph_mode is not False:
            self.graphs = CudaGraphs(self.model, self.pool, max_batch_size=limits.max_batch_size,
                                     max_q=limits.max_draft_len + 1, max_seq_len=limits.max_seq_len)

    def forward(
        self, new_tokens: list[list[int]], contexts: list[int], tables: list[list[int]], n_logits: list[int]
    ) -> torch.Tensor:
        """One forward pass (see :func:`build_layout` for the arguments): on a captured CUDA
        graph when one fits the step, else eagerly. Returns the wanted logit rows."""
        graphs = self.graphs
        if graphs is not None and graphs.fits(len(new_tokens), max(len(t) for t in new_tokens)):
            return graphs.run(new_tokens, contexts, tables, n_logits)
        layout = build_layout(new_tokens, contexts, tables, n_logits, self.pool.block_size, self.model.device)
        return self.model(layout, self.pool)

    def step_costs(self, max_tokens: int, context: int = 128) -> list[float]:
        """Relative wall time of one step feeding ``q`` tokens, ``costs[q]`` for ``1 <= q <= max_tokens``.

        Measured once (and extended on demand) on a scratch sequence of ``context``
        tokens: the minimum of two timed forward passes per size, divided by the
        one-token time. Used by the cost-aware draft length policy; never changes output.
        """
        import time

        from .device import synchronize

        if len(self._step_costs) > max_tokens:
            return self._step_costs[: max_tokens + 1]
        seq = SequenceBlocks()
        room = self.blocks.num_available * self.pool.block_size - max_tokens
        context = max(1, min(context, room))  # stay within a small KV budget
        try:
            self.blocks.ensure_capacity(seq, context + max_tokens)
            self.forward([[0] * context], [context], [seq.blocks], [1])  # real K/V for the scratch context
            times = [0.0]
            for q in range(1, max_tokens + 1):
                best = float("inf")
                for rep in range(3):
                    synchronize(self.model.device)
                    start = time.perf_counter()
                    self.forward([[0] * q], [context + q], [seq.blocks], [q])
                    synchronize(self.model.device)
                    if rep:  # the first run is a warm-up
                        best = min(best, time.perf_counter() - start)
                times.append(best)
        finally:
            self.blocks.release(seq, [])
        self._step_costs = [0.0] + [t / times[1] for t in times[1:]]
        return self._step_costs

    def open(
        self,
        prompts: Sequence[Sequence[int]],
        requests: Sequence[int] | None = None,
        *,
        max_len: int | None = None,
    ) -> DecodeBatch:
        """Start a batch of sequences, validated against the engine limits
        (``max_len``: see :func:`validate_batch`)."""
        validate_batch(prompts, self.limits, max_len=max_len)
        return DecodeBatch(self, prompts, requests if requests is not None else range(len(prompts)))

    def generate(
        self,
        batch_input_ids: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        end_id: int,
        draft_tokens_list: Sequence[Sequence[int]] | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        request_ids: Sequence[int] | None = None,
    ) -> list[GenerationOutput]:
        """Continue each sequence.

        With ``draft_tokens_list``: exactly one verification step per sequence, returning
        the accepted draft prefix and one token of the target's own (at most
        ``max_new_tokens``; drafts are cut to ``max_new_tokens - 1``). Without: plain
        decoding for up to ``max_new_tokens`` tokens or until ``end_id``.
        """
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        # Whole sequences are re-submitted (prompt plus output so far): bounded by max_seq_len.
        batch = self.open(batch_input_ids, request_ids, max_len=self.limits.max_seq_len - 1)
        try:
            live = list(range(len(batch_input_ids)))
            if draft_tokens_list is not None:
                drafts = [list(d)[: max_new_tokens - 1] for d in draft_tokens_list]
                batch.step(live, drafts, end_id, sampling)
            else:
                for _ in range(max_new_tokens):
                    results = batch.step(live, [[] for _ in live], end_id, sampling)
                    live = [i for i, r in zip(live, results) if not r.finished]
                    if not live:
                        break
            return [s.stats for s in batch.seqs]
        finally:
            batch.close()
