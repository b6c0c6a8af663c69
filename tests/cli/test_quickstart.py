"""quickstart_advanced.py takes TensorRT-LLM's flags under TensorRT-LLM's names; each is
honoured (checked on what reaches the LLM API) or refused in one line."""
from __future__ import annotations

import dataclasses

import pytest

import promptlookup.api as api
from promptlookup.cli import quickstart as qs
from promptlookup.errors import UserError


@pytest.fixture()
def spy(monkeypatch):
    """Replace the LLM class quickstart builds with one that records its arguments and calls."""
    seen: dict = {"generate": []}

    class Spy(api.LLM):
        def __init__(self, model, **kwargs):
            seen["model"], seen["kwargs"] = model, kwargs
            if seen.get("stop_at_init"):
                raise UserError("stopped at init")
            super().__init__(model, **kwargs)
            seen["llm"] = self

        def generate(self, inputs, sampling_params=None):
            seen["generate"].append((list(inputs), sampling_params))
            return super().generate(inputs, sampling_params)

    monkeypatch.setattr(api, "LLM", Spy)
    return seen


def run(engine, *flags: str) -> int:
    return qs.main(["--model_dir", str(engine), "--max_tokens", "4", "--num_threads", "1", *flags])


def test_prompt_takes_several_values(tiny_engine_dir, spy, capsys):
    assert run(tiny_engine_dir, "--prompt", "a b a b", "x y z", "--prompt", "third") == 0
    out = capsys.readouterr().out
    assert "[0] Prompt: 'a b a b'" in out and "[1] Prompt: 'x y z'" in out and "[2] Prompt: 'third'" in out


def test_disable_kv_cache_reuse(tiny_engine_dir, spy):
    run(tiny_engine_dir, "--prompt", "a b")
    assert spy["kwargs"]["kv_cache_config"].enable_block_reuse is True
    run(tiny_engine_dir, "--prompt", "a b", "--disable_kv_cache_reuse")
    assert spy["kwargs"]["kv_cache_config"].enable_block_reuse is False
    with pytest.raises(UserError, match="contradict"):
        run(tiny_engine_dir, "--disable_kv_cache_reuse", "--kv_cache_enable_block_reuse")


def test_kv_cache_fraction_sizes_the_kv_cache(tiny_engine_dir, spy, monkeypatch, capsys):
    """TensorRT-LLM's --kv_cache_fraction reaches the runner: the KV pool takes that fraction
    of the memory free after the weights load (the reader patched to 10 MB); same text."""
    from promptlookup.runtime import kv_cache

    run(tiny_engine_dir, "--prompt", "a b a b a b")
    default = capsys.readouterr().out
    assert spy["kwargs"]["kv_cache_config"].free_gpu_memory_fraction is None
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 10_000_000)
    run(tiny_engine_dir, "--prompt", "a b a b a b", "--kv_cache_fraction", "0.5")
    assert spy["kwargs"]["kv_cache_config"].free_gpu_memory_fraction == 0.5
    pool = spy["llm"].runner.pool
    assert pool.nbytes <= 5_000_000 < pool.nbytes + pool.nbytes // pool.num_blocks  # whole blocks, rounded down
    assert capsys.readouterr().out == default
    help_text = {a.dest: a.help for a in qs.build_parser()._actions}["kv_cache_fraction"]
    assert "TensorRT-LLM's 0.9" in help_text and "CPU" in help_text


def test_kv_cache_dtype_reaches_the_kv_cache(tiny_engine_dir, spy, capsys):
    """quickstart_advanced.py's --kv_cache_dtype (default auto): KvCacheConfig.dtype, the pool's type."""
    import torch

    run(tiny_engine_dir, "--prompt", "a b a b a b")
    assert spy["kwargs"]["kv_cache_config"].dtype == "auto"
    assert spy["llm"].runner.pool.dtype == torch.float32
    run(tiny_engine_dir, "--prompt", "a b a b a b", "--kv_cache_dtype", "float16", "--device", "cpu")  # GPU: graphs refuse it
    assert spy["kwargs"]["kv_cache_config"].dtype == "float16"
    assert spy["llm"].runner.pool.dtype == torch.float16


@pytest.mark.parametrize("flag", ["--spec_decode_max_draft_len", "--spec_decode_nextn"])
def test_draft_len_and_its_old_name(tiny_engine_dir, spy, flag):
    run(tiny_engine_dir, "--prompt", "a b", flag, "3", "--max_matching_ngram_size", "4")
    spec = spy["kwargs"]["speculative_config"]
    assert (spec.max_draft_len, spec.max_matching_ngram_size) == (3, 4)


def test_spec_decode_algo_none_is_plain(tiny_engine_dir, spy):
    run(tiny_engine_dir, "--prompt", "a b", "--spec_decode_algo", "none")
    assert spy["kwargs"]["speculative_config"] is None


def test_max_batch_size_and_max_num_tokens_split_the_batches(tiny_engine_dir, spy, capsys):
    prompts = ["a b a b", "x y", "one two"]
    run(tiny_engine_dir, "--prompt", *prompts, "--max_batch_size", "2")
    assert [len(p) for p, _ in spy["generate"]] == [2, 1]
    whole = capsys.readouterr().out
    spy["generate"].clear()
    run(tiny_engine_dir, "--prompt", *prompts, "--max_batch_size", "1")
    assert [p for p, _ in spy["generate"]] == [[p] for p in prompts]
    assert capsys.readouterr().out == whole  # greedy: the same text however the prompts are batched
    assert qs.batches([3, 3, 3], 4, 8, 14) == [[0, 1], [2]]
    with pytest.raises(UserError, match="--max_num_tokens 5"):
        run(tiny_engine_dir, "--prompt", "a b a b", "--max_num_tokens", "5")


def test_limits_above_the_engine_are_refused(tiny_engine_dir, spy):
    with pytest.raises(UserError, match="exceeds the engine's max_seq_len"):
        run(tiny_engine_dir, "--max_seq_len", "100000")
    with pytest.raises(UserError, match="exceeds the engine's max_batch_size"):
        run(tiny_engine_dir, "--max_batch_size", "100000")
    with pytest.raises(UserError, match="exceeds max_seq_len 5"):
        run(tiny_engine_dir, "--prompt", "a b a b", "--max_seq_len", "5")


def test_limits_build_a_model_source(tmp_path, spy):
    spy["stop_at_init"] = True
    src = tmp_path / "model.gguf"
    src.write_bytes(b"")
    with pytest.raises(UserError, match="stopped at init"):
        qs.main(["--model_dir", str(src), "--max_seq_len", "512", "--max_batch_size", "2", "--num_threads", "1"])
    build = spy["kwargs"]["build"]
    assert (build.max_seq_len, build.max_batch_size) == (512, 2)


def test_apply_chat_template(tiny_engine_dir, spy, capsys):
    run(tiny_engine_dir, "--prompt", "hello", "--apply_chat_template")
    sent = spy["generate"][0][0][0]
    assert "hello" in sent and sent != "hello" and "Prompt: " + repr(sent) in capsys.readouterr().out


def test_num_threads_is_applied(tiny_engine_dir, spy):
    import torch

    before = torch.get_num_threads()
    try:
        run(tiny_engine_dir, "--prompt", "a b")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(UserError, match="--num_threads"):
        qs.main(["--model_dir", str(tiny_engine_dir), "--num_threads", "0"])


@pytest.mark.parametrize("flags, match", [
    (["--max_beam_width", "2"], "beam search is not supported"),
    (["--kv_cache_fraction", "1.5"], r"--kv_cache_fraction must be a number in \(0, 1\], got 1.5"),
    (["--kv_cache_fraction", "0"], r"--kv_cache_fraction must be a number in \(0, 1\], got 0"),
    (["--max_seq_len", "0"], "--max_seq_len must be at least 1"),
    (["--max_num_tokens", "0"], "--max_num_tokens must be at least 1"),
    # another algorithm's flags, and sampling filters at temperature 0: accepted and ignored before
    (["--spec_decode_algo", "NONE", "--max_matching_ngram_size", "5", "--no-is_keep_all"],
     "--max_matching_ngram_size, --is_keep_all apply to another --spec_decode_algo than NONE"),
    (["--spec_decode_algo", "LOOKAHEAD", "--spec_decode_max_draft_len", "1"],
     "--spec_decode_max_draft_len applies to another --spec_decode_algo than LOOKAHEAD"),
    (["--max_window_size", "2"], "--max_window_size applies to another --spec_decode_algo than NGRAM"),
    (["--top_k", "50", "--top_p", "0.1"], "--top_k 50, --top_p 0.1 shape sampling, but --temperature is 0"),
])
def test_refused_flags(flags, match, spy):
    with pytest.raises(UserError, match=match):
        qs.main(["--model_dir", "nowhere", *flags])
    assert "kwargs" not in spy  # refused before any model is loaded


def test_logprobs_are_printed_one_per_token(tiny_engine_dir, spy, capsys):
    from promptlookup.api import Logprob

    run(tiny_engine_dir, "--prompt", "a b", "--logprobs", "--max_tokens", "5")
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "Logprobs: " in ln)
    logprobs = eval(line.split("Logprobs: ", 1)[1], {"__builtins__": {}, "Logprob": Logprob})  # TensorRT-LLM's print
    tokens = int(next(ln for ln in out.splitlines() if " tokens in " in ln).split()[0])
    assert len(logprobs) == tokens and all(1 <= len(d) <= 2 for d in logprobs)
    assert all(isinstance(v, Logprob) and v.logprob <= 0 and v.rank >= 1 for d in logprobs for v in d.values())


def test_n_is_honoured_or_refused(tiny_engine_dir, spy, capsys):
    fields = {f.name for f in dataclasses.fields(api.SamplingParams)}
    run(tiny_engine_dir, "--prompt", "a b", "--n", "1")
    if "n" not in fields:
        with pytest.raises(UserError, match="--n 2"):
            run(tiny_engine_dir, "--prompt", "a b", "--n", "2")
    else:
        run(tiny_engine_dir, "--prompt", "a b", "--n", "2", "--temperature", "1")
        out = capsys.readouterr().out
        assert "[0][0] Prompt" in out and "[0][1] Prompt" in out


def test_help_says_why_defaults_differ_from_tensorrt_llm():
    parser = qs.build_parser()
    helps = {a.dest: a.help for a in parser._actions}
    for dest in ("spec_decode_algo", "spec_decode_max_draft_len", "max_matching_ngram_size", "max_batch_size"):
        assert "TensorRT-LLM's" in helps[dest] and ":" in helps[dest], dest
    args = parser.parse_args([])
    assert (args.max_num_tokens, args.max_beam_width, args.max_seq_len) == (8192, 1, None)  # TensorRT-LLM's


@pytest.mark.parametrize("flags", [["--max_beam_width", "4"], ["--kv_cache_fraction", "1.9"], ["--n", "0"]])
def test_refusals_are_one_line_exit_2(flags, capsys):
    from promptlookup.errors import run_cli

    with pytest.raises(SystemExit) as exc:
        run_cli(qs.main, ["--model_dir", "nowhere", *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and flags[0] in err
