"""A loaded engine holds its weights once: the paged model's tensors add up to the engine's
own weight bytes (within 15%), and the load keeps nothing else alive. The optional second
copy (row-major weights for fast one-row steps on a CPU) changes memory, not outputs."""
from __future__ import annotations

import pytest
import torch

from promptlookup.decoding import generate
from promptlookup.engine.config import engine_weight_bytes
from promptlookup.engine.load import load_runner
from promptlookup.runtime.paged_llama import PagedLlama
from tests.conftest import _build_engine
from tests.tiny import tiny_llama


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def engine(request, tmp_path_factory, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    model = tiny_llama(seed=5, vocab_size=len(tok), hidden_size=128, intermediate_size=384,
                       tie_word_embeddings=request.param)
    return _build_engine(model, tok, tmp_path_factory.mktemp("weights"), max_seq_len=256, max_input_len=128)


def test_resident_weights_are_one_copy_of_the_engine(engine):
    runner = load_runner(engine, device="cpu")
    engine_bytes = engine_weight_bytes(engine)
    held = runner.model.resident_weight_bytes()
    model = runner.model
    if model.config.tie_word_embeddings and model.lm_head.kernel == "gemv":
        # the engine stores the tied LM head too; the C kernels stream the embedding table for it
        engine_bytes -= model.embed_weight.numel() * model.embed_weight.element_size()
    assert 0.9 * engine_bytes <= held <= 1.15 * engine_bytes
    assert not hasattr(runner, "hf_model")  # no Hugging Face model kept beside the paged one
    two = load_runner(engine, device="cpu", cpu_weight_copies=2).model
    c = two.config
    per_layer = c.hidden_size * (two.q_size + 2 * two.kv_size) + two.q_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    assert two.resident_weight_bytes() >= held + 4 * c.num_hidden_layers * per_layer  # the opt-in row-major copies


def test_two_copies_give_the_same_tokens(engine):
    prompts = [[5, 6, 7, 8, 5, 6, 7, 9, 5, 6], [11, 12, 13, 11, 12, 14]]
    outs = []
    for copies in (1, 2):
        runner = load_runner(engine, device="cpu", cpu_weight_copies=copies)
        outs.append([r.output_ids for r in generate(runner, prompts, max_new_tokens=20, end_id=-1)])
    assert outs[0] == outs[1]


def test_from_hf_leaves_the_model_as_it_was():
    model = tiny_llama(seed=1)
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    PagedLlama.from_hf(model)
    after = model.state_dict()
    assert set(after) == set(before)
    for k, (ptr, value) in before.items():
        assert after[k].data_ptr() == ptr and torch.equal(after[k], value)


def test_unknown_weights_are_refused():
    model = tiny_llama(seed=1)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="not used"):
        PagedLlama(model.config, state)
