"""Weight-only int8/int4: the grids' error bound, the checkpoint layout TensorRT-LLM names,
tensor-parallel shards that merge back exactly, and GGUF's 4-bit blocks taken over exactly."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from promptlookup.checkpoint import layout as L
from promptlookup.checkpoint.convert import convert_model
from promptlookup.checkpoint.gguf_blocks import (blocks_to_int4, blocks_to_int8, dequantize_rows, float_state_from_gguf,
                                                prequantized_from_gguf, raw_rows, unpermute_rows)
from promptlookup.checkpoint.gguf_header import read_gguf_tensors
from promptlookup.checkpoint.load import load_checkpoint, load_checkpoint_state
from promptlookup.checkpoint.quant_spec import QuantSpec, check_spec
from promptlookup.checkpoint.quantize import (
    dequantize,
    pack_int4,
    quantize_int4_channel,
    quantize_int4_groups,
    quantize_int8,
    quantize_int8_groups,
    quantize_weight,
    unpack_int4,
)
from promptlookup.errors import UserError
from promptlookup.runtime import kernels
from promptlookup.runtime.quant_linear import QuantLinear
from tests.quantized import product_atol
from tests.tiny import tiny_llama

SPECS = {"int8": QuantSpec("int8"), "int4": QuantSpec("int4"), "int4_g16": QuantSpec("int4", 16),
         "int4_g32": QuantSpec("int4", 32), "int8_g32": QuantSpec("int8", 32)}
ALGOS = {"int8": "W8A16", "int4": "W4A16", "int4_g16": "W4A16_GPTQ", "int4_g32": "W4A16_GPTQ",
         "int8_g32": "W8A16_GPTQ"}


def _weight(seed: int, rows: int = 24, cols: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g)
    w[0] = 0.0  # an all-zero row and group must not divide by zero
    w[1, :32] = 0.37  # a constant group
    return w


def _bound(err: torch.Tensor, step: torch.Tensor) -> None:
    assert bool((err <= step * (0.5 + 1e-5) + 1e-7).all()), float((err - step / 2).max())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_per_channel_is_within_half_a_step(seed):
    w = _weight(seed)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],)
    _bound((w - q.float() * scale[:, None]).abs(), scale[:, None].expand_as(w))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int4_per_channel_is_within_half_a_step(seed):
    w = _weight(seed)
    packed, scale = quantize_int4_channel(w)
    codes = unpack_int4(packed).float()
    assert packed.shape == (w.shape[0], w.shape[1] // 2) and int(codes.max()) <= 15
    _bound((w - (codes - 8) * scale[:, None]).abs(), scale[:, None].expand_as(w))


@pytest.mark.parametrize("group", [2, 16, 32, 64])
@pytest.mark.parametrize("seed", [0, 1])
def test_int4_per_group_is_within_half_a_step_of_its_group(seed, group):
    w = _weight(seed)
    packed, scale, offset = quantize_int4_groups(w, group)
    deq = kernels.dequantize_int4(packed, scale, offset, group)
    _bound((w - deq).abs(), scale.repeat_interleave(group, dim=1))


@pytest.mark.parametrize("group", [2, 16, 32, 64])
@pytest.mark.parametrize("seed", [0, 1])
def test_int8_per_group_is_within_half_a_step_of_its_group(seed, group):
    w = _weight(seed)
    codes, scale, offset = quantize_int8_groups(w, group)
    assert codes.dtype == torch.int8 and scale.shape == offset.shape == (w.shape[0], w.shape[1] // group)
    deq = kernels.dequantize_int8_groups(codes, scale, offset, group)
    _bound((w - deq).abs(), scale.repeat_interleave(group, dim=1))
    # the grid spans each group: its minimum and maximum are (within rounding) the end codes
    lo = w.view(w.shape[0], -1, group).amin(-1)
    torch.testing.assert_close(offset - 128 * scale, lo, rtol=1e-5, atol=1e-6)
    assert group > 32 or bool((deq[1, :32] == w[1, :32]).all())  # a constant group is exact


def test_pack_int4_matches_the_contract_nibbles():
    codes = torch.randint(0, 16, (5, 12), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert torch.equal(packed[:, 0] & 0xF, codes[:, 0]) and torch.equal(packed[:, 0] >> 4, codes[:, 1])
    assert torch.equal(unpack_int4(packed), codes)


@pytest.mark.parametrize("name", list(SPECS))
def test_dequantize_equals_the_kernels_products(name):
    spec = SPECS[name]
    w = _weight(4)
    stored = quantize_weight(spec, w)
    deq = dequantize(spec, stored)
    x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(5))
    if spec.precision == "int8" and spec.group_size is None:
        layer = QuantLinear(stored["weight"], stored["per_channel_scale"])
    elif spec.group_size is None:
        s = stored["per_channel_scale"].view(-1, 1)
        layer = QuantLinear(stored["weight"], s, -8 * s, w.shape[1])
    else:
        layer = QuantLinear(stored["weight"], stored["weights_scaling_factor"], stored["zero"], spec.group_size)
    assert torch.equal(layer.dequantize(), deq)
    expected = (x.double() @ deq.double().T).float()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=product_atol(expected, w.shape[1]))
    # row invariance: a row's result does not depend on the rows beside it
    assert torch.equal(layer(x)[1:2], layer(x[1:2]))


def test_fused_layer_is_the_parts_stacked():
    spec = SPECS["int4_g16"]
    parts = []
    for seed in (5, 6, 7):
        st = quantize_weight(spec, _weight(seed, rows=8 + seed))
        parts.append(QuantLinear(st["weight"], st["weights_scaling_factor"], st["zero"], 16))
    fused = QuantLinear.fuse(parts)
    x = torch.randn(4, 64)
    torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=1))
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("tp", [1, 2])
def test_checkpoint_layout_and_tp_shards_merge_back(tmp_path, name, tp):
    spec = SPECS[name]
    model = tiny_llama(seed=3)
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float16", quant=spec, tp_size=tp)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["quant_algo"] == ALGOS[name]
    assert cfg["quantization"]["has_zero_point"] == (spec.group_size is not None)
    if spec.group_size is not None:
        assert cfg["quantization"]["group_size"] == spec.group_size
    rank0 = load_file(str(out / "rank0.safetensors"))
    qkv = "transformer.layers.0.attention.qkv."
    assert rank0[qkv + "weight"].dtype == (torch.int8 if spec.precision == "int8" else torch.uint8)
    assert set(spec.tensor_suffixes()) == {k.removeprefix(qkv) for k in rank0 if k.startswith(qkv)} - {"weight"}
    assert rank0[L.EMBEDDING].dtype == torch.float16  # not quantized (TensorRT-LLM's default)
    assert rank0[L.LM_HEAD if tp == 1 else L.LM_HEAD].dtype == torch.float16
    # merged back and dequantized: every weight within half a step of the original
    merged = load_checkpoint(out).state_dict()
    single = quantize_weight  # the same grid the whole (unsplit) weight gets
    for key, w in model.state_dict().items():
        if key.endswith("_proj.weight"):
            want = dequantize(spec, single(spec, w))
            torch.testing.assert_close(merged[key], want, rtol=0, atol=1e-6)
        else:
            torch.testing.assert_close(merged[key], w.half().float())


def test_quantized_state_keeps_codes_and_float32_scales(tmp_path):
    out = convert_model(tiny_llama(seed=3), None, tmp_path / "c", dtype="bfloat16", quant=SPECS["int4_g32"])
    _, state = load_checkpoint_state(out, dtype="auto")
    base = L.hf_layer_name(0, L.HF_Q).removesuffix("weight")
    assert state[base + "weight"].dtype == torch.uint8
    assert state[base + "weights_scaling_factor"].dtype == torch.float32
    assert state[base + "zero"].dtype == torch.float32
    assert state[L.HF_EMBEDDING].dtype == torch.bfloat16


def test_group_checks_cover_every_input_width():
    layout = L.Layout(num_layers=1, num_heads=4, num_kv_heads=2, head_size=16, hidden_size=64,
                      intermediate_size=96, vocab_size=10)
    check_spec(QuantSpec("int4", 32), layout)
    with pytest.raises(UserError, match="intermediate size 96"):
        check_spec(QuantSpec("int4", 64), layout)
    with pytest.raises(UserError, match="--tp_size 2 cuts the int4 groups"):
        check_spec(QuantSpec("int4", 32), L.Layout(**{**layout.__dict__, "tp_size": 2}))


# --- GGUF blocks ------------------------------------------------------------------------

def _random_blocks(kind: str, rows: int, blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    halves = 2 if kind == "Q4_1" else 1
    scales = (rng.standard_normal((rows, blocks, halves)) * 0.05).astype(np.float16)
    raw[..., : 2 * halves] = scales.view(np.uint8).reshape(rows, blocks, 2 * halves)
    return raw.reshape(rows, blocks * size)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gguf_4bit_blocks_become_int4_groups_of_32_exactly(kind, seed):
    import gguf

    raw = _random_blocks(kind, rows=6, blocks=4, seed=seed)
    codes, scale, offset = blocks_to_int4(raw, kind)
    ours = kernels.dequantize_int4(pack_int4(codes), scale, offset, 32)
    theirs = torch.from_numpy(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).copy())
    assert torch.equal(ours, theirs.reshape(ours.shape))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("seed", [0, 1])
def test_gguf_blocks_become_int8_groups_of_32_exactly(kind, seed):
    import gguf

    raw = _random_blocks(kind, rows=6, blocks=4, seed=seed)
    codes, scale, offset = blocks_to_int8(raw, kind)
    assert codes.dtype == torch.int8 and codes.shape == (6, 128)
    ours = kernels.dequantize_int8_groups(codes, scale, offset, 32)
    theirs = torch.from_numpy(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).copy())
    assert torch.equal(ours, theirs.reshape(ours.shape))
    x = torch.randn(3, 128)  # and the kernels' product is that weight's
    torch.testing.assert_close(kernels.linear_int8_groups(x, codes, scale, offset, 32), x @ ours.T, rtol=1e-5, atol=1e-5)


def _gguf_with_blocks(path, tensors):
    """A GGUF file holding ``tensors`` (name -> (block kind, raw rows)); no metadata beyond the arch."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (kind, raw) in tensors.items():
        writer.add_tensor(name, raw, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("spec, taken", [
    (QuantSpec("int8", 32, lm_head=True), {"table", "up", "down"}),  # every block kind
    (QuantSpec("int8", 32), {"up", "down"}),  # the table stays float
    (QuantSpec("int4", 32, lm_head=True), {"up", "down"}),  # Q8_0 is not an int4 grid
    (QuantSpec("int8", 64), set()),  # another group size is no block's grid
])
def test_gguf_blocks_are_taken_over_where_the_grid_is_theirs(tmp_path, spec, taken):
    import gguf

    raws = {"table": ("Q8_0", _random_blocks("Q8_0", rows=16, blocks=2, seed=0)),
            "up": ("Q4_1", _random_blocks("Q4_1", rows=8, blocks=2, seed=1)),
            "down": ("Q4_0", _random_blocks("Q4_0", rows=8, blocks=2, seed=2))}
    names = {"table": ("token_embd.weight", L.HF_EMBEDDING), "up": ("blk.0.ffn_up.weight", L.hf_layer_name(0, L.HF_UP)),
             "down": ("blk.0.ffn_down.weight", L.hf_layer_name(0, L.HF_DOWN))}
    path = _gguf_with_blocks(tmp_path / "m.gguf", {names[k][0]: raws[k] for k in raws})
    config = type("Config", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()
    out, notes = prequantized_from_gguf(path, spec, config)
    assert set(out) == {names[k][1] for k in taken}
    for key in taken:
        kind, raw = raws[key]
        stored = out[names[key][1]]
        theirs = torch.from_numpy(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).copy())
        assert torch.equal(dequantize(spec, stored), theirs.reshape(theirs.shape[0], -1))
    assert len(notes) == (1 if taken else 0) + len({raws[k][0] for k in raws if k not in taken and
                                                    (k != "table" or spec.lm_head)})


def _random_rows(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Rows of ``kind`` as GGUF stores them (uint8 ``[rows, bytes]``), finite values throughout."""
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        return _random_blocks(kind, rows, cols // 32, seed)
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if kind == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return values.astype(np.float16 if kind == "F16" else np.float32).view(np.uint8)


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"])
def test_gguf_rows_dequantize_bitwise_as_gguf_does(kind):
    import gguf

    raw = _random_rows(kind, rows=5, cols=96, seed=7)
    ours = dequantize_rows(raw, kind)
    theirs = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind))
    assert ours.dtype == np.float32 and ours.shape == (5, 96)
    assert np.array_equal(ours, theirs.reshape(5, 96))


def test_gguf_tensor_records_locate_each_tensor_and_refuse_a_cut_file(tmp_path):
    import gguf

    tensors = {"blk.0.attn_norm.weight": ("F32", _random_rows("F32", 1, 64, 0).reshape(-1)),
               "blk.0.ffn_up.weight": ("Q4_1", _random_rows("Q4_1", 6, 64, 1)),
               "token_embd.weight": ("F16", _random_rows("F16", 10, 64, 2))}
    path = _gguf_with_blocks(tmp_path / "m.gguf", tensors)
    records = read_gguf_tensors(path)
    assert [(t.name, t.kind, t.shape) for t in records] == [
        ("blk.0.attn_norm.weight", "F32", (64,)), ("blk.0.ffn_up.weight", "Q4_1", (6, 64)),
        ("token_embd.weight", "F16", (10, 64))]
    theirs = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for t in records:
        want = gguf.quants.dequantize(np.asarray(theirs[t.name].data), theirs[t.name].tensor_type)
        assert np.array_equal(dequantize_rows(raw_rows(path, t), t.kind).reshape(t.shape), want.reshape(t.shape))
    config = type("Config", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()
    state = float_state_from_gguf(path, config)
    assert set(state) == {L.hf_layer_name(0, L.HF_INPUT_NORM), L.hf_layer_name(0, L.HF_UP), L.HF_EMBEDDING}
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError, match="corrupt or truncated at token_embd.weight"):
        float_state_from_gguf(cut, config)


@pytest.mark.parametrize("name, kind", [("rope_freqs.weight", "F32"), ("blk.0.ffn_up.weight", "Q5_0")])
def test_a_gguf_tensor_not_read_here_leaves_the_file_to_transformers(tmp_path, name, kind):
    import gguf

    raw = np.zeros((2, 22 * 2), dtype=np.uint8) if kind == "Q5_0" else _random_rows("F32", 1, 64, 0).reshape(-1)
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor(name, raw, raw_dtype=getattr(gguf.GGMLQuantizationType, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_gguf_tensors(path)[0].kind == kind
    assert float_state_from_gguf(path, type("Config", (), {"num_attention_heads": 4, "num_key_value_heads": 2})()) is None


def test_unpermute_rows_inverts_llama_cpp_permutation():
    heads, rows, cols = 3, 24, 8
    w = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)
    permuted = w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)  # llama.cpp's
    assert torch.equal(unpermute_rows(permuted, heads), w)


def test_pipeline_stages_carry_their_layers_quantized(tmp_path):
    spec = SPECS["int4_g16"]
    model = tiny_llama(seed=3)
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float32", quant=spec, tp_size=2, pp_size=2)
    merged = load_checkpoint(out).state_dict()
    for key, w in model.state_dict().items():
        if key.endswith("_proj.weight"):
            torch.testing.assert_close(merged[key], dequantize(spec, quantize_weight(spec, w)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("spec", [QuantSpec("int8", lm_head=True), QuantSpec("int4", 32, lm_head=True),
                                  QuantSpec("int4", lm_head=True), QuantSpec("int8", 32, lm_head=True)],
                         ids=["int8", "int4g32", "int4ch", "int8g32"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2)])
def test_quantize_lm_head_round_trips_over_ranks(tmp_path, tied, spec, tp, pp):
    """--quantize_lm_head: the head is split by vocabulary rows (padded: vocab 101 over 2
    ranks), the table whole on the first stage; loading gives back the same codes, a tied
    head as the table's own tensors, and the paged model one table for both."""
    from promptlookup.runtime.paged_llama import PagedLlama

    model = tiny_llama(seed=1, vocab_size=101, tie_word_embeddings=tied)
    out = convert_model(model, None, tmp_path / "c", dtype="float32", quant=spec, tp_size=tp, pp_size=pp)
    config, state = load_checkpoint_state(out, dtype="auto")
    head = quantize_weight(spec, model.lm_head.weight)
    for part, t in head.items():
        assert torch.equal(state["lm_head." + part], t)
    assert (state["lm_head.weight"] is state["model.embed_tokens.weight"]) == tied
    float_model = load_checkpoint(out)
    paged = PagedLlama(config, state)
    assert paged.tied_table == tied and paged.embed_weight is None
    ids = torch.tensor([0, 3, 100, 3])
    assert torch.equal(paged.embed_table.rows(ids), float_model.model.embed_tokens.weight[ids])
    assert torch.equal(paged.lm_head.dequantize(), float_model.lm_head.weight)


@pytest.mark.parametrize("tied", [True, False])
def test_a_table_taken_over_from_the_gguf_is_the_one_stored(tmp_path, tied):
    """With the table's blocks taken over (``prequantized``), the embedding and a tied head
    store those very codes, not a requantization of the float table; an untied head without
    blocks of its own is quantized from its float weight."""
    spec = QuantSpec("int8", 32, lm_head=True)
    model = tiny_llama(seed=2, tie_word_embeddings=tied)
    vocab, hidden = model.model.embed_tokens.weight.shape
    taken = quantize_weight(spec, torch.randn(vocab, hidden))  # not the model's own table: tells them apart
    out = convert_model(model, None, tmp_path / "c", dtype="float32", quant=spec,
                        prequantized={L.HF_EMBEDDING: taken})
    _, state = load_checkpoint_state(out, dtype="auto")
    head = taken if tied else quantize_weight(spec, model.lm_head.weight)
    for part in taken:
        assert torch.equal(state["model.embed_tokens." + part], taken[part])
        assert torch.equal(state["lm_head." + part], head[part])
