"""Prompt construction and truncation with the real SmolLM2 tokenizer."""
from __future__ import annotations

import copy

import pytest

from promptlookup.errors import UserError
from promptlookup.evaluation.prompts import build_prompt_ids, check_chat_template, summary_text

LONG = " ".join(f"Sentence number {i} tells of the harbour and the boats." for i in range(60))


def test_text_is_article_plus_cue_with_joined_contractions():
    assert summary_text("  They do n't know.") == "They don't know. TL;DR:"  # ends stripped


def test_short_prompt_is_untouched(tokenizer):
    ids = build_prompt_ids(tokenizer, "The boats came home.", max_input_length=100)
    assert ids == list(tokenizer.encode("The boats came home. TL;DR:", add_special_tokens=True))


def test_text_truncation_keeps_the_head_like_tensorrt_llm(tokenizer):
    full = list(tokenizer.encode(summary_text(LONG), add_special_tokens=True))
    ids = build_prompt_ids(tokenizer, LONG, max_input_length=50)
    assert len(full) > 50 and ids == full[:50]
    assert not tokenizer.decode(ids).endswith("TL;DR:")


def test_article_truncation_keeps_the_cue(tokenizer):
    ids = build_prompt_ids(tokenizer, LONG, max_input_length=50, truncation="article")
    assert 40 <= len(ids) <= 50
    text = tokenizer.decode(ids)
    assert text.startswith("Sentence number 0") and text.endswith("TL;DR:")


def test_chat_template_wraps_and_fits(tokenizer):
    ids = build_prompt_ids(tokenizer, LONG, max_input_length=120, use_chat_template=True)
    assert len(ids) <= 120
    text = tokenizer.decode(ids)
    assert text.rstrip().endswith("assistant") and "TL;DR:" in text and "Sentence number 0" in text


def test_limit_too_small_for_fixed_part(tokenizer):
    with pytest.raises(UserError, match="max_input_length"):
        build_prompt_ids(tokenizer, LONG, max_input_length=5, use_chat_template=True)


def test_missing_chat_template(tokenizer):
    plain = copy.copy(tokenizer)
    plain.chat_template = None
    with pytest.raises(UserError, match="chat template"):
        check_chat_template(plain)
    check_chat_template(tokenizer)
