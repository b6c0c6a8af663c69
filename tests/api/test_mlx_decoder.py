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
