"""A Llama forward pass over a paged KV cache, using Hugging Face's Llama modules.

The weights, RMSNorm, MLP activation and rotary embedding come from a
``transformers.LlamaForCausalLM``; this module supplies only the attention plumbing that
the paged cache needs (gpt-fast style): Q/K/V and gate/up projections are fused into one
matmul each, new K/V are scattered into their cache slots, and attention runs through
``scaled_dot_product_attention`` with native grouped-query attention (no K/V copies per
head).

One call processes a batch of sequences, each contributing ``q_len[b]`` new tokens
(padded to ``Q``). For sequence ``b`` the new tokens fill slots ``ctx[b] - q_len[b] ..
ctx[b] - 1`` of its block table and attend to the slots before them and, among
themselves, causally (a chain) or along a token tree (:class:`SequenceRows`). Cost per call: the model's FLOPs for ``sum(q_len)`` tokens, plus a gather
of ``max(ctx)`` K/V rows per layer (skipped when a single sequence's blocks are contiguous).
On CPU the projections run through :class:`~.cpu_linear.CpuLinear`, which picks the faster
GEMM kernel for the step's row count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .cpu_linear import CpuLinear
from .kv_cache import SCRATCH_BLOCK, KVPool

Projection = Callable[[torch.Tensor], torch.Tensor]  # nn.Linear, or CpuLinear on CPU


@dataclass
class BatchLayout:
    """Where a batch's new tokens go and what they attend to (all tensors on the model's device).

    ``input_ids``, ``positions``, ``write_slots``: ``[B, Q]`` (padding: token 0, position 0,
    the scratch slot). ``read_slots``: ``[B, K]`` slot of each attended position, or
    ``None`` when ``contiguous_start`` gives a single contiguous run of ``K`` slots (B == 1).
    ``mask``: ``[B, 1, Q, K]`` boolean (True = attend) or ``None`` for a single query.
    ``logit_rows``: flat indices into ``B * Q`` of the rows whose logits are wanted.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    read_slots: torch.Tensor | None
    contiguous_start: int
    kv_len: int
    mask: torch.Tensor | None
    logit_rows: torch.Tensor


Parents = Sequence[int] | None  # a step's row tree; None: a chain (each row's parent is the row before)


@dataclass
class SequenceRows:
    """The rows one sequence feeds into a step, as a tree over the rows.

    Row ``r`` sits in the sequence's logical slot ``base + r`` (``base = ctx - q``), where
    its K/V are written. ``parents[r]`` is the row it follows (``-1``: the cached context
    before the first row). A row's position is ``base + depth(r)``, with ``depth = 0`` for
    a row whose parent is ``-1``; it attends to every cached slot ``< base``, to its
    ancestor rows and to itself, and to nothing else. A chain (``parents = [-1, 0, 1, ...]``,
    the default) is ordinary causal attention; a token tree (drafts branching from the
    sequence's last token) uses the same rule, so both are one code path.

    Invariant: ``parents[r] < r``. Cost: O(q^2) booleans for the visibility matrix.
    """

    positions: torch.Tensor  # [q] int64
    write_slots: torch.Tensor  # [q] int64 physical slots
    visible: torch.Tensor | None  # [q, q] bool (row r sees row c), None for a chain


def sequence_rows(q: int, ctx: int, table: Sequence[int], parents: Parents, block_size: int) -> SequenceRows:
    """Positions, write slots and row visibility of one sequence's ``q`` rows ending at ``ctx``."""
    base = ctx - q
    slots = torch.arange(base, ctx)
    blocks = torch.tensor(table, dtype=torch.long)
    write = blocks[slots // block_size] * block_size + slots % block_size
    if parents is None:
        return SequenceRows(slots, write, None)
    if len(parents) != q:
        raise ValueError(f"{len(parents)} parents for {q} rows")
    depth = [0] * q
    seen = [0] * q  # bitsets of visible rows
    for r, p in enumerate(parents):
        if not -1 <= p < r:
            raise ValueError(f"row {r} has parent {p}; parents must precede their children")
        depth[r] = depth[p] + 1 if p >= 0 else 0
        seen[r] = (seen[p] if p >= 0 else 0) | (1 << r)
    bits = torch.tensor([[(m >> c) & 1 for c in range(q)] for m in seen], dtype=torch.bool)
    return SequenceRows(base + torch.tensor(depth, dtype=torch.long), write, bits)


def build_layout(
    new_tokens: list[list[int]],
    contexts: list[int],
    block_tables: list[list[int]],
    logits_per_seq: list[int],
    block_size: int,
    device: torch.device,
    parents: Sequence[Parents] | None = None,
) -> BatchLayout:
    """Lay out a batch: sequence ``b`` feeds ``new_tokens[b]`` ending at context length ``contexts[b]``.

    ``logits_per_seq[b]`` trailing rows of sequence ``b`` get logits. ``parents[b]`` makes
    the rows a tree (see :class:`SequenceRows`); by default every sequence is a chain.
    """
    B = len(new_tokens)
    Q = max(len(t) for t in new_tokens)
    K = max(contexts)
    ids = torch.zeros(B, Q, dtype=torch.long)
    pos = torch.zeros(B, Q, dtype=torch.long)
    write = torch.full((B, Q), SCRATCH_BLOCK * block_size, dtype=torch.long)
    rows: list[int] = []
    layouts = []
    for b, (toks, ctx, table) in enumerate(zip(new_tokens, contexts, block_tables)):
        q = len(toks)
        sr = sequence_rows(q, ctx, table, parents[b] if parents is not None else None, block_size)
        layouts.append(sr)
        ids[b, :q] = torch.tensor(toks, dtype=torch.long)
        pos[b, :q] = sr.positions
        write[b, :q] = sr.write_slots
        rows.extend(range(b * Q + q - logits_per_seq[b], b * Q + q))

    read = None
    contiguous_start = 0
    if B == 1 and all(y == x + 1 for x, y in zip(block_tables[0], block_tables[0][1:])):
        contiguous_start = block_tables[0][0] * block_size
    else:
        read = torch.full((B, K), SCRATCH_BLOCK * block_size, dtype=torch.long)
        for b, (ctx, table) in enumerate(zip(contexts, block_tables)):
            p = torch.arange(ctx)
            blocks = torch.tensor(table, dtype=torch.long)
            read[b, :ctx] = blocks[p // block_size] * block_size + p % block_size
        read = read.to(device)

    mask = None
    if Q > 1 or B > 1:
        key_pos = torch.arange(K)
        mask = torch.zeros(B, Q, K, dtype=torch.bool)
        for b, (toks, ctx, sr) in enumerate(zip(new_tokens, contexts, layouts)):
            q = len(toks)
            base = ctx - q
            mask[b] = key_pos.view(1, K) < base
            mask[b, :q, base:ctx] = sr.visible if sr.visible is not None else torch.ones(q, q, dtype=torch.bool).tril()
            mask[b, q:, 0] = True  # padded rows: one finite key, logits dropped
        mask = mask.unsqueeze(1).to(device)
    return BatchLayout(
        input_ids=ids.to(device),
        positions=pos.to(device),
        write_slots=write.to(device),
        read_slots=read,
        contiguous_start=contiguous_start,
        kv_len=K,
        mask=mask,
        logit_rows=torch.tensor(rows, dtype=torch.long, device=device),
    )


class PagedLlama(nn.Module):
    """Runs a Hugging Face ``LlamaForCausalLM``'s weights over a :class:`KVPool`."""

    def __init__(self, hf_model: LlamaForCausalLM) -> None:
        super().__init__()
        cfg = hf_model.config
        self.config = cfg
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        inner = hf_model.model
        self.embed_tokens = inner.embed_tokens
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm
        on_cpu = self.embed_tokens.weight.device.type == "cpu"

        def proj(layer: nn.Linear) -> Projection:
            return CpuLinear(layer) if on_cpu else layer

        self.lm_head = proj(hf_model.lm_head)
        self.layers = nn.ModuleList()
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            block = nn.Module()
            block.input_layernorm = layer.input_layernorm
            block.post_attention_layernorm = layer.post_attention_layernorm
            block.qkv = proj(_fused_linear(attn.q_proj, attn.k_proj, attn.v_proj))
            block.o_proj = proj(attn.o_proj)
            block.gate_up = proj(_fused_linear(mlp.gate_proj, mlp.up_proj))
            block.down_proj = proj(mlp.down_proj)
            block.act = mlp.act_fn
            block.scaling = attn.scaling
            self.layers.append(block)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.intermediate = inner.layers[0].mlp.gate_proj.out_features

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @torch.inference_mode()
    def forward(self, layout: BatchLayout, pool: KVPool) -> torch.Tensor:
        """Write the batch's K/V into ``pool`` and return logits ``[len(logit_rows), vocab]``."""
        B, Q = layout.input_ids.shape
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        h = self.embed_tokens(layout.input_ids.reshape(-1))  # [B*Q, hidden]
        cos, sin = self.rotary_emb(h, layout.positions)
        write = layout.write_slots.reshape(-1)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(layer.input_layernorm(h))
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.reshape(B, Q, H, D).transpose(1, 2)
            k = k.reshape(B, Q, KVH, D).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            v = v.reshape(B, Q, KVH, D)
            pk, pv = pool.k[i], pool.v[i]
            # [B, KVH, Q, D] -> [KVH, B*Q, D] rows in write-slot order.
            pk.index_copy_(1, write, k.permute(1, 0, 2, 3).reshape(KVH, B * Q, D))
            pv.index_copy_(1, write, v.permute(2, 0, 1, 3).reshape(KVH, B * Q, D))
            if layout.read_slots is None:
                s = layout.contiguous_start
                keys = pk[:, s : s + layout.kv_len].unsqueeze(0)
                values = pv[:, s : s + layout.kv_len].unsqueeze(0)
            else:
                flat = layout.read_slots.reshape(-1)
                keys = pk.index_select(1, flat).view(KVH, B, layout.kv_len, D).transpose(0, 1)
                values = pv.index_select(1, flat).view(KVH, B, layout.kv_len, D).transpose(0, 1)
            o = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=layout.mask, scale=layer.scaling, enable_gqa=KVH != H
            )
            h = h + layer.o_proj(o.transpose(1, 2).reshape(B * Q, H * D))
            gate, up = layer.gate_up(layer.post_attention_layernorm(h)).split(self.intermediate, dim=-1)
            h = h + layer.down_proj(layer.act(gate) * up)
        h = self.norm(h.index_select(0, layout.logit_rows))
        return self.lm_head(h).float()


def _fused_linear(*parts: nn.Linear) -> nn.Linear:
    """One ``nn.Linear`` whose output is the concatenation of ``parts``' outputs."""
    w = torch.cat([p.weight.detach() for p in parts], dim=0)
    has_bias = all(p.bias is not None for p in parts)
    fused = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        fused.weight.copy_(w)
        if has_bias:
            fused.bias.copy_(torch.cat([p.bias.detach() for p in parts]))
    fused.requires_grad_(False)
    return fused
