"""Weight-only int8/int4 engines end to end: resident weights are the engine's own (no float
copy kept), a fraction of the float32 engine's; run.py records the precision; the compiled
route is refused in one line. With ``--quantize_lm_head`` (``QuantSpec(..., lm_head=True)``) the
tied embedding table and LM head are one quantized table, on a geometry where the table is a
real share of the weights as on SmolLM2. (Greedy identity on quantized engines: test_greedy_equivalence,
test_lookahead and test_tree_lookup, parametrized over int8, int4 and int8 in groups; on a GPU:
test_gpu_quant.)"""
from __future__ import annotations

import json

import pytest

from promptlookup.checkpoint.quant_spec import QuantSpec
from promptlookup.engine.config import engine_weight_bytes
from promptlookup.engine.load import load_runner
from promptlookup.errors import UserError
from tests.cli.test_run_cli import TEXT, run_cli
from tests.conftest import _build_engine
from tests.tiny import tiny_llama

SPECS = {"fp32": None, "int8": QuantSpec("int8"), "int4": QuantSpec("int4"), "int4_g128": QuantSpec("int4", 128),
         "int8_g32": QuantSpec("int8", 32)}
# The share of the (unquantized) embedding and LM head sets the attainable ratio; this
# geometry is decoder-dominated like a real model's (SmolLM2's figures: docs/checkpoint.md).
GEOMETRY = dict(vocab_size=256, hidden_size=128, intermediate_size=512, num_hidden_layers=4)
# int8 in groups of 32 holds 8 bytes of scale and offset per 32 one-byte codes (1.25 bytes a
# weight): 0.31 of float32 when the table is quantized too, as on SmolLM2 (docs/checkpoint.md)
TARGET = {"int8": 0.35, "int4": 0.2, "int4_g128": 0.2, "int8_g32": 0.4, "int8g": 0.35}


# SmolLM2-135M scaled down: 49152 x 576 tied table vs 30 layers of 576/1536 (the table ~21% of
# the fp32 weights); here 768 x 64 vs 4 layers of 64/192 (~20%).
TIED_GEOMETRY = dict(vocab_size=768, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
                     tie_word_embeddings=True)
TABLE_SPECS = {"fp32": None, "int8": QuantSpec("int8"), "int4": QuantSpec("int4", 32),
               "int8_lm": QuantSpec("int8", lm_head=True), "int4_lm": QuantSpec("int4", 32, lm_head=True),
               "int8g": QuantSpec("int8", 32), "int8g_lm": QuantSpec("int8", 32, lm_head=True)}


def _engines(tmp_path_factory, folder: str, seed: int, geometry: dict, specs: dict) -> dict:
    """One tiny engine per ``specs`` entry, all from the same random model."""
    model = tiny_llama(seed=seed, **geometry)
    root = tmp_path_factory.mktemp(folder)
    return {name: _build_engine(model, None, root / name, max_seq_len=256, max_input_len=128, quant=spec)
            for name, spec in specs.items()}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return _engines(tmp_path_factory, "quant_engines", 5, GEOMETRY, SPECS)


@pytest.mark.parametrize("name", ["int8", "int4", "int4_g128", "int8_g32"])
def test_resident_weights_are_the_quantized_engine_alone(engines, name):
    held = load_runner(engines[name], device="cpu").model.resident_weight_bytes()
    fp32 = load_runner(engines["fp32"], device="cpu").model.resident_weight_bytes()
    own = engine_weight_bytes(engines[name])
    assert 0.9 * own <= held <= 1.15 * own  # int4 per channel adds its computed offsets
    assert held <= TARGET[name] * fp32, held / fp32


@pytest.fixture(scope="module")
def tied_engines(tmp_path_factory):
    return _engines(tmp_path_factory, "tied_quant_engines", 7, TIED_GEOMETRY, TABLE_SPECS)


@pytest.mark.parametrize("name", ["int8", "int4", "int8g"])
def test_quantize_lm_head_meets_the_targets_with_one_table(tied_engines, name):
    """Without the flag the float table caps the ratio above the target; with it, one
    quantized table serves the lookup and the head, and the targets hold."""
    fp32 = load_runner(tied_engines["fp32"], device="cpu").model.resident_weight_bytes()
    plain = load_runner(tied_engines[name], device="cpu").model.resident_weight_bytes()
    model = load_runner(tied_engines[name + "_lm"], device="cpu").model
    held = model.resident_weight_bytes()
    assert plain > TARGET[name] * fp32, plain / fp32  # the geometry's table is a real share
    assert held <= TARGET[name] * fp32, held / fp32
    assert model.tied_table and model.embed_weight is None  # no float table held
    own = engine_weight_bytes(tied_engines[name + "_lm"])
    # the engine stores lm_head.* beside the table (TensorRT-LLM always stores lm_head); one is resident
    assert held == pytest.approx(own - model.lm_head.resident_bytes(), rel=0.01)


@pytest.mark.parametrize("name", ["int8_lm", "int4_lm", "int8g_lm"])
def test_quantized_table_lookup_is_the_dequantized_rows(tied_engines, name):
    import torch

    from promptlookup.checkpoint.load import load_checkpoint

    model = load_runner(tied_engines[name], device="cpu").model
    table = model.embed_table.dequantize()
    ids = torch.tensor([0, 5, 767, 5, 300])
    assert torch.equal(model.embed_table.rows(ids), table[ids])
    # the float model the engine stands for (load_checkpoint dequantizes) has that table as both
    hf = load_checkpoint(tied_engines[name])
    assert torch.equal(hf.model.embed_tokens.weight, table)
    assert torch.equal(hf.lm_head.weight, table)


def test_quantize_lm_head_is_recorded_in_the_quant_config(tied_engines):
    from promptlookup.checkpoint.load import read_checkpoint_config

    quant = read_checkpoint_config(tied_engines["int4_lm"])["quantization"]
    assert quant["quant_algo"] == "W4A16_GPTQ" and quant["exclude_modules"]  # empty reads as the default
    assert not any("lm_head" in m or "vocab_embedding" in m for m in quant["exclude_modules"])
    default = read_checkpoint_config(tied_engines["int4"])["quantization"]["exclude_modules"]
    assert "lm_head" in default
    assert QuantSpec.from_config(quant) == TABLE_SPECS["int4_lm"]
    for empty in ([], None):  # TensorRT-LLM reads an empty list as its default, lm_head excluded
        assert not QuantSpec.from_config({**quant, "exclude_modules": empty}).lm_head


def test_compiled_route_is_refused_for_quantized_engines(engines):
    with pytest.raises(UserError, match="cannot trace the int8/int4 products") as err:
        load_runner(engines["int8"], device="cpu", compile_mode="inductor")
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def int4_engine_with_tokenizer(tmp_path_factory, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    model = tiny_llama(seed=3, vocab_size=len(tok))
    return _build_engine(model, tok, tmp_path_factory.mktemp("int4_tok"), max_seq_len=256, max_input_len=128,
                         quant=QuantSpec("int4", 32))


def test_run_py_records_the_precision(int4_engine_with_tokenizer, tmp_path):
    out = tmp_path / "run.json"
    proc = run_cli("--engine_dir", str(int4_engine_with_tokenizer), "--input_text", TEXT, "--max_output_len", "8",
                   "--prompt_lookup_config", "[4,2,[0]]", "--output_json", str(out))
    assert proc.returncode == 0, proc.stderr
    config = json.loads(out.read_text())["config"]
    assert (config["weights"], config["quant_algo"], config["group_size"]) == ("int4", "W4A16_GPTQ", 32)


def test_run_py_refuses_torch_compile_on_a_quantized_engine(int4_engine_with_tokenizer):
    proc = run_cli("--engine_dir", str(int4_engine_with_tokenizer), "--input_text", TEXT, "--max_output_len", "4",
                   "--torch_compile", "inductor")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --torch_compile inductor cannot trace")
    assert "Traceback" not in proc.stderr


def test_llm_api_runs_a_quantized_engine_as_plain_decoding(int4_engine_with_tokenizer):
    """The LLM API (and so serve.py, built on it): prompt lookup on an int4 engine equals its plain decoding."""
    from promptlookup import LLM, NGramDecodingConfig, SamplingParams

    params = SamplingParams(max_tokens=12)
    with LLM(str(int4_engine_with_tokenizer)) as plain:
        want = [o.outputs[0].token_ids for o in plain.generate([TEXT, "a b a b a b a b"], params)]
    spec = NGramDecodingConfig(max_draft_len=4, max_matching_ngram_size=2)
    with LLM(str(int4_engine_with_tokenizer), speculative_config=spec) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate([TEXT, "a b a b a b a b"], params)] == want


def test_hf_entry_runs_the_dequantized_engine(int4_engine_with_tokenizer):
    """``load_checkpoint`` of a quantized engine is the float model its codes stand for; the HF
    entry runs it like any in-memory Llama (greedy: ``model.generate``'s tokens)."""
    import torch

    from promptlookup import hf
    from promptlookup.checkpoint.load import load_checkpoint

    model = load_checkpoint(int4_engine_with_tokenizer)
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    want = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)
    got = hf.generate(model, ids, max_new_tokens=10, do_sample=False, pad_token_id=0, prompt_lookup_num_tokens=4)
    assert torch.equal(got, want)


def test_a_gpu_without_triton_refuses_a_quantized_engine_in_one_line(engines, monkeypatch):
    """The GPU's products are Triton kernels (runtime/gpu_quant.py): without Triton the engine is
    refused on load, naming the fix, rather than run some other way."""
    import promptlookup.engine.load as load
    from promptlookup.runtime import gpu_quant

    monkeypatch.setattr(load, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(gpu_quant, "available", lambda: False)
    with pytest.raises(UserError, match="need Triton, which is not installed: pip install triton"):
        load_runner(engines["int8"], device="cuda")


def test_gpu_products_refuse_cpu_tensors():
    import torch

    from promptlookup.runtime import gpu_quant

    if gpu_quant.INTERPRET:
        pytest.skip("Triton's interpreter runs these products on CPU tensors")
    q = torch.zeros(4, 8, dtype=torch.int8)
    error = (ValueError, "runs on CUDA tensors") if gpu_quant.available() else (RuntimeError, "need Triton")
    with pytest.raises(error[0], match=error[1]):
        gpu_quant.linear(torch.zeros(1, 8), q, torch.ones(4), None, None)


@pytest.mark.parametrize("kind", ["int8", "int8g", "int4"])
def test_a_prefill_product_dequantizes_blocks_for_mkl_and_a_step_keeps_the_c_kernels(kind, monkeypatch):
    """More than GEMV_MAX_ROWS rows (a prompt) take the float32 layer's route: blocks of the
    dequantized weight through MKL, equal to dequantize-then-multiply within float tolerance, not
    the few-row kernels; a step of GEMV_MAX_ROWS rows still runs them."""
    import torch

    from promptlookup.checkpoint.quantize import quantize_int4_groups, quantize_int8, quantize_int8_groups
    from promptlookup.runtime import kernels, quant_linear
    from promptlookup.runtime.cpu_linear import GEMV_MAX_ROWS

    g = torch.Generator().manual_seed(0)
    w = torch.randn(quant_linear.PREFILL_BLOCK + 40, 64, generator=g)  # one whole block and a part
    parts = {"int8": lambda: (quantize_int8(w), None), "int8g": lambda: (quantize_int8_groups(w, 32), 32),
             "int4": lambda: (quantize_int4_groups(w, 32), 32)}[kind]()
    layer = quant_linear.QuantLinear(*parts[0], group_size=parts[1])
    x = torch.randn(GEMV_MAX_ROWS + 1, 64, generator=g)
    few_rows = {name: getattr(kernels, name) for name in ("linear_int8", "linear_int8_groups", "linear_int4")}
    calls = []
    for name, fn in few_rows.items():
        monkeypatch.setattr(kernels, name, lambda *a, _fn=fn, **k: calls.append(a[0].shape[0]) or _fn(*a, **k))
    expected = (x.double() @ layer.dequantize().double().T).float()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-4)
    assert calls == []
    step = layer(x[:GEMV_MAX_ROWS])
    assert calls == [GEMV_MAX_ROWS]
    torch.testing.assert_close(step, expected[:GEMV_MAX_ROWS], rtol=1e-5, atol=1e-4)


def test_a_second_weight_copy_is_refused_where_nothing_would_keep_it(engines):
    from promptlookup.engine.load import load_runner
    from promptlookup.errors import UserError

    for name, engine in engines.items():
        if name == "fp32":
            assert load_runner(engine, device="cpu", cpu_weight_copies=2).model is not None  # float: kept
            with pytest.raises(UserError, match="--torch_compile inductor holds each projection once"):
                load_runner(engine, device="cpu", cpu_weight_copies=2, compile_mode="inductor")
            continue
        with pytest.raises(UserError, match="int8/int4 projections are held once .*: drop it"):
            load_runner(engine, device="cpu", cpu_weight_copies=2)
