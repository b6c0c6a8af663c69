"""The paged forward pass compiled by ``torch.compile`` (inductor), one graph per padded step shape.

What is compiled: the step :meth:`PagedLlama.paged_forward` runs over
:func:`~.cuda_graphs.padded_layout` (the very step the CUDA graphs capture), compiled
*regionally*: :meth:`PagedLlama.decoder_layer` is compiled once per bucket and that code
serves every layer, since layers differ only in their weights, which are the compiled
graph's inputs (dynamo does not specialise on the layer object). So compiling costs the
same for 30 layers as for 1. Around the layers run, uncompiled, the embedding lookup, the
rotary table, the layout (the attention mask or block mask, built from the block
tables, the context lengths and each sequence's ``[Q, Q]`` row visibility, so token trees
(:class:`~.paged_llama.SequenceRows`) run on the same graphs as chains) and the final norm
and LM head; under CUDA graphs they are captured with the layers. Inductor fuses each
layer's elementwise work around the matmuls (RMSNorm with the residual add, the rotary
embedding, SiLU times up) into a few generated kernels, C++ on the CPU and Triton on a GPU.

Attention: FlexAttention reads each layer's KV pool in place through a block mask made of
the block tables (:mod:`.paged_attention`); nothing is copied per layer, and a graph's shape
depends on ``(B', Q')`` alone, so a run needs one graph per (batch, tokens) bucket:
``log2(B') + 1`` times ``log2(Q') + 1`` of them at most. (``bench/bench_compiled.py``
times the alternative, gathering the attended K/V rows per layer under a dense mask.)

Shapes. Every graph is compiled for static shapes (``dynamic=False``): a step runs on the
graph of its bucket, and steps that fit no bucket (the prefill of a long prompt) run eagerly.

Costs. Compiling one bucket takes seconds for a tiny model and far longer for a real one
(docs/benchmarks.md); :meth:`CompiledForward.warmup` compiles ahead of a run, inductor keeps its
own on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) that makes a second process's compiles
cheaper, and an engine built with ``--torch_compile inductor`` carries PyTorch's compile
caches for its buckets (:mod:`promptlookup.engine.compile_cache`). A step then costs one padded forward of ``B' * Q'`` rows; each sequence's
rows visit only the blocks its context occupies.
docs/benchmarks.md has the CPU measurements against the eager path.

Exactness: the same operations as the eager forward on padded shapes, in fp32 with
another fusion and summation order, so logits agree to rounding (checked with
``atol=1e-4`` in ``tests/runtime/test_compiled.py``) and greedy choices are the same.

On a GPU with CUDA graphs on, the graphs capture this compiled step (one capture per
bucket, after the compile); that combination has not been run here (no GPU).

The projections must be :class:`~.paged_llama.DenseLinear` (``F.linear``): dynamo cannot trace
oneDNN's opaque packed weights (:class:`~.cpu_linear.CpuLinear`), so a compiled model on the
CPU is built with ``dense_projections=True``.
"""
from __future__ import annotations

import importlib.util
import shutil
from typing import Sequence

import torch

from ..errors import UserError
from .cpu_linear import CpuLinear
from .cuda_graphs import StepBuckets, padded_inputs, padded_layout
from .kv_cache import KVPool
from .paged_attention import check_block_size, check_compiled_attention
from .paged_llama import PagedLlama, Parents


def inductor_unavailable_reason(device: torch.device) -> str | None:
    """Why inductor cannot compile for ``device`` here (``None``: it can, as far as one can tell
    without compiling): it needs a C++ compiler on the CPU and Triton on a GPU."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "torch.compile (inductor) needs a C++ compiler on the CPU and none was found"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile (inductor) needs Triton on a GPU and it is not installed"
    return None


class CompiledForward:
    """The inductor-compiled padded step of ``model`` over ``pool``, one graph per bucket.

    ``buckets`` must not split contexts (made with ``by_context=False``): attention reads the
    pool in place (see the module docstring).
    Graphs are compiled lazily, at the first step of their bucket, or by :meth:`warmup`.
    Raises :class:`UserError` when inductor is unavailable or the pool's blocks are too
    small for its attention kernels, and, before the first compiled step, when that kernel
    fails :func:`~.paged_attention.check_compiled_attention` for these shapes on this
    machine; ``ValueError`` when the model holds oneDNN-packed projections (build it with
    ``dense_projections=True``).
    """

    def __init__(self, model: PagedLlama, pool: KVPool, buckets: StepBuckets) -> None:
        reason = inductor_unavailable_reason(model.device)
        if reason is not None:
            raise UserError(f"--torch_compile inductor: {reason}; use --torch_compile off")
        if any(isinstance(getattr(b, n), CpuLinear) for b in model.layers for n in ("qkv", "o_proj", "gate_up", "down_proj")):
            raise ValueError("the compiled forward needs a PagedLlama built with dense_projections=True")
        if buckets.by_context:
            raise ValueError("in-place attention needs buckets with by_context=False")
        check_block_size(pool.block_size)
        self._probed = False  # the attention kernel is probed before its first compiled step
        self._pool_blocks: int | None = pool.num_blocks  # padded_layout's in-place attention
        import torch._dynamo.config as dynamo_config

        self.model = model
        self.pool = pool
        self.buckets = buckets
        n_buckets = len(buckets.all_up_to(buckets.max_b, buckets.max_k))
        # one compiled graph per bucket; dynamo's default allows only 8 per function
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, n_buckets)
        dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 2 * n_buckets)
        # one decoder layer, compiled once per bucket and reused by every layer
        self._layer = torch.compile(model.decoder_layer, backend="inductor", dynamic=False, fullgraph=True)
        self.shapes: set[tuple[int, int, int]] = set()  # buckets run so far (each compiled once)

    def padded_forward(self, inputs: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
        """Logits of all ``B' * Q'`` rows of the padded step ``inputs`` (:func:`padded_inputs`, on the model's device)."""
        model, pool = self.model, self.pool
        if not self._probed:  # here, not at construction: an engine's compile caches are loaded by now
            check_compiled_attention(str(model.device), model.dtype, model.num_heads, model.num_kv_heads,
                                     model.head_dim, pool.block_size)
            self._probed = True
        self.shapes.add(shape)
        with torch.no_grad():
            layout = padded_layout(inputs, shape, pool.block_size, self._pool_blocks)
            h, cos, sin = model.embed(layout)
            write = layout.write_slots.reshape(-1)
            for i, layer in enumerate(model.layers):
                h = self._layer(layer, h, cos, sin, write, layout, pool.k[i], pool.v[i])
            return model.logits(h, layout)

    def fits(self, batch: int, max_q: int) -> bool:
        return self.buckets.fits(batch, max_q)

    def run(
        self,
        new_tokens: list[list[int]],
        contexts: list[int],
        tables: list[list[int]],
        n_logits: list[int],
        parents: Sequence[Parents] | None = None,
    ) -> torch.Tensor:
        """Logits ``[sum(n_logits), vocab]`` in the order of :func:`~.paged_llama.build_layout`'s ``logit_rows``."""
        shape = self.buckets.bucket(len(new_tokens), max(len(t) for t in new_tokens), max(contexts))
        host, rows = padded_inputs(shape, new_tokens, contexts, tables, n_logits, self.pool.block_size, parents)
        dev = self.model.device
        return self.padded_forward(host.to(dev), shape).index_select(0, rows.to(dev))

    def warmup(self, max_batch: int, max_context: int) -> int:
        """Compile every bucket a run of up to ``max_batch`` sequences and ``max_context``
        tokens can need (an empty step each, written to the scratch block only). Returns how
        many were compiled."""
        missing = [s for s in self.buckets.all_up_to(max_batch, max_context) if s not in self.shapes]
        dev = self.model.device
        for shape in missing:
            empty, _ = padded_inputs(shape, [], [], [], [], self.pool.block_size)
            self.padded_forward(empty.to(dev), shape)
        return len(missing)
