"""Rotary position embedding from a table computed once, applied in one pass over Q and K.

Values: the table holds exactly what Hugging Face's ``LlamaRotaryEmbedding`` returns for
positions ``0 .. max_position_embeddings - 1`` (it is computed by that module, once), so a
step only indexes it. Rope types whose frequencies depend on the sequence length
(``dynamic``, ``longrope``) cannot be tabled; for them :meth:`RotaryTable.lookup` calls the
module every step, as before.

Arithmetic: Hugging Face's ``apply_rotary_pos_emb`` computes, for each head's vector
``x = [x1, x2]`` (two halves), ``x * cos + [-x2, x1] * sin``. Here the sign is folded into
the table (``sin_signed = [-sin_lo, sin_hi]``) and the halves are swapped by one ``flip``:
``x * cos + [x2, x1] * sin_signed``. Negation is exact in IEEE arithmetic
(``(-a) * b == a * (-b)``), so every element is bitwise what Hugging Face computes, and
every row is computed alone (no reduction), so a row's result does not depend on how many
rows share the step.

Invariant: ``lookup`` returns ``cos``, ``sin_signed`` of shape ``[rows, 1, head_dim]`` in the
model's dtype, ready to broadcast over the heads of ``[rows, heads, head_dim]`` rows.
Cost per step: one ``index_select`` per table; applying it: a flip, two products and a sum
over the Q and K heads together. Memory: ``2 * max_position_embeddings * head_dim`` values.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

UNTABLED_ROPE_TYPES = ("dynamic", "longrope")  # frequencies change with the sequence length


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def sign_folded(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated: the factor of the half-swapped vector."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


class RotaryTable(nn.Module):
    """Cos/sin for every position, built once from Hugging Face's rotary module."""

    def __init__(self, config, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.module = LlamaRotaryEmbedding(config).to(device)
        self.dtype = dtype
        self.tabled = _rope_type(config) not in UNTABLED_ROPE_TYPES
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        if self.tabled:
            positions = torch.arange(config.max_position_embeddings, device=device).unsqueeze(0)
            cos, sin = self.module(torch.empty(0, dtype=dtype, device=device), positions)
            self.cos, self.sin = cos[0].contiguous(), sign_folded(sin[0]).contiguous()

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin_signed`` ``[rows, 1, head_dim]`` for the flat ``positions`` ``[rows]``."""
        if self.cos is not None and self.sin is not None:
            return self.cos.index_select(0, positions).unsqueeze(1), self.sin.index_select(0, positions).unsqueeze(1)
        cos, sin = self.module(torch.empty(0, dtype=self.dtype, device=positions.device), positions.unsqueeze(0))
        return cos[0].unsqueeze(1), sign_folded(sin[0]).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """The rotated copy of ``x`` ``[..., head_dim]`` (any strides; ``cos``, ``sin_signed``
    broadcast to it): bitwise Hugging Face's ``x * cos + rotate_half(x) * sin``."""
    dim = x.shape[-1]
    swapped = x.unflatten(-1, (2, dim // 2)).flip(-2).flatten(-2)
    return (x * cos).add_(swapped.mul_(sin_signed))
