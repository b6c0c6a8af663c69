"""MLX-style PromptLookupDecoder: same tokens as plain greedy decoding, ngram_min honoured,
colour marks accepted drafts."""
from __future__ import annotations

import io

import pytest

from promptlookup import PromptLookupDecoder
from promptlookup.errors import UserError

PROMPT = "one two three four one two three four one two three"


@pytest.fixture(scope="module")
def decoder(tiny_engine_dir):
    return PromptLookupDecoder(str(tiny_engine_dir))


def test_output_equals_plain_greedy(decoder):
    from promptlookup.decoding import generate

    out = io.StringIO()
    text = decoder.prompt_lookup(PROMPT, max_tokens=20, n_draft=6, ngram_max=3, ngram_min=1, stream=out)
    ids = decoder.tokenizer(PROMPT)["input_ids"]
    plain = generate(decoder.runner, [ids], max_new_tokens=20, end_id=decoder.tokenizer.eos_token_id)[0]
    assert decoder.last_result.output_ids == plain.output_ids
    assert out.getvalue().startswith(text) and "tokens/step" in out.getvalue()


def test_ngram_min_above_every_match_drafts_nothing(decoder):
    # Drafting starts after the first generated token (as MLX's demo, and TensorRT-LLM V2):
    # single-token matches over 40 tokens are sure to occur.
    decoder.prompt_lookup(PROMPT, max_tokens=40, n_draft=6, ngram_max=1, ngram_min=1, stream=io.StringIO())
    some = decoder.last_result.drafted
    decoder.prompt_lookup(PROMPT, max_tokens=40, n_draft=6, ngram_max=40, ngram_min=40, stream=io.StringIO())
    assert some > 0 and decoder.last_result.drafted == 0


def test_color_highlights_accepted_drafts(decoder):
    out = io.StringIO()
    decoder.prompt_lookup(PROMPT, max_tokens=20, n_draft=6, ngram_max=2, color=True, stream=out)
    if decoder.last_result.accepted:
        assert "\x1b[32m" in out.getvalue()


def test_bad_arguments(decoder):
    with pytest.raises(UserError):
        decoder.prompt_lookup(PROMPT, ngram_min=0, stream=io.StringIO())
    with pytest.raises(UserError):
        decoder.prompt_lookup("", stream=io.StringIO())


@pytest.mark.parametrize("kwargs, message", [
    ({"n_draft": 0}, "n_draft must be a positive integer, got 0"),
    ({"n_draft": 10 ** 6}, "n_draft 1000000 exceeds the engine's max_draft_len"),
    ({"ngram_max": 0}, "ngram_max must be a positive integer, got 0"),
    ({"ngram_min": 0}, "ngram_min must be a positive integer, got 0"),
    ({"ngram_min": 3, "ngram_max": 2}, "ngram_min 3 exceeds ngram_max 2"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
    ({"max_tokens": 10 ** 6}, "max_tokens 1000000 after a"),
    ({"temp": -1.0}, "temp must be a finite number >= 0"),
    ({"temp": float("nan")}, "temp must be a finite number >= 0"),
    ({"seed": -1}, "seed must be a non-negative integer"),
])
def test_errors_name_mlx_parameters(decoder, kwargs, message):
    with pytest.raises(UserError) as exc:
        decoder.prompt_lookup(PROMPT, stream=io.StringIO(), **kwargs)
    text = str(exc.value)
    assert message in text and "\n" not in text
    for other in ("prompt_lookup_num_tokens", "max_output_len", "max_matching_ngram_size", "max_new_tokens",
                  "min_matching_ngram_size"):
        assert other not in text


def test_cli_prints_prompt_then_text_then_statistics(tiny_engine_dir, capsys):
    from promptlookup.cli.mlx_decoder import main

    assert main(["--model-name", str(tiny_engine_dir), "--prompt", PROMPT, "--max-tokens", "12", "--n-draft", "4",
                 "--ngram-max", "2", "--ngram-min", "1", "--temp", "0", "--seed", "0", "--num-threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(PROMPT + "\n") and "tokens/step" in out


@pytest.mark.parametrize("flags, message", [
    (["--n-draft", "0"], "--n-draft must be a positive integer, got 0"),
    (["--ngram-min", "4", "--ngram-max", "2"], "--ngram-min 4 exceeds --ngram-max 2"),
    (["--max-tokens", "0"], "--max-tokens must be a positive integer"),
    (["--temp", "nan"], "--temp must be a finite number"),
])
def test_cli_bad_values_are_one_line_exit_2_before_loading(flags, message, tmp_path):
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-m", "promptlookup.cli.mlx_decoder", "--model-name", str(tmp_path / "none"),
                          "--prompt", "hi", "--num-threads", "1", *flags], capture_output=True, text=True)
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and message in got.stderr, got.stderr


def test_cli_n_draft_above_the_engine_names_the_flag(tiny_engine_dir):
    from promptlookup.cli.mlx_decoder import main

    with pytest.raises(UserError, match="--n-draft 100000 exceeds the engine's max_draft_len"):
        main(["--model-name", str(tiny_engine_dir), "--prompt", PROMPT, "--n-draft", "100000", "--num-threads", "1"])


def test_cli_prints_nothing_before_refusing_a_length_the_engine_cannot_hold(tiny_engine_dir, capsys):
    from promptlookup.cli.mlx_decoder import main

    with pytest.raises(UserError, match="--max-tokens"):
        main(["--model-name", str(tiny_engine_dir), "--prompt", PROMPT, "--max-tokens", "100000", "--num-threads", "1"])
    assert capsys.readouterr().out == ""
