"""A Llama forward pass over a paged KV cache.

The weights come as a state dict with Hugging Face's names (from an engine, or from a
``transformers.LlamaForCausalLM`` in memory). On the CPU in float32 the work around the
products runs in C (:mod:`.kernels.step_ops`: Hugging Face's formulas, each row computed
alone, attention over the keys a row sees; values equal PyTorch's up to rounding). Elsewhere
(GPU, bf16/fp16, the compiled route) the arithmetic around the products is
Hugging Face's, element for element: RMSNorm is ``torch.rms_norm`` (whose CPU kernel
composes the very ops of ``LlamaRMSNorm``: pow, mean, add, rsqrt, two products), the MLP
activation is their ``ACT2FN``, and the rotary embedding is their table, applied to Q and
K together (:mod:`.rotary`). Each of these works row by row, so a row's values never
depend on how many rows share a step (what greedy identity of speculative decoding
rests on). This module
supplies the layout the paged cache needs (gpt-fast style): Q/K/V and gate/up
projections are fused into one matmul each at load time and the parts dropped, new K/V
are scattered into their cache slots, and attention runs through
``scaled_dot_product_attention`` with native grouped-query attention (no K/V copies per
head).

One call processes a batch of sequences, each contributing ``q_len[b]`` new tokens
(padded to ``Q``). For sequence ``b`` the new tokens fill slots ``ctx[b] - q_len[b] ..
ctx[b] - 1`` of its block table and attend to the slots before them and, among
themselves, causally (a chain) or along a token tree (:class:`~.batch_layout.SequenceRows`;
the layout is built by :mod:`.batch_layout`). Cost per call: the model's FLOPs for ``sum(q_len)`` tokens, plus a gather
of ``max(ctx)`` K/V rows per layer (skipped when a single sequence's blocks are contiguous).
On CPU the projections run through :class:`~.cpu_linear.CpuLinear` (the C kernels of
:mod:`.kernels` on the row-major weights, else oneDNN on weights reordered once).
Weight-only int8/int4 projections (codes with their scales in the state dict) run through
:class:`~.quant_linear.QuantLinear`, fused row-wise like the float ones, holding the codes
and scales only.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.activations import ACT2FN

from ..checkpoint.layout import (
    HF_DOWN,
    HF_EMBEDDING,
    HF_FINAL_NORM,
    HF_GATE,
    HF_INPUT_NORM,
    HF_K,
    HF_LM_HEAD,
    HF_O,
    HF_POST_NORM,
    HF_Q,
    HF_UP,
    HF_V,
    hf_layer_name,
)
from ..defaults import CPU_WEIGHT_COPIES, DEFAULT_CPU_WEIGHT_COPIES
from ..errors import UserError
# the step's layout lives in .batch_layout; its names are re-exported here for callers
from .batch_layout import BatchLayout, Parents, SequenceRows, build_layout, row_tree, sequence_rows  # noqa: F401
from .cpu_linear import GEMV_MAX_ROWS, CpuLinear
from .quant_linear import QuantLinear
from .kernels import step_ops
from .kv_cache import KVPool
from .paged_attention import pool_attention
from .rotary import RotaryTable, apply_rotary

Projection = Callable[[torch.Tensor], torch.Tensor]  # DenseLinear, CpuLinear on CPU, or QuantLinear


class DenseLinear:
    """``F.linear`` on a held weight (the GPU route; on CPU :class:`~.cpu_linear.CpuLinear`)."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PagedLlama(nn.Module):
    """A Llama model's weights, laid out for the paged forward pass, held once.

    Built from a state dict with Hugging Face names (:meth:`from_hf` takes them from a
    ``LlamaForCausalLM`` without changing it). The constructor *consumes* the dict: Q/K/V
    and gate/up are fused into one matrix each (gpt-fast's load-time fusion) and the
    parts are dropped from it; on CPU each projection keeps one copy of its weight
    (:class:`~.cpu_linear.CpuLinear`). So when the caller holds no other reference, the
    resident weights are one copy: the engine's tensors (which store the LM head even when
    it is tied to the embeddings) and nothing more. Cost: one pass over the weights.
    """

    def __init__(
        self,
        config: LlamaConfig,
        state: dict[str, torch.Tensor],
        *,
        cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES,
        dense_projections: bool = False,
    ) -> None:
        """``cpu_weight_copies`` (CPU only): 1 holds each projection once; 2 keeps a second copy
        (:mod:`.cpu_linear`: with the C kernels, oneDNN's for many-row products; without, the
        row-major weight for the faster one- and two-row products).
        ``dense_projections``: :class:`DenseLinear` on the CPU too (one row-major copy), which
        the compiled forward needs (:mod:`.compiled`: oneDNN's packed weights cannot be traced)."""
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5  # as Hugging Face's LlamaAttention
        table = state.pop(HF_EMBEDDING).detach()
        on_cpu = table.device.type == "cpu"

        if cpu_weight_copies not in CPU_WEIGHT_COPIES:
            raise UserError(f"cpu_weight_copies must be 1 or 2, got {cpu_weight_copies!r}")

        def proj(weight: torch.Tensor, bias: torch.Tensor | None = None, *, shared: torch.Tensor | None = None) -> Projection:
            if not on_cpu or dense_projections:
                return DenseLinear(weight, bias)
            two = cpu_weight_copies == 2
            return CpuLinear(weight, bias, small_rows_weight=weight if two else shared, packed_copy=two)

        def take(name: str) -> torch.Tensor | None:
            t = state.pop(name, None)
            return None if t is None else t.detach()

        def linear(i: int, *weights: str) -> Projection:
            """Layer ``i``'s projection(s) named ``weights`` (``...weight``), fused when several,
            with their bias (present only if each part has one). Quantized parts (int8/uint8
            codes with their scales beside them) are fused row-wise into one :class:`QuantLinear`."""
            names = [hf_layer_name(i, w) for w in weights]
            parts = [take(n) for n in names]
            if parts[0].dtype in (torch.int8, torch.uint8):
                return QuantLinear.fuse([_quant_part(p, n.removesuffix("weight"), take) for p, n in zip(parts, names)])
            biases = [take(n.removesuffix("weight") + "bias") for n in names]
            bias = None if any(b is None for b in biases) else torch.cat(biases) if len(biases) > 1 else biases[0]
            return proj((torch.cat(parts) if len(parts) > 1 else parts[0]), bias)

        lm_head = take(HF_LM_HEAD)
        tied = lm_head is None or _same_tensor(lm_head, table)
        # --quantize_lm_head: the table is int8/int4 codes with their scales (one QuantLinear).
        # Tied, that one QuantLinear is both the embedding (rows dequantized on lookup) and the
        # LM head (kernels.linear_int8/int4): one set of tensors, no float table anywhere.
        self.embed_table: QuantLinear | None = None
        self.embed_weight: torch.Tensor | None = None
        if table.dtype in (torch.int8, torch.uint8):
            self.embed_table = _quant_part(table, HF_EMBEDDING.removesuffix("weight"), take)
            if tied:
                for part in ("per_channel_scale", "weights_scaling_factor", "zero"):
                    take(HF_LM_HEAD.removesuffix("weight") + part)  # the table's own tensors again
                self.lm_head = self.embed_table
            else:
                self.lm_head = _quant_part(lm_head, HF_LM_HEAD.removesuffix("weight"), take)
        else:
            self.embed_weight = table
            if tied:  # the product for few rows can stream the embedding table, resident anyway
                self.lm_head = proj(table, shared=table)
            elif lm_head.dtype in (torch.int8, torch.uint8):
                self.lm_head = _quant_part(lm_head, HF_LM_HEAD.removesuffix("weight"), take)
            else:
                self.lm_head = proj(lm_head)
        self.eps = float(config.rms_norm_eps)
        self.norm_shape = (config.hidden_size,)
        self.norm = _frozen(take(HF_FINAL_NORM))
        self.rotary = RotaryTable(config, self.norm.dtype, self.norm.device)
        self.act = ACT2FN[config.hidden_act]
        self.layers = nn.ModuleList()
        for i in range(config.num_hidden_layers):
            block = nn.Module()
            block.input_norm = _frozen(take(hf_layer_name(i, HF_INPUT_NORM)))
            block.post_norm = _frozen(take(hf_layer_name(i, HF_POST_NORM)))
            block.qkv = linear(i, HF_Q, HF_K, HF_V)
            block.o_proj = linear(i, HF_O)
            block.gate_up = linear(i, HF_GATE, HF_UP)
            block.down_proj = linear(i, HF_DOWN)
            self.layers.append(block)
        unused = sorted(k for k in state if not k.endswith("rotary_emb.inv_freq"))
        if unused:
            raise ValueError(f"weights not used by the paged Llama: {unused[:3]}")
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.intermediate = config.intermediate_size
        # CPU float32: the work around the products in C (:meth:`_step_ops_forward`)
        self.uses_step_ops = (on_cpu and not dense_projections and self.dtype == torch.float32
                              and step_ops.available() and self.rotary.tabled and config.hidden_act == "silu")
        # and every layer of a decoding step in one C call, where each projection runs a C kernel
        self.layer_records = self._layer_records() if self.uses_step_ops and step_ops.runs_layers() else None

    def _layer_records(self) -> torch.Tensor | None:
        """The layers' table for :func:`.kernels.step_ops.layers`, or ``None`` when a projection
        does not run a C kernel (a bias, no kernels)."""
        ops = [tuple(getattr(b, n).kernel_operands() for n in ("qkv", "o_proj", "gate_up", "down_proj"))
               for b in self.layers]
        if any(op is None for layer in ops for op in layer):
            return None
        return step_ops.layer_records(ops, [(b.input_norm, b.post_norm) for b in self.layers])

    def _apply(self, fn, *args, **kwargs):  # noqa: ANN001, ANN202  (nn.Module.to and friends)
        self.layer_records = None  # it holds the addresses of the tensors being replaced
        return super()._apply(fn, *args, **kwargs)

    @classmethod
    def from_hf(
        cls, model: LlamaForCausalLM, *, cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES, dense_projections: bool = False
    ) -> "PagedLlama":
        """The paged model over ``model``'s weights; ``model`` is left as it was (the fused
        and reordered matrices are new tensors, so its memory is not shared)."""
        return cls(model.config, {k: v.detach() for k, v in model.state_dict().items()},
                   cpu_weight_copies=cpu_weight_copies, dense_projections=dense_projections)

    def resident_weight_bytes(self) -> int:
        """Bytes of weights this model keeps alive, each storage counted once."""
        seen: set[int] = set()
        total = 0

        def add(t: torch.Tensor | None) -> None:
            nonlocal total
            if t is not None and not t.is_mkldnn and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()

        add(self.embed_weight)
        for p in self.parameters():
            add(p)
        projections = [self.lm_head] + [getattr(b, n) for b in self.layers for n in ("qkv", "o_proj", "gate_up", "down_proj")]
        if self.embed_table is not None and self.embed_table is not self.lm_head:
            projections.append(self.embed_table)  # untied: the table's own codes
        for pr in projections:
            if isinstance(pr, QuantLinear):
                total += pr.resident_bytes()
            elif isinstance(pr, CpuLinear):
                total += pr.resident_bytes()
                add(pr.small_rows_weight)  # the embedding table (counted already) or a second copy
            else:
                add(pr.weight)
                add(pr.bias)
        return total

    @property
    def device(self) -> torch.device:
        return self.norm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.dtype

    @property
    def tied_table(self) -> bool:
        """Whether the embedding lookup and the LM head read one quantized table."""
        return self.embed_table is not None and self.embed_table is self.lm_head

    @torch.inference_mode()
    def forward(self, layout: BatchLayout, pool: KVPool) -> torch.Tensor:
        """Write the batch's K/V into ``pool`` and return logits ``[len(logit_rows), vocab]``."""
        return self.paged_forward(layout, pool)

    def paged_forward(self, layout: BatchLayout, pool: KVPool) -> torch.Tensor:
        """:meth:`forward` without its ``inference_mode``; :mod:`.compiled` runs the same parts
        (:meth:`embed`, :meth:`decoder_layer` compiled, :meth:`logits`) under ``no_grad``, as
        dynamo cannot trace into ``inference_mode``."""
        if self.uses_step_ops and layout.block_mask is None:
            return self._step_ops_forward(layout, pool)
        h, cos, sin = self.embed(layout)
        write = layout.write_slots.reshape(-1)
        for i, layer in enumerate(self.layers):
            h = self.decoder_layer(layer, h, cos, sin, write, layout, pool.k[i], pool.v[i])
        return self.logits(h, layout)

    def _step_ops_forward(self, layout: BatchLayout, pool: KVPool) -> torch.Tensor:
        """:meth:`paged_forward` on the CPU in float32 with the work around the products in C
        (:mod:`.kernels.step_ops`). A step of at most ``GEMV_MAX_ROWS`` rows whose projections all
        run C kernels is one call for every layer (:func:`.kernels.step_ops.layers`); otherwise
        (prefill, a bias) the same operators are called one by one from Python, with PyTorch's
        SDPA for attention beyond ``MAX_ATTENTION_ROWS`` rows a sequence. Every row is computed
        alone and an attention row from the ordered keys it sees, so a row of a verification
        step (chain or tree) equals the same row of a plain decoding step bitwise. The one call
        skips a batch's padding rows (``layout.real_rows``)."""
        B, Q = layout.input_ids.shape
        H, D, rows = self.num_heads, self.head_dim, B * Q
        ids = layout.input_ids.reshape(-1)
        positions, write = layout.positions.reshape(-1), layout.write_slots.reshape(-1)
        mask = None if layout.mask is None else layout.mask.view(B, Q, layout.kv_len)
        real, logit_rows = layout.real_rows, layout.logit_rows
        one_call = self.layer_records is not None and Q <= step_ops.MAX_ATTENTION_ROWS and \
            (rows if real is None else real.numel()) <= GEMV_MAX_ROWS
        if one_call and real is not None:
            ids, positions, write = ids.index_select(0, real), positions.index_select(0, real), write.index_select(0, real)
            logit_rows = layout.real_logit_rows
        h = self.embed_table.rows(ids) if self.embed_table is not None else F.embedding(ids, self.embed_weight)
        if one_call:
            step_ops.layers(h, self.layer_records, pool.k, pool.v, self.rotary.cos, self.rotary.sin, positions, write,
                            heads=H, intermediate=self.intermediate, eps=self.eps, scale=self.scaling, batch=B,
                            kv_len=layout.kv_len, read_slots=layout.read_slots, start=layout.contiguous_start,
                            mask=mask, row_at=real, per_seq=Q)
        else:
            x = step_ops.rms_norm(h, self.layers[0].input_norm, self.eps)
            last = len(self.layers) - 1
            for i, layer in enumerate(self.layers):
                pk, pv = pool.k[i], pool.v[i]
                q = step_ops.rotary_write(layer.qkv(x), self.rotary.cos, self.rotary.sin, positions, write, pk, pv, H)
                if Q <= step_ops.MAX_ATTENTION_ROWS:
                    o = step_ops.attention(q, pk, pv, B, layout.kv_len, self.scaling, layout.read_slots,
                                           layout.contiguous_start, mask)
                else:
                    o = self._attend(q.view(B, Q, H, D).transpose(1, 2), pk, pv, layout).transpose(1, 2).reshape(
                        rows, H * D)
                x = step_ops.rms_norm(h, layer.post_norm, self.eps, delta=layer.o_proj(o))
                y = layer.down_proj(step_ops.silu_mul(layer.gate_up(x)))
                if i < last:
                    x = step_ops.rms_norm(h, self.layers[i + 1].input_norm, self.eps, delta=y)
                else:
                    h.add_(y)
        return self.lm_head(step_ops.rms_norm(h.index_select(0, logit_rows), self.norm, self.eps))

    def embed(self, layout: BatchLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's input rows ``[B*Q, hidden]`` and their rotary ``cos``, ``sin_signed``
        ``[B*Q, 1, head_dim]`` (:meth:`.rotary.RotaryTable.lookup`)."""
        ids = layout.input_ids.reshape(-1)
        if self.embed_table is not None:
            h = self.embed_table.rows(ids).to(self.dtype)
        else:
            h = F.embedding(ids, self.embed_weight)
        cos, sin = self.rotary.lookup(layout.positions.reshape(-1))
        return h, cos, sin

    def decoder_layer(
        self,
        layer: nn.Module,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: torch.Tensor,
        layout: BatchLayout,
        pool_k: torch.Tensor,
        pool_v: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder layer over rows ``h`` ``[B*Q, hidden]``: writes the rows' K/V into the
        layer's pool at ``write`` and returns the new rows. Every layer runs this same code
        on tensors of the same shapes, so :mod:`.compiled` compiles it once for all layers.

        Layout: the fused QKV product gives ``[rows, (H + 2 KVH) * D]``; Q and K are one
        ``[rows, H + KVH, D]`` view, rotated together into one new tensor; V stays a view of
        the product. K/V reach the pool as ``[KVH, rows, D]`` views (``index_copy_`` reads
        strided sources), so nothing is copied to make them contiguous."""
        B, Q = layout.input_ids.shape
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        rows = B * Q
        qkv = layer.qkv(torch.rms_norm(h, self.norm_shape, layer.input_norm, self.eps))
        if layout.block_mask is None:  # Q and K rotated in one pass
            qk = apply_rotary(qkv[:, : self.q_size + self.kv_size].view(rows, H + KVH, D), cos, sin)
            q, k = qk[:, :H].view(B, Q, H, D).transpose(1, 2), qk[:, H:]
        else:  # attention in place (compiled): inductor's flex template wants Q as a [B, H, Q, D] buffer of its own
            q = apply_rotary(qkv[:, : self.q_size].view(B, Q, H, D).transpose(1, 2),
                             cos.view(B, Q, 1, D).transpose(1, 2), sin.view(B, Q, 1, D).transpose(1, 2))
            k = apply_rotary(qkv[:, self.q_size : self.q_size + self.kv_size].view(rows, KVH, D), cos, sin)
        v = qkv[:, self.q_size + self.kv_size :].view(rows, KVH, D)
        pool_k.index_copy_(1, write, k.transpose(0, 1).to(pool_k.dtype))  # rounded where the cache's type is narrower
        pool_v.index_copy_(1, write, v.transpose(0, 1).to(pool_v.dtype))
        o = self._attend(q, pool_k, pool_v, layout)
        h = h + layer.o_proj(o.transpose(1, 2).reshape(rows, H * D))
        gate, up = layer.gate_up(torch.rms_norm(h, self.norm_shape, layer.post_norm, self.eps)).split(
            self.intermediate, dim=-1)
        return h + layer.down_proj(self.act(gate).mul_(up))

    def logits(self, h: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        """fp32 logits of the rows ``layout.logit_rows`` of the final hidden rows ``h``."""
        x = h.index_select(0, layout.logit_rows)
        return self.lm_head(torch.rms_norm(x, self.norm_shape, self.norm, self.eps)).float()

    def _attend(self, q: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        """Attention of ``q`` ``[B, H, Q, D]`` over one layer's pool ``pk``/``pv`` ``[KVH, S, D]``:
        in place through ``layout.block_mask``, or over the ``kv_len`` slots read from it."""
        if layout.block_mask is not None:
            return pool_attention(q, pk, pv, layout.block_mask, self.scaling)
        B, KVH, D = q.shape[0], self.num_kv_heads, self.head_dim
        if layout.read_slots is None:
            s = layout.contiguous_start
            keys = pk[:, s : s + layout.kv_len].unsqueeze(0)
            values = pv[:, s : s + layout.kv_len].unsqueeze(0)
        else:
            flat = layout.read_slots.reshape(-1)
            keys = pk.index_select(1, flat).view(KVH, B, layout.kv_len, D).transpose(0, 1)
            values = pv.index_select(1, flat).view(KVH, B, layout.kv_len, D).transpose(0, 1)
        return F.scaled_dot_product_attention(  # K/V widened (or narrowed) to q's type where the cache's differs
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=layout.mask, scale=self.scaling,
            enable_gqa=KVH != self.num_heads
        )


def _quant_part(qweight: torch.Tensor, base: str, take: Callable[[str], torch.Tensor | None]) -> QuantLinear:
    """One quantized projection from its codes and the parts stored beside them (names as
    :func:`promptlookup.checkpoint.load.merge_ranks` gives them, ``base`` = the name before
    ``weight``): int8 or int4 with ``per_channel_scale`` (int4 symmetric: one group of the
    whole row, offset ``-8 * scale``), or int8/int4 with ``weights_scaling_factor`` and ``zero``."""
    bias = take(base + "bias")
    per_channel = take(base + "per_channel_scale")
    if qweight.dtype == torch.int8 and per_channel is not None:
        return QuantLinear(qweight, per_channel, bias=bias)
    width = qweight.shape[1] * (1 if qweight.dtype == torch.int8 else 2)
    if per_channel is not None:
        scale = per_channel.float().view(-1, 1)
        return QuantLinear(qweight, scale, -8.0 * scale, width, bias)
    scale, offset = take(base + "weights_scaling_factor"), take(base + "zero")
    if scale is None or offset is None:
        raise ValueError(f"quantized weight {base}weight has no scales beside it")
    return QuantLinear(qweight, scale, offset, width // scale.shape[1], bias)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.data_ptr() == b.data_ptr() and a.stride() == b.stride()


def _frozen(weight: torch.Tensor) -> nn.Parameter:
    """``weight`` adopted as a frozen parameter, without a copy (an RMSNorm's scale)."""
    return nn.Parameter(weight, requires_grad=False)
