"""Turning an article into prompt token ids, the way TensorRT-LLM's ``summarize.py`` does.

The text is ``article + " TL;DR: "``, stripped, with ``" n't"`` joined to the preceding
word (``"do n't"`` -> ``"don't"``, a quirk of the CNN/DailyMail text that TensorRT-LLM
also fixes). It is tokenized with the tokenizer's special tokens (BOS for Llama).

Truncation to ``max_input_length`` tokens comes in two flavours:

- ``"text"`` (default, TensorRT-LLM's behaviour): tokenize the whole text with
  ``truncation=True, max_length=max_input_length``, i.e. keep the first tokens. An
  article longer than the limit therefore loses its ``TL;DR:`` cue.
- ``"article"``: shorten the article only, so the prompt always ends with the cue.

With a chat template the (possibly shortened) text becomes the user turn of a chat
request rendered with ``add_generation_prompt=True``; the article is always the part
that is shortened there, so the template's closing tokens survive.

Cost: O(prompt length) tokenizer work, at most a few re-tokenizations when shortening.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError
from ..text import chat_ids, has_chat_template

TLDR_SUFFIX = " TL;DR: "
SYSTEM_PROMPT = "You summarize news articles. Reply with a short summary of the article, in two or three sentences."
TRUNCATIONS = ("text", "article")
_SHRINK_ATTEMPTS = 6


def summary_text(article: str) -> str:
    """The plain prompt text for ``article`` (before tokenization)."""
    return (article + TLDR_SUFFIX).strip().replace(" n't", "n't")


def check_chat_template(tokenizer: Any) -> None:
    """Raise :class:`UserError` when ``tokenizer`` has no chat template."""
    if not has_chat_template(tokenizer):
        raise UserError("--use_chat_template was given but the tokenizer has no chat template; drop the flag for a base model")


def _chat_ids(tokenizer: Any, text: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    try:
        return chat_ids(tokenizer, messages)
    except UserError:
        raise
    except Exception:  # some templates reject a system turn: fold it into the user turn
        return chat_ids(tokenizer, [{"role": "user", "content": f"{SYSTEM_PROMPT}\n\n{text}"}])


def _encode(tokenizer: Any, article: str, use_chat_template: bool) -> list[int]:
    text = summary_text(article)
    if use_chat_template:
        return _chat_ids(tokenizer, text)
    return list(tokenizer.encode(text, add_special_tokens=True))


def build_prompt_ids(
    tokenizer: Any,
    article: str,
    *,
    max_input_length: int,
    use_chat_template: bool = False,
    truncation: str = "text",
) -> list[int]:
    """Token ids of the summarization prompt for ``article``; ``len(result) <= max_input_length``."""
    if max_input_length < 1:
        raise UserError(f"--max_input_length must be positive, got {max_input_length}")
    if truncation not in TRUNCATIONS:
        raise UserError(f"unknown truncation {truncation!r}; choose one of {', '.join(TRUNCATIONS)}")
    ids = _encode(tokenizer, article, use_chat_template)
    if len(ids) <= max_input_length:
        return ids
    if truncation == "text" and not use_chat_template:
        return ids[:max_input_length]  # TensorRT-LLM: truncation=True, max_length=N keeps the head
    # Shorten the article by the overflow (plus a margin that grows on each retry, since
    # decoding and re-encoding a cut can merge tokens differently) until the prompt fits.
    article_ids = list(tokenizer.encode(article, add_special_tokens=False))
    margin = 0
    for _ in range(_SHRINK_ATTEMPTS):
        keep = len(article_ids) - (len(ids) - max_input_length) - margin
        if keep <= 0:
            break
        candidate = _encode(tokenizer, tokenizer.decode(article_ids[:keep]), use_chat_template)
        if len(candidate) <= max_input_length:
            return candidate
        margin = 2 * margin + 1
    raise UserError(
        f"--max_input_length {max_input_length} is too short for the prompt's fixed part "
        f"({len(_encode(tokenizer, '', use_chat_template))} tokens); raise it"
    )
