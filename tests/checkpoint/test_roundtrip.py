"""HF Llama -> TensorRT-LLM checkpoint -> HF Llama, on the tiny GQA model (tests/tiny.py).

The rank files are checked against the original weights by slicing them here, by hand,
independently of the code under test.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from promptlookup.checkpoint.convert import checkpoint_config, convert_model
from promptlookup.checkpoint.load import llama_config_from_checkpoint, load_checkpoint
from promptlookup.checkpoint.source import load_source_model
from promptlookup.errors import UserError
from tests.checkpoint.conftest import leftovers
from tests.tiny import tiny_llama

HEAD = 16  # tiny: hidden 64 / 4 heads; 2 KV heads; intermediate 128; 2 layers


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("tp, pp, tie, vocab", [
    (1, 1, False, 512),
    (2, 1, False, 512),
    (2, 2, False, 512),
    (4, 1, False, 511),  # K/V heads duplicated (2 KV heads, 4 ranks) and vocab padded
    (4, 2, True, 511),
    (1, 2, True, 512),
    (2, 1, True, 512),
])
def test_round_trip_reproduces_logits(tmp_path, ids, tp, pp, tie, vocab):
    model = tiny_llama(seed=tp * 10 + pp, vocab_size=vocab, tie_word_embeddings=tie)
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float32", tp_size=tp, pp_size=pp)
    assert sorted(p.name for p in out.iterdir()) == sorted([".promptlookup-output.json", "config.json"]
                                                          + [f"rank{r}.safetensors" for r in range(tp * pp)])
    loaded = load_checkpoint(out)
    assert not loaded.training and loaded.dtype == torch.float32
    assert (logits(loaded, ids) - logits(model, ids)).abs().max().item() <= 1e-5
    tied = loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert tied == tie
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_rank_files_have_tensorrt_llm_names_and_stage_placement(tmp_path):
    model = tiny_llama(seed=3, vocab_size=511)
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float32", tp_size=2, pp_size=2)
    per_layer = ["attention.qkv.weight", "attention.dense.weight", "mlp.fc.weight", "mlp.gate.weight",
                 "mlp.proj.weight", "input_layernorm.weight", "post_layernorm.weight"]
    layer0 = {f"transformer.layers.0.{n}" for n in per_layer}  # one layer per stage, LOCAL index 0
    for rank in range(4):
        tensors = load_file(out / f"rank{rank}.safetensors")
        expected = set(layer0)
        if rank in (0, 1):  # first stage: the embedding, whole on every tensor rank
            expected |= {"transformer.vocab_embedding.weight"}
            assert torch.equal(tensors["transformer.vocab_embedding.weight"], model.model.embed_tokens.weight)
        else:  # last stage: final norm and the padded, split lm_head
            expected |= {"transformer.ln_f.weight", "lm_head.weight"}
            assert tensors["lm_head.weight"].shape == (256, 64)
        assert set(tensors) == expected
        layer = model.model.layers[rank // 2]  # stage = rank // tp
        assert torch.equal(tensors["transformer.layers.0.input_layernorm.weight"], layer.input_layernorm.weight)
        assert torch.equal(tensors["transformer.layers.0.post_layernorm.weight"], layer.post_attention_layernorm.weight)
    head = torch.cat([load_file(out / f"rank{r}.safetensors")["lm_head.weight"] for r in (2, 3)])
    assert torch.equal(head[:511], model.lm_head.weight) and torch.count_nonzero(head[511:]) == 0


@pytest.mark.parametrize("tp", [2, 4])
def test_qkv_and_mlp_slices_match_hf_weights(tmp_path, tp):
    model = tiny_llama(seed=5)
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float32", tp_size=tp)
    heads_per_rank, inter = 4 // tp, 128 // tp
    for r in range(tp):
        tensors = load_file(out / f"rank{r}.safetensors")
        for i, layer in enumerate(model.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            kv = r * 2 // tp  # tp=2: rank r owns KV head r; tp=4: ranks 2h, 2h+1 share head h
            q_rows = att.q_proj.weight[r * heads_per_rank * HEAD:(r + 1) * heads_per_rank * HEAD]
            k_rows = att.k_proj.weight[kv * HEAD:(kv + 1) * HEAD]
            v_rows = att.v_proj.weight[kv * HEAD:(kv + 1) * HEAD]
            name = f"transformer.layers.{i}."
            assert torch.equal(tensors[name + "attention.qkv.weight"], torch.cat([q_rows, k_rows, v_rows]))
            cols = slice(r * heads_per_rank * HEAD, (r + 1) * heads_per_rank * HEAD)
            assert torch.equal(tensors[name + "attention.dense.weight"], att.o_proj.weight[:, cols])
            rows = slice(r * inter, (r + 1) * inter)
            assert torch.equal(tensors[name + "mlp.fc.weight"], mlp.gate_proj.weight[rows])
            assert torch.equal(tensors[name + "mlp.gate.weight"], mlp.up_proj.weight[rows])
            assert torch.equal(tensors[name + "mlp.proj.weight"], mlp.down_proj.weight[:, rows])


def test_config_json_uses_tensorrt_llm_keys(tmp_path):
    model = tiny_llama(seed=0, tie_word_embeddings=True)
    out = convert_model(model, None, tmp_path / "ckpt", tp_size=2, pp_size=2)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "LlamaForCausalLM"
    assert cfg["dtype"] == "float16"  # auto: a float32 source is stored as float16
    assert cfg["logits_dtype"] == "float32"
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]) == (512, 64, 128)
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]) == (2, 4, 2, 16)
    assert (cfg["hidden_act"], cfg["position_embedding_type"]) == ("silu", "rope_gpt_neox")
    assert cfg["norm_epsilon"] == pytest.approx(1e-5) and cfg["rotary_base"] == 10000.0
    assert cfg["rotary_scaling"] is None and cfg["max_position_embeddings"] == 2048
    assert cfg["tie_word_embeddings"] is True
    assert cfg["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 0)
    assert load_file(out / "rank0.safetensors")["transformer.vocab_embedding.weight"].dtype == torch.float16
    assert "lm_head.weight" in load_file(out / "rank3.safetensors")  # written although tied


def test_rope_scaling_survives_the_round_trip(tmp_path, ids):
    model = tiny_llama(seed=1, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0})
    out = convert_model(model, None, tmp_path / "ckpt", dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rotary_base"] == 5000.0
    assert cfg["rotary_scaling"] == {"rope_type": "linear", "factor": 2.0}
    rebuilt = llama_config_from_checkpoint(cfg).rope_parameters
    assert (rebuilt["rope_type"], rebuilt["factor"], rebuilt["rope_theta"]) == ("linear", 2.0, 5000.0)
    assert (logits(load_checkpoint(out), ids) - logits(model, ids)).abs().max().item() <= 1e-5


def test_auto_dtype_keeps_half_sources_and_load_dtype_is_selectable(tmp_path):
    model = tiny_llama(seed=2).to(torch.bfloat16)
    out = convert_model(model, None, tmp_path / "ckpt")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_file(out / "rank0.safetensors")["lm_head.weight"].dtype == torch.bfloat16
    assert load_checkpoint(out).dtype == torch.float32
    assert load_checkpoint(out, dtype="auto").dtype == torch.bfloat16
    as_half = load_checkpoint(out, dtype="float16")
    assert as_half.dtype == torch.float16
    assert torch.equal(as_half.lm_head.weight, model.lm_head.weight.to(torch.float16))


def test_engine_directory_config_and_explicit_config(tmp_path, ids):
    model = tiny_llama(seed=4)
    ckpt = convert_model(model, None, tmp_path / "ckpt", dtype="float32", tp_size=2)
    cfg = json.loads((ckpt / "config.json").read_text())
    engine = tmp_path / "engine"
    shutil.copytree(ckpt, engine)
    (engine / "config.json").write_text(json.dumps({"pretrained_config": cfg, "build_config": {"max_batch_size": 8}}))
    expected = logits(model, ids)
    assert torch.equal(logits(load_checkpoint(engine), ids), expected)
    assert torch.equal(logits(load_checkpoint(ckpt, config={"pretrained_config": cfg}), ids), expected)
    assert torch.equal(logits(load_checkpoint(ckpt, config=cfg), ids), expected)


def test_hf_directory_source(tmp_path, ids):
    model = tiny_llama(seed=6, tie_word_embeddings=True)
    model.save_pretrained(tmp_path / "hf")
    loaded, tokenizer = load_source_model(model_dir=str(tmp_path / "hf"))
    assert tokenizer is None  # the directory has no tokenizer files
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    out = convert_model(loaded, tokenizer, tmp_path / "ckpt", dtype="float32", tp_size=2)
    assert torch.equal(logits(load_checkpoint(out), ids), logits(model, ids))


def test_hf_directory_with_corrupt_or_partial_weights_is_a_user_error(tmp_path):
    from safetensors.torch import load_file as read, save_file

    tiny_llama(seed=6).save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    state = read(weights)
    state.pop("model.layers.1.mlp.up_proj.weight")
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(UserError, match="incomplete: missing 1 tensors"):
        load_source_model(model_dir=str(tmp_path / "hf"))
    weights.write_bytes(b"\x07" * 64)
    with pytest.raises(UserError, match="cannot load the weights"):
        load_source_model(model_dir=str(tmp_path / "hf"))


def test_checkpoint_config_validates_the_split():
    with pytest.raises(UserError, match="tp_size 3 does not divide"):
        checkpoint_config(tiny_llama().config, "float32", tp_size=3)
    with pytest.raises(UserError, match="unsupported dtype"):
        checkpoint_config(tiny_llama().config, "float8", tp_size=1)


def _corrupt(out, what):
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if what == "missing rank":
        (out / "rank1.safetensors").unlink()
        return "rank1.safetensors is missing"
    if what == "wrong split":
        cfg["mapping"] = {"world_size": 1, "tp_size": 1, "pp_size": 1}
        cfg_path.write_text(json.dumps(cfg))
        return "has shape"
    if what == "quantized":  # the config says W8A16, the rank files hold float weights
        cfg["quantization"] = {"quant_algo": "W8A16", "kv_cache_quant_algo": None}
        cfg_path.write_text(json.dumps(cfg))
        return "lacks .* tensors"
    if what == "unsupported quantization":
        cfg["quantization"] = {"quant_algo": "FP8", "kv_cache_quant_algo": None}
        cfg_path.write_text(json.dumps(cfg))
        return "quant_algo FP8 is not supported by the PyTorch runtime"
    if what == "other architecture":
        cfg["architecture"] = "GPTForCausalLM"
        cfg_path.write_text(json.dumps(cfg))
        return "architecture 'GPTForCausalLM' is not supported"
    if what == "no config":
        cfg_path.unlink()
        return "no config.json"
    if what == "garbage rank":
        (out / "rank0.safetensors").write_bytes(b"\x00" * 100)
        return "cannot read .*rank0.safetensors"
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["missing rank", "wrong split", "quantized", "unsupported quantization",
                                  "other architecture", "no config", "garbage rank"])
def test_load_rejects_bad_checkpoints(tmp_path, what):
    out = convert_model(tiny_llama(), None, tmp_path / "ckpt", dtype="float32", tp_size=2)
    message = _corrupt(out, what)
    with pytest.raises(UserError, match=message):
        load_checkpoint(out)


def test_load_rejects_missing_directory(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_output_is_replaced_atomically_and_failures_leave_nothing(tmp_path):
    target = tmp_path / "ckpt"
    convert_model(tiny_llama(seed=0), None, target, dtype="float32", tp_size=2)
    convert_model(tiny_llama(seed=1), None, target, dtype="float32")  # replaces the tp=2 checkpoint
    assert sorted(p.name for p in target.iterdir()) == [".promptlookup-output.json", "config.json", "rank0.safetensors"]
    assert leftovers(tmp_path, "ckpt") == ["ckpt"]
    with pytest.raises(UserError):
        convert_model(tiny_llama(), None, tmp_path / "bad", tp_size=3)
    assert leftovers(tmp_path, "bad") == []
