"""The rotary table and the one-pass rotation are bitwise Hugging Face's, and so is the norm."""
from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from promptlookup.runtime.rotary import RotaryTable, apply_rotary


def _config(**rope) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       **rope)


def test_table_rows_equal_the_module_and_rotation_equals_hf_bitwise():
    config = _config()
    table = RotaryTable(config, torch.float32, torch.device("cpu"))
    assert table.tabled
    positions = torch.tensor([[0, 3, 7, 100, 255]])
    x = torch.randn(1, 5, 16)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions)
    q = torch.randn(1, 4, 5, 16)  # [B, H, Q, D] as Hugging Face's attention holds it
    k = torch.randn(1, 2, 5, 16)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    tc, ts = table.lookup(positions.reshape(-1))  # [rows, 1, D]
    assert torch.equal(tc[:, 0], cos[0])
    both = torch.cat([q[0].transpose(0, 1), k[0].transpose(0, 1)], dim=1)  # [rows, H + KVH, D]
    got = apply_rotary(both, tc, ts)
    assert torch.equal(got[:, :4].transpose(0, 1), want_q[0])
    assert torch.equal(got[:, 4:].transpose(0, 1), want_k[0])
    # a row alone gets the same bits as among others
    assert torch.equal(apply_rotary(both[2:3], tc[2:3], ts[2:3]), got[2:3])


def test_length_dependent_rope_is_computed_per_step():
    config = _config(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    table = RotaryTable(config, torch.float32, torch.device("cpu"))
    assert not table.tabled and table.cos is None
    cos, sin = table.lookup(torch.tensor([0, 1, 2]))
    assert cos.shape == sin.shape == (3, 1, 16)


def test_fused_rms_norm_is_hf_bitwise_for_any_row_count():
    torch.manual_seed(0)
    norm = LlamaRMSNorm(96, eps=1e-5)
    norm.weight.data = torch.randn(96)
    x = torch.randn(11, 96) * 7
    with torch.inference_mode():
        fused = torch.rms_norm(x, (96,), norm.weight, 1e-5)
        assert torch.equal(fused, norm(x))
        assert torch.equal(torch.rms_norm(x[4:5], (96,), norm.weight, 1e-5), fused[4:5])
