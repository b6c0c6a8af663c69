"""Hugging Face's one flag: ``promptlookup.hf.generate(model, input_ids, prompt_lookup_num_tokens=10)``.

For a user who has a ``LlamaForCausalLM`` in memory and would write
``model.generate(input_ids, prompt_lookup_num_tokens=10, ...)``. The model's own weights
run through this project's runtime (:class:`~promptlookup.runtime.torch_runner.TorchRunner`:
paged KV cache, batched draft verification) with the n-gram drafter; nothing is
converted or built.

Returns what ``model.generate`` returns for the same arguments: a ``LongTensor`` of
``[batch, input_len + new]`` holding each input row as given followed by its new tokens,
rows that finished early padded with ``pad_token_id``. Greedy (``do_sample=False``) output
is token for token ``model.generate``'s. Sampling is exact (the same distribution) but
draws from this project's seeded stream (``seed``), not torch's global generator.

Unlike Hugging Face's prompt lookup, batches with padding are accepted: pass
``attention_mask`` (left or right padding); each row's prompt is its unmasked tokens, and
the new tokens follow the row as given (as ``model.generate`` lays out left-padded rows).

Defaults (``max_new_tokens``/``max_length``, ``eos_token_id``, ``pad_token_id``,
``temperature``, ``top_k``, ``top_p``) come from ``model.generation_config`` as in
``model.generate``. The runner is kept on the model (freed with it) and rebuilt only when a call
needs larger limits: the first call pays for fusing the weights, later calls do not.
"""
from __future__ import annotations

from typing import Any

import torch

from .errors import UserError

DEFAULT_NEW_TOKENS = 20  # transformers' default when no length is set anywhere
_ATTR = "_promptlookup_runner"  # the runner rides on the model: freed with it (a plain reference cycle)


class _RunnerSlot:
    """Holds the cached runner on the model; copies and pickles of the model get an empty slot."""

    def __init__(self, runner: Any = None) -> None:
        self.runner = runner

    def __reduce__(self):
        return (_RunnerSlot, ())


def _runner_for(model: torch.nn.Module, batch: int, seq_len: int, k: int):
    """A TorchRunner over ``model`` whose limits fit this call (cached per model)."""
    from .runtime.base import EngineLimits
    from .runtime.torch_runner import TorchRunner

    slot = model.__dict__.get(_ATTR)
    runner = slot.runner if slot is not None else None
    if runner is not None:
        lim = runner.limits
        if lim.max_batch_size >= batch and lim.max_seq_len >= seq_len and lim.max_draft_len >= k:
            return runner
    cfg = model.config
    max_pos = int(getattr(cfg, "max_position_embeddings", seq_len))
    if seq_len > max_pos:
        raise UserError(f"input plus max_new_tokens is {seq_len} tokens, more than the model's "
                        f"max_position_embeddings {max_pos}; lower max_new_tokens")
    limits = EngineLimits(max_batch_size=batch, max_input_len=seq_len - 1, max_seq_len=seq_len,
                          max_draft_len=k, vocab_size=int(cfg.vocab_size))
    runner = TorchRunner(model, limits, tokens_per_block=32, max_tokens_in_paged_kv_cache=batch * (seq_len + 32),
                         kv_cache_enable_block_reuse=False)
    model.__dict__[_ATTR] = _RunnerSlot(runner)
    return runner


def _single(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise UserError(f"{name} {list(value)}: only one end token is supported; pass eos_token_id=<one id>")
        value = value[0]
    if isinstance(value, torch.Tensor):
        value = value.item()
    return int(value)


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    prompt_lookup_num_tokens: int = 10,
    max_matching_ngram_size: int = 2,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """``model.generate(input_ids, prompt_lookup_num_tokens=..., ...)`` on this project's runtime.

    Cost: one TorchRunner per model (weights fused once), then V2 single-call decoding.
    """
    from .decoding.single_call import run_single_call
    from .drafting import DraftConfig, make_drafter
    from .runtime.base import SamplingConfig

    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise UserError("input_ids must be a 2-D LongTensor [batch, length]")
    gen = getattr(model, "generation_config", None)

    def default(value: Any, name: str, fallback: Any) -> Any:
        if value is not None:
            return value
        got = getattr(gen, name, None) if gen is not None else None
        return got if got is not None else fallback

    batch, width = input_ids.shape
    if max_new_tokens is None:  # transformers' rule: max_new_tokens, else max_length, else 20 new tokens
        if max_length is None and getattr(gen, "max_new_tokens", None) is not None:
            max_new_tokens = int(gen.max_new_tokens)
        elif default(max_length, "max_length", None) is not None:
            max_new_tokens = int(default(max_length, "max_length", None)) - width
        else:
            max_new_tokens = DEFAULT_NEW_TOKENS
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not isinstance(prompt_lookup_num_tokens, int) or prompt_lookup_num_tokens < 1:
        raise UserError(f"prompt_lookup_num_tokens must be a positive integer, got {prompt_lookup_num_tokens!r}")
    end_id = _single(default(eos_token_id, "eos_token_id", None), "eos_token_id")
    pad_id = _single(default(pad_token_id, "pad_token_id", None), "pad_token_id")
    if pad_id is None:
        pad_id = end_id if end_id is not None else 0
    do_sample = bool(default(do_sample, "do_sample", False))
    sampling = SamplingConfig()
    if do_sample:
        sampling = SamplingConfig(float(default(temperature, "temperature", 1.0)), int(default(top_k, "top_k", 50)),
                                  float(default(top_p, "top_p", 1.0)), int(seed))

    rows = input_ids.tolist()
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise UserError(f"attention_mask {tuple(attention_mask.shape)} does not match input_ids "
                            f"{tuple(input_ids.shape)}")
        mask = attention_mask.tolist()
        prompts = [[t for t, m in zip(row, ms) if m] for row, ms in zip(rows, mask)]
    else:
        prompts = [list(row) for row in rows]
    if any(not p for p in prompts):
        raise UserError("a row of input_ids has no unmasked token")

    longest = max(len(p) for p in prompts)
    runner = _runner_for(model, batch, longest + max_new_tokens + 1, prompt_lookup_num_tokens)
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                                       max_matching_ngram_size=max_matching_ngram_size, is_public_pool=False))
    with torch.inference_mode():
        results = run_single_call(runner, prompts, max_new_tokens=max_new_tokens,
                                  end_id=end_id if end_id is not None else -1, drafter=drafter, sampling=sampling)
    new = max(len(r.output_ids) for r in results)
    out = [row + r.output_ids + [pad_id] * (new - len(r.output_ids)) for row, r in zip(rows, results)]
    return torch.tensor(out, dtype=input_ids.dtype, device=input_ids.device)
