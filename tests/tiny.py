"""Tiny random Llama models for unit tests (2 layers, hidden 64, GQA)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama_config(vocab_size: int = 512, tie_word_embeddings: bool = False, **overrides) -> LlamaConfig:
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A deterministic random tiny Llama in fp32, eval mode."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides))
    # Default init gives near-uniform logits; widen them so argmax is stable and text varies.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    return model.eval()


def zeroed_pool(runner):
    """Zero ``runner``'s KV pool before any use, as a compiled runner's is
    (``KVPool(zeroed=True)``): attention that reads whole blocks in place needs finite
    values in the slots it masks. Returns the runner."""
    for t in (*runner.pool.k, *runner.pool.v):
        t.zero_()
    return runner
