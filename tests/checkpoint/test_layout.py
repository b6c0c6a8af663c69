"""The TensorRT-LLM layout: mapping arithmetic, validation, and split/merge as exact inverses."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from promptlookup.checkpoint import layout as L
from promptlookup.checkpoint import sharding as S
from promptlookup.errors import UserError


def make_layout(heads=4, kv=2, head_size=4, inter=8, vocab=13, layers=3, tp=1, pp=1) -> L.Layout:
    layout = L.Layout(num_layers=layers, num_heads=heads, num_kv_heads=kv, head_size=head_size,
                      hidden_size=heads * head_size, intermediate_size=inter, vocab_size=vocab,
                      tp_size=tp, pp_size=pp)
    layout.validate()
    return layout


@pytest.mark.parametrize("num_layers", range(1, 10))
def test_pp_layers_split_like_tensor_split(num_layers):
    for pp in range(1, num_layers + 1):
        layout = make_layout(layers=num_layers, pp=pp)
        stages = [list(layout.pp_layers(p)) for p in range(pp)]
        expected = [t.tolist() for t in torch.tensor_split(torch.arange(num_layers), pp)]
        assert stages == expected
        assert sum(stages, []) == list(range(num_layers))


def test_rank_numbering_follows_tensorrt_llm_mapping():
    layout = make_layout(tp=2, pp=3, layers=3)
    assert layout.world_size == 6
    assert [layout.coords(r) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert all(layout.rank(*layout.coords(r)) == r for r in range(6))


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads=4, kv=2, tp=3), "does not divide the model's 4 attention heads"),
    (dict(heads=12, kv=4, tp=6), "must divide one another"),
    (dict(inter=6, tp=4), "does not divide the MLP intermediate size"),
    (dict(layers=2, pp=3), "larger than the model's 2 layers"),
    (dict(tp=0), "must be at least 1"),
])
def test_impossible_splits_are_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        make_layout(**kwargs)


def test_from_hf_config_reads_raw_json_and_rejects_incomplete():
    raw = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
           "intermediate_size": 128, "vocab_size": 512}
    layout = L.Layout.from_hf_config(raw, tp_size=2)
    assert (layout.head_size, layout.tp_size, layout.kv_repeats) == (16, 2, 1)
    with pytest.raises(UserError, match="lacks integer vocab_size"):
        L.Layout.from_hf_config({k: v for k, v in raw.items() if k != "vocab_size"})


def _rows(w: torch.Tensor, head: int, head_size: int) -> torch.Tensor:
    return w[head * head_size:(head + 1) * head_size]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qkv_rank_holds_its_query_heads_then_its_kv_head(tp):
    layout = make_layout(heads=4, kv=2, head_size=3, tp=tp)
    q, k, v = torch.randn(12, 5), torch.randn(6, 5), torch.randn(6, 5)
    parts = S.shard_qkv(q, k, v, layout)
    q_per_rank = 4 // tp
    kv_heads_of = {1: [[0, 1]], 2: [[0], [1]], 4: [[0], [0], [1], [1]]}[tp]  # duplicated when tp > kv
    for r, part in enumerate(parts):
        expected = torch.cat([_rows(q, h, 3) for h in range(r * q_per_rank, (r + 1) * q_per_rank)]
                             + [_rows(k, h, 3) for h in kv_heads_of[r]]
                             + [_rows(v, h, 3) for h in kv_heads_of[r]])
        assert torch.equal(part, expected)


def test_lm_head_is_zero_padded_to_a_multiple_of_tp():
    layout = make_layout(vocab=13, tp=4)
    w = torch.randn(13, 16)
    parts = S.shard_lm_head(w, layout)
    assert [p.shape[0] for p in parts] == [4, 4, 4, 4]
    assert torch.equal(torch.cat(parts)[:13], w)
    assert torch.count_nonzero(torch.cat(parts)[13:]) == 0
    assert torch.equal(S.unshard_lm_head(parts, layout), w)


@st.composite
def geometries(draw):
    kv = draw(st.sampled_from([1, 2, 3, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 3]))
    tp = draw(st.sampled_from([t for t in (1, 2, 3, 4, 6, 8)
                               if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    return make_layout(heads=heads, kv=kv, head_size=draw(st.sampled_from([1, 2, 4])),
                       inter=tp * draw(st.integers(1, 3)), vocab=draw(st.integers(1, 20)), tp=tp)


@settings(max_examples=60, deadline=None)
@given(layout=geometries(), seed=st.integers(0, 2**16))
def test_unshard_inverts_shard_exactly(layout, seed):
    g = torch.Generator().manual_seed(seed)
    h, kvd, i = layout.hidden_size, layout.num_kv_heads * layout.head_size, layout.intermediate_size
    hf = {L.HF_Q: torch.randn(h, h, generator=g), L.HF_K: torch.randn(kvd, h, generator=g),
          L.HF_V: torch.randn(kvd, h, generator=g), L.HF_O: torch.randn(h, h, generator=g),
          L.HF_GATE: torch.randn(i, h, generator=g), L.HF_UP: torch.randn(i, h, generator=g),
          L.HF_DOWN: torch.randn(h, i, generator=g), L.HF_INPUT_NORM: torch.randn(h, generator=g),
          L.HF_POST_NORM: torch.randn(h, generator=g)}
    ranks = S.shard_layer(hf, layout)
    assert len(ranks) == layout.tp_size
    shapes = L.expected_shapes(layout, tp_rank=0, pp_rank=0)
    for rank in ranks:
        assert {f"transformer.layers.0.{k}": tuple(t.shape) for k, t in rank.items()} == \
            {k: s for k, s in shapes.items() if k.startswith("transformer.layers.0.")}
    merged = S.unshard_layer(ranks, layout)
    assert merged.keys() == hf.keys()
    assert all(torch.equal(merged[k], hf[k]) for k in hf)
    head = torch.randn(layout.vocab_size, h, generator=g)
    assert torch.equal(S.unshard_lm_head(S.shard_lm_head(head, layout), layout), head)
