"""MLX's prompt-lookup demo interface: ``PromptLookupDecoder(path).prompt_lookup(...)``.

    decoder = PromptLookupDecoder("engine_dir")   # or a Hugging Face / GGUF model path
    text = decoder.prompt_lookup(prompt, max_tokens=200, n_draft=10, ngram_max=3, ngram_min=1,
                                 temp=0.0, seed=0, color=True)

MLX's names map to this project's drafter: ``n_draft`` is the draft length k,
``ngram_max`` the largest n-gram matched, ``ngram_min`` the smallest
(``min_matching_ngram_size``). As in MLX's demo, the most recent earlier occurrence of
the longest matching n-gram is used (the pool with ``is_use_oldest=False``, private to the
request), the text is printed as it is accepted (accepted draft tokens highlighted with
``color``), followed by a statistics line; the generated text is returned and
:attr:`last_result` keeps the token-level result.

Errors are :class:`~promptlookup.errors.UserError` in one line, naming MLX's parameters
(``n_draft``, ``ngram_max``, ``ngram_min``, ``max_tokens``, ``temp``, ``seed``), checked
before anything runs.

As a script, like MLX's prompt-lookup example (``pld-mlx-decoder`` once installed)::

    python -m promptlookup.cli.mlx_decoder --prompt "..." --max-tokens 100 --n-draft 10 \
        --ngram-max 3 --ngram-min 1 --temp 0.0 --seed 0 --color [--model-name ENGINE_OR_MODEL]

Bad input is one line on stderr and exit code 2.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Callable, TextIO

from ..runtime.results import SequenceResult
from ..errors import UserError


class PromptLookupDecoder:
    """A loaded model for MLX-style prompt lookup; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                 device: str | None = None) -> None:
        from ..engine.load import load_runner
        from ..runtime import load_tokenizer
        from .model_cache import resolve_engine

        self.engine_dir = resolve_engine(path, cache_dir=cache_dir)
        self.tokenizer = load_tokenizer(self.engine_dir)
        self.runner = load_runner(self.engine_dir, device=device)
        self.last_result: SequenceResult | None = None

    def prompt_lookup(
        self,
        prompt: str,
        max_tokens: int = 100,
        n_draft: int = 10,
        ngram_max: int = 3,
        ngram_min: int = 1,
        temp: float = 0.0,
        seed: int = 0,
        color: bool = False,
        stream: TextIO | None = None,
        _name: Callable[[str], str] | None = None,
    ) -> str:
        """Generate up to ``max_tokens`` tokens for ``prompt``, printing them as they come.
        Cost: one encode, then V2 single-call decoding with a private n-gram pool."""
        from ..stream_output import StreamPrinter
        from ..decoding import generate
        from ..drafting import DraftConfig
        from ..runtime.base import SamplingConfig

        ids = self.check(prompt, max_tokens=max_tokens, n_draft=n_draft, ngram_max=ngram_max, ngram_min=ngram_min,
                         temp=temp, seed=seed, _name=_name)
        draft = DraftConfig(prompt_lookup_num_tokens=n_draft, max_matching_ngram_size=ngram_max,
                            min_matching_ngram_size=ngram_min, is_use_oldest=False, is_public_pool=False)
        end_id = self.tokenizer.eos_token_id
        out = stream if stream is not None else sys.stdout
        printer = StreamPrinter(self.tokenizer, out, color=color, num_sequences=1)
        result = generate(self.runner, [ids], max_new_tokens=max_tokens, end_id=end_id,
                          sampling=SamplingConfig(float(temp), 0, 1.0, int(seed)), draft=draft, workflow="v2",
                          on_step=printer.on_step, draft_length_policy="full")[0]
        text = printer.finish()[0]
        out.write(f"=== {result.generated_tokens} tokens in {result.steps} steps "
                  f"({result.tokens_per_step:.2f} tokens/step); drafted {result.drafted}, accepted {result.accepted} "
                  f"({100 * result.acceptance_rate:.1f}%) ===\n")
        self.last_result = result
        return text


    def check(self, prompt: str, *, max_tokens: int = 100, n_draft: int = 10, ngram_max: int = 3, ngram_min: int = 1,
              temp: float = 0.0, seed: int = 0, _name: Callable[[str], str] | None = None) -> list[int]:
        """Refuse what :meth:`prompt_lookup` would refuse (every value, the engine's limits, a
        tokenizer without an end token), printing nothing; return the prompt's token ids.
        Cost: one encode."""
        from ..text import encode_text

        check_arguments(prompt, max_tokens=max_tokens, n_draft=n_draft, ngram_max=ngram_max, ngram_min=ngram_min,
                        temp=temp, seed=seed, max_draft_len=self.runner.limits.max_draft_len, name=_name or _param)
        if self.tokenizer.eos_token_id is None:
            raise UserError("the tokenizer defines no end-of-sequence token")
        ids = encode_text(self.tokenizer, prompt, use_chat_template=False)
        check_length(len(ids), max_tokens, self.runner.limits, _name or _param)
        return ids


def _param(name: str) -> str:
    return name



def check_arguments(prompt: Any, *, max_tokens: Any, n_draft: Any, ngram_max: Any, ngram_min: Any, temp: Any,
                    seed: Any, max_draft_len: int, name: Callable[[str], str] = _param) -> None:
    """Refuse bad arguments in one line each, naming MLX's parameters (no other API's);
    ``name`` spells them (the script passes its flags' spelling, ``--n-draft``)."""
    if not isinstance(prompt, str) or not prompt:
        raise UserError(f"{name('prompt')} must be a non-empty string")
    for key, value in (("max_tokens", max_tokens), ("n_draft", n_draft), ("ngram_max", ngram_max),
                       ("ngram_min", ngram_min)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name(key)} must be a positive integer, got {value!r}")
    if ngram_min > ngram_max:
        raise UserError(f"{name('ngram_min')} {ngram_min} exceeds {name('ngram_max')} {ngram_max}; "
                        "no n-gram could ever match")
    if n_draft > max_draft_len:
        raise UserError(f"{name('n_draft')} {n_draft} exceeds the engine's max_draft_len {max_draft_len}; lower "
                        f"{name('n_draft')} or rebuild the engine with --max_draft_len {n_draft}")
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not math.isfinite(temp) or temp < 0:
        raise UserError(f"{name('temp')} must be a finite number >= 0, got {temp!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UserError(f"{name('seed')} must be a non-negative integer, got {seed!r}")


def check_length(prompt_tokens: int, max_tokens: int, limits: Any, name: Callable[[str], str] = _param) -> None:
    """Refuse a prompt the engine cannot hold, or no room for ``max_tokens`` after it."""
    if prompt_tokens > limits.max_input_len:
        raise UserError(f"{name('prompt')} has {prompt_tokens} tokens, more than the engine's max_input_len "
                        f"{limits.max_input_len}; shorten it")
    if prompt_tokens + max_tokens > limits.max_seq_len:
        raise UserError(f"{name('max_tokens')} {max_tokens} after a {prompt_tokens}-token prompt exceeds the engine's "
                        f"max_seq_len {limits.max_seq_len}; lower {name('max_tokens')} to "
                        f"{limits.max_seq_len - prompt_tokens} or less")
