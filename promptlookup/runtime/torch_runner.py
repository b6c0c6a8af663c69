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

Per-step invariant: one device-to-host transfer. The forward pass, token selection and
draft acceptance all run on the model's device; the host receives the chosen tokens and
the accepted path ends in a single copy (:meth:`DecodeBatch.step_trees`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..defaults import DEFAULT_COMPILE_MODE, DEFAULT_CPU_WEIGHT_COPIES, DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE
from ..errors import UserError, one_line
from .base import EngineLimits, GenerationOutput, RunnerCapabilities, RunnerStats, SamplingConfig, validate_batch
from .batch_costs import BatchStepCosts
from .compiled import CompiledForward
from .cuda_graphs import CudaGraphs, StepBuckets
from .kernels import step_ops
from .kv_cache import SCRATCH_BLOCK, BlockManager, KVPool, SequenceBlocks, pool_blocks
from .logits_processors import apply_logits_processors, row_prefixes
from .logprobs import TokenLogprob, along_path, fetch_step_with_logprobs
from .options import KvCacheConfig, RuntimeConfig
from .paged_llama import PagedLlama, Parents, build_layout
from .sampling import select_tokens
from .tree import DraftTree


@dataclass
class LiveSequence:
    request: int  # keys the sampling noise
    tokens: list[int]
    cached: int
    blocks: SequenceBlocks
    prompt_len: int

    @property
    def output_ids(self) -> list[int]:
        """The tokens after the prompt (a new list; O(output))."""
        return self.tokens[self.prompt_len :]


@dataclass
class StepResult:
    """One sequence's raw outcome of one live-batch step (:class:`~.base.StepOutput`), not a
    result: the loops fold it into a :class:`~.results.StepEvent` through
    ``RequestState.commit``, which counts the drafted tokens from the tree."""

    tokens: list[int]  # accepted draft tokens, then the target's own token (cut at end_id)
    accepted: int  # draft tokens kept: the first ``accepted`` of ``tokens``
    finished: bool
    choices: list[int] = field(default_factory=list)  # the target's choice at the root, then at every node
    logprobs: list[TokenLogprob] | None = None  # per token of ``tokens``, where asked (:mod:`.logprobs`)


PADDING_FREE_ROWS = 128  # a forward pass this small is kept whole, however much of it is padding
PADDING_SLACK = 1.5  # else its padded rows may be at most this many times the rows fed


def padding_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Split one step's sequences (feeding ``lengths[j]`` tokens each) into forward passes.

    A forward pass pads every sequence to its longest, so a new request's prompt (hundreds
    of tokens) joining a decoding batch would make every member compute that many rows.
    Sequences are taken longest first; one joins the current pass while the padded rows
    stay within :data:`PADDING_FREE_ROWS` or within :data:`PADDING_SLACK` times the rows
    actually fed. Steps of similar lengths (decoding, verification) stay one pass. Returns index lists, each
    ascending, covering ``range(len(lengths))``. Cost: O(B log B).
    """
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    groups: list[list[int]] = []
    fed = longest = 0
    for j in order:
        if groups and (len(groups[-1]) + 1) * longest <= max(PADDING_FREE_ROWS, PADDING_SLACK * (fed + lengths[j])):
            groups[-1].append(j)
            fed += lengths[j]
        else:
            groups.append([j])
            fed, longest = lengths[j], lengths[j]
    return [sorted(g) for g in groups]


class DecodeBatch:
    """Live sequences sharing one forward pass per step. Close it to release the blocks."""

    def __init__(self, runner: "TorchRunner", prompts: Sequence[Sequence[int]], requests: Sequence[int]) -> None:
        self.runner = runner
        self.seqs: list[LiveSequence | None] = []  # None: a slot freed by remove()
        try:
            for prompt, request in zip(prompts, requests):
                self.seqs.append(self._join(prompt, request))
        except BaseException:
            self.close()
            raise

    def _join(self, prompt: Sequence[int], request: int) -> LiveSequence:
        """A new live sequence with its longest cached prefix mapped onto blocks."""
        blocks, cached = self.runner.blocks.match_prefix(prompt)
        self.runner.stats.reused_tokens += cached
        return LiveSequence(request, list(prompt), cached, blocks, len(prompt))

    def step(
        self,
        indices: Sequence[int],
        drafts: Sequence[Sequence[int]],
        end_id: int,
        sampling: SamplingConfig,
    ) -> list[StepResult]:
        """Verify ``drafts[j]`` (a chain) for sequence ``indices[j]``; all in one forward pass."""
        return self.step_trees(indices, [DraftTree.chain(d) for d in drafts], end_id, sampling)

    def step_trees(
        self,
        indices: Sequence[int],
        trees: Sequence[DraftTree],
        end_id: int,
        sampling: SamplingConfig, logprobs: Sequence[int | None] | None = None,
    ) -> list[StepResult]:
        """Verify ``trees[j]`` for sequence ``indices[j]`` in one forward pass, then commit
        each sequence's accepted path (the path :func:`~.tree.accept_path` gives).

        Invariant: **one device-to-host transfer per step.** Token selection (:func:`~.sampling.select_tokens`)
        and acceptance (:func:`~.acceptance.last_accepted_nodes`) run as tensor ops on the model's device,
        and :func:`~.logprobs.fetch_step_with_logprobs` brings back the chosen tokens at every row and
        the last accepted node per sequence in a single copy (``rows + sequences`` int64; float64 with
        the rows' raw log-probabilities of the sequences that ask, ``logprobs[j]`` alternatives each).
        Committing then costs O(accepted path) host work per sequence plus, when a branch
        other than the first is accepted, one K/V slot move."""
        chosen = self._select(indices, trees, sampling, end_id, keep_raw=logprobs is not None)
        choices, paths, lps = fetch_step_with_logprobs(trees, chosen, end_id, self.raw_logits, logprobs)
        results = []
        moves: list[tuple[int, int]] = []  # (from, to) physical slots of accepted tree nodes
        bs = self.runner.pool.block_size
        for i, tree, mine, path, lp in zip(indices, trees, choices, paths, lps):
            s = self.seqs[i]
            out = [tree.tokens[j] for j in path] + [mine[path[-1] + 1 if path else 0]]
            for depth, node in enumerate(path):  # node j sits in slot len(tokens) + j; it belongs at + depth
                if node != depth:
                    src, dst = len(s.tokens) + node, len(s.tokens) + depth
                    moves.append((s.blocks.blocks[src // bs] * bs + src % bs, s.blocks.blocks[dst // bs] * bs + dst % bs))
            accepted = len(path)
            finished = out[-1] == end_id
            s.cached = len(s.tokens) + accepted
            s.tokens.extend(out)
            results.append(StepResult(out, accepted, finished, mine, along_path(lp, path)))
        if moves:
            self.runner.pool.move_slots([m[0] for m in moves], [m[1] for m in moves])
        return results

    def _select(self, indices: Sequence[int], trees: Sequence[DraftTree], sampling: SamplingConfig,
                end_id: int | None = None, keep_raw: bool = False) -> torch.Tensor:
        """One forward pass: feed each selected sequence its pending tokens plus its tree's
        nodes (node ``j`` in slot ``len(tokens) + j``) and return the target's choices at
        every row, as an int64 tensor on the model's device (per sequence: the root, then
        every node). Nothing is read back to the host and nothing is committed."""
        runner = self.runner
        seqs = [self.seqs[i] for i in indices]
        new_tokens, contexts, tables, n_logits, parents = [], [], [], [], []
        chains = True
        for s, tree in zip(seqs, trees):
            pending = s.tokens[s.cached :]
            feed = pending + tree.tokens
            ctx = len(s.tokens) + len(tree)
            if ctx > runner.limits.max_seq_len:
                raise UserError(
                    f"sequence length {ctx} exceeds the engine's max_seq_len {runner.limits.max_seq_len}; "
                    "lower --max_output_len or rebuild with a larger --max_seq_len"
                )
            runner.blocks.ensure_capacity(s.blocks, ctx)
            new_tokens.append(feed)
            contexts.append(ctx)
            tables.append(s.blocks.blocks)
            n_logits.append(len(tree) + 1)
            p = len(pending)
            # Rows: the pending tokens (a chain), then the nodes (parent -1 is the root, row p - 1).
            parents.append(list(range(-1, p - 1)) + [q + p if q >= 0 else p - 1 for q in tree.parents])
            chains = chains and tree.is_chain
        groups = padding_groups([len(t) for t in new_tokens])
        per_seq: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        for group in groups:  # one forward pass, unless padding would waste most of it
            pick = lambda xs: [xs[j] for j in group]  # noqa: E731
            out = runner.forward(pick(new_tokens), pick(contexts), pick(tables), pick(n_logits),
                                 None if chains else pick(parents))
            for j, rows in zip(group, out.split(pick(n_logits))):
                per_seq[j] = rows
        logits = per_seq[0] if len(seqs) == 1 else torch.cat(per_seq)
        runner.stats.forward_calls += len(groups)
        runner.stats.forward_tokens += sum(len(t) for t in new_tokens)
        self.raw_logits = logits if keep_raw else None  # before any processor: what logprobs are read from

        requests, positions = [], []
        for s, tree in zip(seqs, trees):
            requests.extend([s.request] * (len(tree) + 1))
            root = len(s.tokens)  # the position of the token chosen at the root
            positions.append(root)
            positions.extend(root + d for d in tree.depths())
        if sampling.has_logits_processors:  # penalties / bad words: each row with its own prefix
            prompt_lens = [s.prompt_len for s, tree in zip(seqs, trees) for _ in range(len(tree) + 1)]
            logits = apply_logits_processors(logits, row_prefixes([s.tokens for s in seqs], trees), sampling,
                                             prompt_lens, end_id)
        return select_tokens(logits, sampling, requests, positions)

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
        seq = self._join(prompt, request)
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

    capabilities = RunnerCapabilities(live_batch=True, token_trees=True, logits_processors=True)

    def __init__(
        self,
        model: PagedLlama | torch.nn.Module,
        limits: EngineLimits,
        runtime: RuntimeConfig | None = None,
        kv_cache: KvCacheConfig | None = None,
        *,
        tokens_per_block: int = 32,
        step_cost_table: Sequence[float] | None = None,
        batch_step_costs: BatchStepCosts | None = None,
        max_tokens_in_paged_kv_cache: int | None = None,
        kv_cache_enable_block_reuse: bool = DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE,
        cuda_graph_mode: bool | None = None,
        cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES,
        compile_mode: str = DEFAULT_COMPILE_MODE,
    ) -> None:
        """``runtime`` and ``kv_cache`` (:mod:`.options`) come whole from ``load_runner``.
        Without them, the keywords of the same meaning (``run.py``'s names) make them, for
        callers that build a runner by hand; giving both a config and its keywords is a
        ``TypeError``. The model's device is where it already is: ``runtime.device`` is
        ``load_runner``'s placement.

        ``model``: a :class:`PagedLlama` (which then owns the weights: an engine load), or
        a ``LlamaForCausalLM`` left unchanged (its weights are fused into new tensors, with
        ``cpu_weight_copies`` as :class:`PagedLlama` takes it).
        ``cuda_graph_mode``: replay captured CUDA graphs for decoding steps
        (:mod:`.cuda_graphs`); ``None`` turns them on when the model is on a CUDA device.
        ``step_cost_table[q]``: the relative cost of a step feeding ``q`` tokens, measured
        when the engine was built (:mod:`promptlookup.engine.step_costs`); the cost-aware
        draft policy reads it, and ``None`` means full drafts; ``batch_step_costs`` is the
        batched counterpart the server's draft budget reads. The runner never times itself.
        ``compile_mode``: ``"inductor"`` runs steps that fit a bucket through the compiled
        forward (:mod:`.compiled`; a :class:`PagedLlama` must then have been built with
        ``dense_projections=True``), under the CUDA graphs when those are on; ``"off"`` eagerly."""
        loose = RuntimeConfig(cuda_graph_mode=cuda_graph_mode, compile_mode=compile_mode,
                              cpu_weight_copies=cpu_weight_copies)
        loose_kv = KvCacheConfig(kv_cache_enable_block_reuse, max_tokens_in_paged_kv_cache)
        if (runtime is not None and loose != RuntimeConfig()) or (kv_cache is not None and loose_kv != KvCacheConfig()):
            raise TypeError("give the runtime/kv_cache config or its fields as keywords, not both")
        runtime, kv_cache = runtime or loose, kv_cache or loose_kv
        self.runtime, self.kv_cache = runtime, kv_cache
        compiled = runtime.compile_mode == "inductor"
        cuda_graph_mode = runtime.cuda_graph_mode
        self.model = model if isinstance(model, PagedLlama) else PagedLlama.from_hf(
            model, cpu_weight_copies=runtime.cpu_weight_copies, dense_projections=compiled)
        self.limits = limits
        cfg = self.model.config
        kv_dtype = kv_cache.kv_dtype_for(self.model.dtype)
        self._check_kv_dtype(kv_dtype, compiled, cuda_graph_mode)
        num_blocks = pool_blocks(kv_cache, limits.max_batch_size, limits.max_seq_len, tokens_per_block,  # after weights
                                 KVPool.bytes_per_token(cfg.num_hidden_layers, self.model.num_kv_heads,
                                                        self.model.head_dim, kv_dtype), self.model.device)
        self.pool = KVPool(
            cfg.num_hidden_layers,
            self.model.num_kv_heads,
            self.model.head_dim,
            tokens_per_block,
            num_blocks,
            dtype=kv_dtype,
            device=self.model.device,
            zeroed=compiled,  # the compiled forward's attention reads whole blocks in place
        )
        if self.model.dtype != torch.float32:
            self._check_dtype_runs()
        self.blocks = BlockManager(self.pool, enable_reuse=kv_cache.enable_block_reuse)
        self.stats = RunnerStats()
        self.step_cost_table: list[float] | None = list(step_cost_table) if step_cost_table else None
        self.batch_step_costs = batch_step_costs
        on_cuda = self.model.device.type == "cuda"
        if cuda_graph_mode and not on_cuda:
            raise UserError(f"--cuda_graph_mode needs the model on a CUDA device, but it is on {self.model.device}; "
                            "pass --device cuda or drop --cuda_graph_mode")
        self.compiled: CompiledForward | None = None
        # what engine.load_runner's compile set-up did (engine/compile_cache.py: CompileSetup); None otherwise
        self.compile_setup: Any = None
        # the compiled step reads the pool in place, so its buckets are (batch, tokens) alone;
        # the eager step gathers the attended slots, so its buckets split contexts too
        buckets = StepBuckets.for_limits(limits.max_batch_size, limits.max_draft_len + 1, limits.max_seq_len,
                                         tokens_per_block, by_context=not compiled)
        if compiled:
            self.compiled = CompiledForward(self.model, self.pool, buckets)
        self.graphs: CudaGraphs | None = None
        if on_cuda and cuda_graph_mode is not False:
            self.graphs = CudaGraphs(self.model, self.pool, buckets,
                                     self.compiled.padded_forward if self.compiled is not None else None)

    def _check_kv_dtype(self, kv_dtype: torch.dtype, compiled: bool, cuda_graph_mode: bool | None) -> None:
        """Refuse, in one line, a KV cache type (``KvCacheConfig.dtype``) other than the
        engine's where the step would not read it: the compiled step and the CUDA graphs read
        the pool in place in the engine's dtype, and the C route of a float32 CPU engine
        stores float32 or float16 (:mod:`.kernels.step_ops`). The eager PyTorch route takes
        any (K/V cast as written and as read)."""
        model_dtype = self.model.dtype
        if kv_dtype == model_dtype:
            return
        name, engine = str(kv_dtype).removeprefix("torch."), str(model_dtype).removeprefix("torch.")
        flag = f"--kv_cache_dtype {name} (KvCacheConfig.dtype) on a {engine} engine"
        if compiled:
            raise UserError(f"{flag}: --torch_compile inductor reads the KV cache in the engine's dtype; drop one of "
                            "them (or pass --kv_cache_dtype auto)")
        if self.model.device.type == "cuda" and cuda_graph_mode is not False:
            raise UserError(f"{flag}: the CUDA graphs read the KV cache in the engine's dtype; pass "
                            "--no-cuda_graph_mode, or --kv_cache_dtype auto")
        if self.model.uses_step_ops and kv_dtype not in step_ops.KV_DTYPES:
            raise UserError(f"{flag}: the CPU kernels store K/V as float32 or float16; choose --kv_cache_dtype float16")

    def _check_dtype_runs(self) -> None:
        """Refuse, in one line and before any request, a half-precision model that this
        PyTorch cannot compute on its device (some builds lack float16 or bfloat16 kernels
        on the CPU or on older GPUs). Runs one token through the model eagerly, writing
        only into the KV pool's scratch block; cost: one single-token forward pass."""
        dtype = str(self.model.dtype).removeprefix("torch.")
        layout = build_layout([[0]], [1], [[SCRATCH_BLOCK]], [1], self.pool.block_size, self.model.device)
        try:
            self.model(layout, self.pool)
        except (RuntimeError, NotImplementedError) as exc:
            other = "bfloat16 or float32" if dtype == "float16" else "float32"
            raise UserError(f"this PyTorch cannot run a {dtype} engine on {self.model.device} ({one_line(exc, 160)}); "
                            f"convert the checkpoint with --dtype {other} and rebuild the engine") from None

    def forward(
        self,
        new_tokens: list[list[int]],
        contexts: list[int],
        tables: list[list[int]],
        n_logits: list[int],
        parents: Sequence[Parents] | None = None,
    ) -> torch.Tensor:
        """One forward pass (see :func:`build_layout` for the arguments): on a captured CUDA
        graph when one fits the step, else compiled when that is on and fits, else eagerly.
        Returns the wanted logit rows."""
        batch, max_q = len(new_tokens), max(len(t) for t in new_tokens)
        graphs = self.graphs
        if graphs is not None and graphs.fits(batch, max_q):
            return graphs.run(new_tokens, contexts, tables, n_logits, parents)
        if self.compiled is not None and self.compiled.fits(batch, max_q):
            return self.compiled.run(new_tokens, contexts, tables, n_logits, parents)
        layout = build_layout(new_tokens, contexts, tables, n_logits, self.pool.block_size, self.model.device, parents)
        return self.model(layout, self.pool)

    def describe(self) -> dict[str, Any]:
        """Where and how it runs (:meth:`~.base.Runner.describe`)."""
        return {"device": str(self.model.device), "dtype": str(self.model.dtype).removeprefix("torch."),
                "cuda_graphs": self.graphs is not None,
                "compile": self.compile_setup.as_json() if self.compile_setup is not None else None}

    @property
    def skips_padding(self) -> bool:
        """Whether a batched step computes its real rows only, not the padding up to its longest
        sequence (the CPU's C route, :func:`~.kernels.step_ops.layers`): the draft budget then
        prices a step by its rows (:func:`~promptlookup.decoding.draft_budget.allot_by_cost`)."""
        return self.model.layer_records is not None

    def open(
        self,
        prompts: Sequence[Sequence[int]],
        requests: Sequence[int] | None = None,
        *,
        max_new_tokens: int | None = None,
        resubmitted: bool = False,
    ) -> DecodeBatch:
        """Start a batch of sequences, validated against the engine limits
        (``max_new_tokens``, ``resubmitted``: see :func:`validate_batch`)."""
        validate_batch(prompts, self.limits, max_new_tokens=max_new_tokens, resubmitted=resubmitted)
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
        draft_trees: Sequence[DraftTree] | None = None,
    ) -> list[GenerationOutput]:
        """Continue each sequence.

        With ``draft_tokens_list``: exactly one verification step per sequence, returning
        the accepted draft prefix and one token of the target's own (at most
        ``max_new_tokens``; drafts are cut to ``max_new_tokens - 1``). With ``draft_trees``
        (this runner's extension of the V1 call; the caller keeps each tree's walkable
        depth below ``max_new_tokens``): one tree step per sequence, and each output also
        carries the target's ``choices`` at the root and every node. Without either: plain
        decoding for up to ``max_new_tokens`` tokens or until ``end_id``.
        """
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        # Whole sequences are re-submitted (prompt plus output so far): bounded by max_seq_len.
        batch = self.open(batch_input_ids, request_ids, max_new_tokens=1, resubmitted=True)
        try:
            live = list(range(len(batch_input_ids)))
            trees = draft_trees
            if trees is None and draft_tokens_list is not None:
                trees = [DraftTree.chain(list(d)[: max_new_tokens - 1]) for d in draft_tokens_list]
            if trees is not None:  # one verification step: its raw outcome is the call's
                return [GenerationOutput(r.tokens, tree.num_walkable, r.accepted, r.finished,
                                         r.choices if draft_trees is not None else [])
                        for tree, r in zip(trees, batch.step_trees(live, trees, end_id, sampling))]
            finished = [False] * len(live)
            for _ in range(max_new_tokens):
                results = batch.step(live, [[] for _ in live], end_id, sampling)
                for i, r in zip(live, results):
                    finished[i] = r.finished
                live = [i for i, r in zip(live, results) if not r.finished]
                if not live:
                    break
            return [GenerationOutput(s.output_ids, finished=f) for s, f in zip(batch.seqs, finished)]
        finally:
            batch.close()
