"""CUDA graphs for the paged forward pass: one captured graph per padded step shape.

Why: on a GPU a decoding step of a small model is bound by the host, not the GPU. One
step launches dozens of short kernels per layer; issuing them one by one from
PyTorch takes far longer than running them, for 1 token or 32 alike. A captured graph
issues them all at once. docs/benchmarks.md (the GPU section) has the measurements.

Shapes. A step feeds ``B`` sequences ``q_b`` new tokens each, attending to at most
``K = max(ctx_b)`` slots. It runs on the graph for the bucket ``(B', Q', K')``: ``B'`` and
``Q'`` the next powers of two (``Q' <= max_q``). The eager forward gathers the attended
slots, so ``K'`` is part of its shape: the next power of two of at least :data:`MIN_K`,
capped at ``max_seq_len`` rounded up to whole blocks. The compiled forward
(:mod:`.compiled`) reads the pool in place (:mod:`.paged_attention`), so its buckets have
one ``K'`` and depend on ``(B', Q')`` alone. Steps that do not fit
(prefill of a long prompt) run eagerly. Graphs are captured lazily, at the first step of
their shape (a capture costs tens of forward steps), or ahead of time by :meth:`CudaGraphs.warmup`; they share
one memory pool.

Padding. Sequence ``b`` puts its tokens at ``[b, 0:q_b]`` (as :func:`build_layout`).
Padded token slots and padded sequences write their K/V into the scratch block, read the
scratch block beyond each sequence's context, and attend to key 0 only, so every softmax
row is finite; their logits are computed and dropped. The mask is built inside the graph
from the block tables, the context lengths and a ``[Q, Q]`` row-visibility matrix per
sequence, so token trees (:class:`~.paged_llama.SequenceRows`) replay on the same graphs
as chains.

Inputs travel in one host-to-device copy: the integer inputs (token ids, positions and
write slots ``[B, Q]``, block tables ``[B, ceil(K / block_size)]``, contexts and bases
``[B]``, visibility ``[B, Q, Q]``) are views of a single flat ``int64`` buffer per graph.
Outputs: the logits of all ``B' * Q'`` rows, of which the
wanted rows are gathered after the replay (the gather leaves the graph's memory).

Exactness: the graph runs the very :meth:`PagedLlama.forward` of the eager path, on
padded shapes, so it computes the same operations; as with any change of shape,
floating-point results may differ in the last bits from an unpadded step. Plain and
speculative steps both go through it, and ``tests/runtime/test_cuda.py`` checks greedy
prompt lookup token for token against plain decoding and against Hugging Face.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .kv_cache import SCRATCH_BLOCK, KVPool
from .paged_attention import pool_block_mask
from .paged_llama import BatchLayout, PagedLlama, Parents, row_tree

MIN_K = 256  # smallest attended-slot bucket


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def padded_inputs(
    shape: tuple[int, int, int],
    new_tokens: list[list[int]],
    contexts: list[int],
    tables: list[list[int]],
    n_logits: list[int],
    block_size: int,
    parents: Sequence[Parents] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step padded to ``shape = (B, Q, K)``, as one flat ``int64`` CPU tensor (the layout
    :func:`padded_layout` reads), and the flat indices of the wanted logit rows.

    The block tables travel as ``[B, ceil(K / block_size)]`` (scratch-padded), not as
    slots: the slots, or FlexAttention's block mask, are derived on the device.
    ``parents[b]`` makes sequence ``b``'s rows a tree (:class:`~.paged_llama.SequenceRows`).
    Cost: O(B * (Q^2 + K / block_size)) Python integers, one tensor built from them."""
    B, Q, K = shape
    width = -(-K // block_size)
    n = B * Q
    scratch = SCRATCH_BLOCK * block_size
    ids, pos, write = [0] * n, [0] * n, [scratch] * n
    blocks = [SCRATCH_BLOCK] * (B * width)
    ctx, base = [1] * B, [0] * B  # padded sequences attend to key 0 only
    padded_row = [1] + [0] * (Q - 1)  # padded rows see one finite key (their logits are dropped)
    visible = padded_row * n
    rows: list[int] = []
    for b, (toks, c, table, keep) in enumerate(zip(new_tokens, contexts, tables, n_logits)):
        q, first = len(toks), b * Q
        start = c - q
        depth, seen = row_tree(parents[b] if parents is not None else None, q)
        ids[first : first + q] = toks
        pos[first : first + q] = [start + d for d in depth]
        write[first : first + q] = [table[s // block_size] * block_size + s % block_size for s in range(start, c)]
        live = table[: -(-c // block_size)]
        blocks[b * width : b * width + len(live)] = live
        ctx[b], base[b] = c, start
        for r, bits in enumerate(seen):
            visible[(first + r) * Q : (first + r + 1) * Q] = _bit_row(bits, Q)
        rows.extend(range(first + q - keep, first + q))
    flat = torch.tensor(ids + pos + write + blocks + ctx + base + visible, dtype=torch.long)
    return flat, torch.tensor(rows, dtype=torch.long)


@functools.lru_cache(maxsize=4096)
def _bit_row(bits: int, width: int) -> tuple[int, ...]:
    """The low ``width`` bits of ``bits`` as 0/1 values, lowest first (memoised: a chain's
    rows repeat from step to step)."""
    return tuple((bits >> j) & 1 for j in range(width))


def padded_layout(
    inputs: torch.Tensor, shape: tuple[int, int, int], block_size: int, pool_blocks: int | None = None
) -> BatchLayout:
    """The :class:`BatchLayout` over views of ``inputs`` (see :func:`padded_inputs`), with
    every row's logits wanted and attention described from the device-side tables.

    Row ``r`` of sequence ``b`` sees key ``k`` iff ``k < ctx[b]`` and either ``k < base[b]``
    (the cached context) or ``visible[b, r, k - base[b]]`` (its own tree among the step's rows).
    ``pool_blocks`` (the pool's block count) given: attention reads the pool in place through
    a FlexAttention block mask (:mod:`.paged_attention`; ``K`` then plays no part in the
    computation); else the ``K`` slots are gathered per layer under a dense ``[B, 1, Q, K]`` mask."""
    B, Q, K = shape
    n = B * Q
    width = -(-K // block_size)
    ids, pos, write = inputs[:n].view(B, Q), inputs[n : 2 * n].view(B, Q), inputs[2 * n : 3 * n].view(B, Q)
    tables = inputs[3 * n : 3 * n + B * width].view(B, width)
    rest = 3 * n + B * width
    ctx, base = inputs[rest : rest + B], inputs[rest + B : rest + 2 * B]
    visible = inputs[rest + 2 * B :].view(B, Q, Q)
    every_row = torch.arange(n, device=inputs.device)
    if pool_blocks is not None:
        block_mask = pool_block_mask(tables, ctx, base, visible, block_size, pool_blocks)
        return BatchLayout(input_ids=ids, positions=pos, write_slots=write, read_slots=None, contiguous_start=0,
                           kv_len=K, mask=None, logit_rows=every_row, block_mask=block_mask)
    offsets = torch.arange(block_size, device=inputs.device)
    key = torch.arange(K, device=inputs.device)
    read = (tables.unsqueeze(-1) * block_size + offsets).view(B, width * block_size)[:, :K]
    # slots past a context may never have been written: read the (zeroed) scratch slot instead
    read = torch.where(key.view(1, K) < ctx.view(B, 1), read, SCRATCH_BLOCK * block_size)
    rel = key.view(1, 1, K) - base.view(B, 1, 1)  # [B, 1, K]: key's row index among the step's rows
    own = visible.gather(2, rel.clamp(0, Q - 1).expand(B, Q, K)) != 0
    mask = ((rel < 0) | ((rel < Q) & own)) & (key.view(1, 1, K) < ctx.view(B, 1, 1))
    return BatchLayout(input_ids=ids, positions=pos, write_slots=write, read_slots=read, contiguous_start=0,
                       kv_len=K, mask=mask.unsqueeze(1), logit_rows=every_row)


@dataclass(frozen=True)
class StepBuckets:
    """The padded step shapes ``(B', Q', K')`` of a runner (see the module docstring), shared
    by the CUDA graphs and the compiled forward (:mod:`.compiled`), which both hold one
    graph per bucket. Invariant: every bucket has ``B' <= max_b``, ``Q' <= max_q`` (powers of
    two) and ``MIN_K <= K'`` (a power of two) or ``K' == max_k``. With ``by_context`` off
    (attention that reads the pool in place, :mod:`.paged_attention`) ``K' == max_k``
    always, so the buckets are the ``(B', Q')`` pairs alone."""

    max_b: int
    max_q: int
    max_k: int
    by_context: bool = True

    @classmethod
    def for_limits(
        cls, max_batch_size: int, max_q: int, max_seq_len: int, block_size: int, *, by_context: bool = True
    ) -> "StepBuckets":
        return cls(next_pow2(max_batch_size), next_pow2(max_q), -(-max_seq_len // block_size) * block_size, by_context)

    def fits(self, batch: int, max_q: int) -> bool:
        return batch <= self.max_b and max_q <= self.max_q

    def bucket(self, batch: int, max_q: int, max_ctx: int) -> tuple[int, int, int]:
        k = min(max(next_pow2(max_ctx), MIN_K), self.max_k) if self.by_context else self.max_k
        return next_pow2(batch), next_pow2(max_q), k

    def all_up_to(self, max_batch: int, max_context: int) -> list[tuple[int, int, int]]:
        """Every bucket a run of up to ``max_batch`` sequences and ``max_context`` tokens can need."""
        top_b, _, top_k = self.bucket(min(max_batch, self.max_b), 1, max_context)
        batches = [1 << i for i in range(top_b.bit_length())]  # 1, 2, 4, ..., top_b
        tokens = [1 << i for i in range(self.max_q.bit_length())]
        contexts = [k for k in (MIN_K << i for i in range(top_k.bit_length())) if k < top_k and self.by_context]
        return list(itertools.product(batches, tokens, contexts + [top_k]))


PaddedForward = Callable[[torch.Tensor, tuple[int, int, int]], torch.Tensor]  # (inputs, shape) -> all rows' logits


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    inputs: torch.Tensor  # flat int64 (padded_inputs): ids, positions, write slots, tables, contexts, bases, visibility
    logits: torch.Tensor  # [B*Q, vocab]


class CudaGraphs:
    """Captured forward passes of ``model`` over ``pool`` on its CUDA device."""

    def __init__(
        self,
        model: PagedLlama,
        pool: KVPool,
        buckets: StepBuckets,
        forward: PaddedForward | None = None,
    ) -> None:
        """``forward(inputs, shape)``: the padded step to capture, for the shapes of ``buckets``
        (default: the eager :meth:`PagedLlama.forward` over :func:`padded_layout`, which gathers
        the attended slots; the compiled one of :mod:`.compiled`, with its own buckets)."""
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model = model
        self.pool = pool
        self.buckets = buckets
        self.forward: PaddedForward = forward or (
            lambda inputs, shape: model(padded_layout(inputs, shape, pool.block_size), pool))
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def fits(self, batch: int, max_q: int) -> bool:
        return self.buckets.fits(batch, max_q)

    def bucket(self, batch: int, max_q: int, max_ctx: int) -> tuple[int, int, int]:
        return self.buckets.bucket(batch, max_q, max_ctx)

    def warmup(self, max_batch: int, max_context: int) -> int:
        """Capture every bucket a run of up to ``max_batch`` sequences and ``max_context``
        tokens can need, so no step pays for a capture later (each takes ~0.1 s). Returns
        how many graphs were captured."""
        missing = [s for s in self.buckets.all_up_to(max_batch, max_context) if s not in self.graphs]
        for shape in missing:
            self.graphs[shape] = self._capture(*shape)
        return len(missing)

    def run(
        self,
        new_tokens: list[list[int]],
        contexts: list[int],
        tables: list[list[int]],
        n_logits: list[int],
        parents: Sequence[Parents] | None = None,
    ) -> torch.Tensor:
        """Logits ``[sum(n_logits), vocab]`` in the order of :func:`build_layout`'s ``logit_rows``."""
        B, Q, K = self.bucket(len(new_tokens), max(len(t) for t in new_tokens), max(contexts))
        g = self.graphs.get((B, Q, K))
        if g is None:
            g = self.graphs[(B, Q, K)] = self._capture(B, Q, K)
        host, rows = padded_inputs((B, Q, K), new_tokens, contexts, tables, n_logits, self.pool.block_size, parents)
        g.inputs.copy_(host.pin_memory(), non_blocking=True)
        g.graph.replay()
        return g.logits.index_select(0, rows.pin_memory().to(g.logits.device, non_blocking=True))

    def _capture(self, B: int, Q: int, K: int) -> _Graph:
        dev = self.model.device
        # an empty step: warm-up and capture write only into the scratch block
        empty, _ = padded_inputs((B, Q, K), [], [], [], [], self.pool.block_size)
        inputs = empty.to(dev)

        def step() -> torch.Tensor:
            # Everything but `inputs`, the weights and the KV pool is computed inside the graph
            # (the mask and row indices included), so it is recomputed at every replay and no
            # tensor allocated outside the capture can be freed under it.
            return self.forward(inputs, (B, Q, K))

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            step()  # warm-up: lazy initialisation (cuBLAS handles, kernels) stays out of the graph
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = step()
        return _Graph(graph, inputs, logits)
