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
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

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
    ) -> str:
        """Generate up to ``max_tokens`` tokens for ``prompt``, printing them as they come."""
        from ..stream_output import StreamPrinter
        from ..text import encode_text
        from ..decoding import generate
        from ..drafting import DraftConfig
        from ..runtime.base import SamplingConfig

        if not isinstance(prompt, str) or not prompt:
            raise UserError("prompt must be a non-empty string")
        if temp < 0:
            raise UserError(f"temp must be >= 0, got {temp}")
        draft = DraftConfig(prompt_lookup_num_tokens=n_draft, max_matching_ngram_size=ngram_max,
                            min_matching_ngram_size=ngram_min, is_use_oldest=False, is_public_pool=False)
        end_id = self.tokenizer.eos_token_id
        if end_id is None:
            raise UserError("the tokenizer defines no end-of-sequence token")
        out = stream if stream is not None else sys.stdout
        printer = StreamPrinter(self.tokenizer, out, color=color, num_sequences=1)
        ids = encode_text(self.tokenizer, prompt, use_chat_template=False)
        result = generate(self.runner, [ids], max_new_tokens=max_tokens, end_id=end_id,
                          sampling=SamplingConfig(float(temp), 0, 1.0, int(seed)), draft=draft, workflow="v2",
                          on_step=printer.on_step, draft_length_policy="full")[0]
        text = printer.finish()[0]
        out.write(f"=== {result.generated_tokens} tokens in {result.steps} steps "
                  f"({result.tokens_per_step:.2f} tokens/step); drafted {result.drafted}, accepted {result.accepted} "
                  f"({100 * result.acceptance_rate:.1f}%) ===\n")
        self.last_result = result
        return text
