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
``temperature``, ``top_k``, ``top_p``, ``prompt_lookup_num_tokens``, ``max_matching_ngram_size``)
come, as in ``model.generate``, from a passed ``generation_config``, then ``model.generation_config``;
any other setting of those configs that would change the tokens (``num_beams=4``,
``no_repeat_ngram_size``, ``suppress_tokens``...) is refused naming it, unless a keyword overrides
it with its neutral value. ``repetition_penalty`` is Hugging Face's (a seen token's logit divided by
it if positive, multiplied if negative; counted over the row's unmasked prompt and its new
tokens). ``streamer`` takes Hugging Face's streamer protocol (``TextStreamer``,
``TextIteratorStreamer``): ``put(prompt ids)``, then ``put`` of the tokens each verification
step accepts (one or more at a time, as in Hugging Face's assisted generation), then ``end()``;
batch size 1, as there.

Errors are one-line exceptions that are also Hugging Face's types: a model that is not a
loaded Llama raises :class:`TypeError`/:class:`ValueError`; a ``model.generate`` keyword this
function does not support (``num_beams=4``, ``return_dict_in_generate=True``, ...) raises
:class:`ValueError` naming it and listing what is supported; a keyword at its neutral value
(``num_beams=1``) is accepted. ``temperature``, ``top_k`` and ``top_p`` are checked as
transformers checks them (a ``ValueError`` out of range, ``temperature=0`` with ``do_sample=True``
included), and passed without ``do_sample=True`` they draw transformers' ``UserWarning`` (they
do nothing under greedy decoding). All are also :class:`~promptlookup.errors.UserError`. The runner is kept on the model (freed with it) and rebuilt only when a call
needs larger limits: the first call pays for fusing the weights, later calls do not.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .errors import UserError

class HFValueError(UserError, ValueError):
    """A bad value, raised as Hugging Face would (a ValueError) and as this project does."""


class HFTypeError(UserError, TypeError):
    """A wrong type, raised as Hugging Face would (a TypeError) and as this project does."""


def _check_sampling(values: dict[str, Any]) -> None:
    """The explicitly passed ``temperature`` (a finite number >= 0), ``top_k`` (an integer >= 0)
    and ``top_p`` (in (0, 1]), as one-line HFValueErrors."""
    for name, v in values.items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if name == "temperature" and not (number and v >= 0):
            raise HFValueError(f"temperature must be a finite number >= 0, got {v!r}")
        if name == "top_k" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise HFValueError(f"top_k must be an integer >= 0 (0: no top-k filter), got {v!r}")
        if name == "top_p" and not (number and 0 < v <= 1):
            raise HFValueError(f"top_p must be in (0, 1], got {v!r}")


# model.generate keywords accepted only at their neutral value (what they would change is not supported)
NEUTRAL_KEYWORDS: dict[str, Any] = {
    "num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "return_dict_in_generate": False,
    "output_scores": False, "output_logits": False, "output_attentions": False, "output_hidden_states": False,
    "use_cache": True, "penalty_alpha": None, "assistant_model": None,
    "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "length_penalty": 1.0, "min_new_tokens": None,
    "min_length": 0, "bad_words_ids": None, "force_words_ids": None, "logits_processor": None,
    "stopping_criteria": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None,
    "diversity_penalty": 0.0, "constraints": None, "renormalize_logits": False,
}
ALSO_NEUTRAL: dict[str, Any] = {"min_new_tokens": 0, "min_p": 0.0, "penalty_alpha": 0.0}  # off, as much as None
SUPPORTED_KEYWORDS = ("attention_mask", "prompt_lookup_num_tokens", "max_matching_ngram_size", "max_new_tokens",
                      "max_length", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
                      "eos_token_id", "pad_token_id", "streamer", "seed", "generation_config")
# GenerationConfig fields that cannot change the tokens here: other roles' token ids, assistant-model knobs
# (no assistant model is run), beam-only knobs (num_beams is checked), caching and compilation (speed only)
INERT_CONFIG_FIELDS = frozenset({
    "bos_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
    "target_lookbehind", "assistant_early_exit", "early_stopping", "low_memory", "cache_implementation",
    "cache_config", "max_cache_len", "compile_config", "disable_compile", "prefill_chunk_size",
    "return_legacy_cache",  # the type of a returned cache (with return_dict_in_generate, checked)
})
# Their defaults, which a config saved whole (transformers 4.x, use_diff=False) holds
CONFIG_NEUTRAL: dict[str, Any] = {"encoder_no_repeat_ngram_size": 0, "remove_invalid_values": False,
                                  "token_healing": False}

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
        raise HFValueError(f"input plus max_new_tokens is {seq_len} tokens, more than the model's "
                        f"max_position_embeddings {max_pos}; lower max_new_tokens")
    limits = EngineLimits(max_batch_size=batch, max_input_len=seq_len - 1, max_seq_len=seq_len,
                          max_draft_len=k, vocab_size=int(cfg.vocab_size))
    runner = TorchRunner(model, limits, tokens_per_block=32, max_tokens_in_paged_kv_cache=batch * (seq_len + 32),
                         kv_cache_enable_block_reuse=False)
    model.__dict__[_ATTR] = _RunnerSlot(runner)
    return runner


def check_model(model: Any) -> None:
    """Refuse anything but a loaded Llama (a ``torch.nn.Module`` whose config has model_type 'llama')."""
    if not isinstance(model, torch.nn.Module):
        hint = f"; load it first: AutoModelForCausalLM.from_pretrained({model!r})" if isinstance(model, str) else ""
        raise HFTypeError(f"model must be a loaded Llama model (a transformers LlamaForCausalLM), "
                          f"got {type(model).__name__} {model!r:.60}{hint}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type != "llama":
        raise HFValueError(f"model is a {type(model).__name__} with model_type {model_type!r}; only Llama models "
                           f"(model_type 'llama') run on promptlookup's runtime")


def check_keywords(extra: dict[str, Any]) -> None:
    """Refuse ``model.generate`` keywords not supported here, naming them and what is supported."""
    for name, value in extra.items():
        if name in NEUTRAL_KEYWORDS and _same(value, NEUTRAL_KEYWORDS[name]):
            continue
        if name in ALSO_NEUTRAL and _same(value, ALSO_NEUTRAL[name]):
            continue
        what = f"{name}={_short(value)}" if name in NEUTRAL_KEYWORDS else f"keyword {name!r}"
        also = f" or {ALSO_NEUTRAL[name]!r}" if name in ALSO_NEUTRAL else ""
        neutral = f" (only {name}={NEUTRAL_KEYWORDS[name]!r}{also})" if name in NEUTRAL_KEYWORDS else ""
        raise HFValueError(f"promptlookup.hf.generate does not support {what}{neutral}; supported keywords: "
                           f"{', '.join(SUPPORTED_KEYWORDS)}")


def check_configs(configs: list[tuple[str, Any]], passed: set[str]) -> None:
    """Refuse a setting of ``configs`` (``(name, GenerationConfig)``, highest priority first) that is not
    supported here and not overridden by a keyword in ``passed``: it would change ``model.generate``'s
    tokens, so it is never silently dropped. Unset (``None``) and neutral values pass."""
    seen: set[str] = set()
    for where, config in configs:
        for name, value in config.to_dict().items():
            if name in seen or value is None or (name == "generation_kwargs" and value == {}):  # {}: its default
                continue
            seen.add(name)
            if name in passed or name in SUPPORTED_KEYWORDS or name in INERT_CONFIG_FIELDS:
                continue
            neutral = NEUTRAL_KEYWORDS.get(name, CONFIG_NEUTRAL.get(name))
            if (neutral is not None and _same(value, neutral)) or (name in ALSO_NEUTRAL
                                                                  and _same(value, ALSO_NEUTRAL[name])):
                continue
            # a keyword overrides it only where generate takes one (CONFIG_NEUTRAL's are config-only)
            fix = (f"pass {name}={neutral!r} to override it" if neutral is not None and name in NEUTRAL_KEYWORDS
                   else f"set {where}.{name} = {neutral!r}")
            raise HFValueError(f"{where}.{name} is {_short(value)}, which promptlookup.hf.generate does not support; "
                               f"{fix}")


def _short(value: Any) -> str:
    """``repr(value)`` on one line, at most 40 characters."""
    return " ".join(repr(value).split())[:40]


def _same(value: Any, neutral: Any) -> bool:
    """Whether ``value`` is the neutral value itself (``False`` is not ``0``, ``None`` only ``None``)."""
    if neutral is None or isinstance(neutral, bool):
        return value is neutral
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == neutral


class _StreamerSink:
    """Feeds Hugging Face's streamer protocol from this runtime's step events (one sequence)."""

    def __init__(self, streamer: Any) -> None:
        if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
            raise HFTypeError(f"streamer must have put() and end() (Hugging Face's BaseStreamer), "
                              f"got {type(streamer).__name__}")
        self.streamer = streamer

    def __call__(self, event: Any) -> None:
        if event.tokens:
            self.streamer.put(torch.tensor([list(event.tokens)], dtype=torch.long))


def _token_ids(value: Any, name: str, many: bool) -> list[int]:
    """``value`` (an id, a list of ids or a tensor of them; ``None``: none) as a list of token
    ids; more than one only where ``many`` (``eos_token_id``: every one ends a row, as in
    transformers)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    ids = list(value) if isinstance(value, (list, tuple)) else [value]
    if not ids or (len(ids) > 1 and not many):
        raise HFValueError(f"{name} must be one token id, got {value!r}")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise HFValueError(f"{name} must be a token id (an integer >= 0){' or a list of them' if many else ''}, "
                               f"got {value!r}")
    return list(dict.fromkeys(ids))


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int | None = None,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    repetition_penalty: float | None = None,
    streamer: Any = None,
    seed: int = 0,
    generation_config: Any = None,
    **unsupported: Any,
) -> torch.Tensor:
    """``model.generate(input_ids, prompt_lookup_num_tokens=..., ...)`` on this project's runtime.

    Cost: one TorchRunner per model (weights fused once), then V2 single-call decoding.
    """
    from .decoding.single_call import run_single_call
    from .drafting import DraftConfig, make_drafter
    from .runtime.base import SamplingConfig

    check_model(model)
    check_keywords(unsupported)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        raise HFValueError("input_ids must be a 2-D LongTensor [batch, length]")
    if generation_config is not None and not callable(getattr(generation_config, "to_dict", None)):
        raise HFTypeError(f"generation_config must be a transformers GenerationConfig, got "
                          f"{type(generation_config).__name__}")
    # transformers' priority: keywords, then generation_config, then model.generation_config, then its defaults
    configs = [(w, c) for w, c in (("generation_config", generation_config),
                                   ("model.generation_config", getattr(model, "generation_config", None)))
               if c is not None]
    given = {"max_new_tokens": max_new_tokens, "max_length": max_length, "do_sample": do_sample,
             "temperature": temperature, "top_k": top_k, "top_p": top_p, "eos_token_id": eos_token_id,
             "pad_token_id": pad_token_id, "repetition_penalty": repetition_penalty,
             "prompt_lookup_num_tokens": prompt_lookup_num_tokens, "max_matching_ngram_size": max_matching_ngram_size}
    check_configs(configs, {k for k, v in given.items() if v is not None} | set(unsupported))

    def default(value: Any, name: str, fallback: Any) -> Any:
        if value is not None:
            return value
        got = next((getattr(c, name) for _, c in configs if getattr(c, name, None) is not None), None)
        return got if got is not None else fallback

    for name, value in (("max_new_tokens", max_new_tokens), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise HFValueError(f"{name} must be an integer, got {value!r:.40}")
    batch, width = input_ids.shape
    if max_new_tokens is None:  # transformers' rule: max_new_tokens, else max_length, else 20 new tokens
        configured = default(None, "max_new_tokens", None)
        if max_length is None and configured is not None:
            max_new_tokens = int(configured)
        elif default(max_length, "max_length", None) is not None:
            max_new_tokens = int(default(max_length, "max_length", None)) - width
            if max_new_tokens < 1:
                raise HFValueError(f"max_length {max_new_tokens + width} leaves no room after the {width}-token "
                                   "input; raise it, or pass max_new_tokens")
        else:
            max_new_tokens = DEFAULT_NEW_TOKENS
    if max_new_tokens < 1:
        raise HFValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    prompt_lookup_num_tokens = default(prompt_lookup_num_tokens, "prompt_lookup_num_tokens", 10)
    max_matching_ngram_size = default(max_matching_ngram_size, "max_matching_ngram_size", 2)
    for name, value in (("prompt_lookup_num_tokens", prompt_lookup_num_tokens),
                        ("max_matching_ngram_size", max_matching_ngram_size), ("seed", seed)):
        least = 0 if name == "seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise HFValueError(f"{name} must be an integer >= {least}, got {value!r}")
    end_ids = _token_ids(default(eos_token_id, "eos_token_id", None), "eos_token_id", many=True)
    end_id, more_ends = (end_ids[0], tuple(end_ids[1:])) if end_ids else (None, ())
    pads = _token_ids(default(pad_token_id, "pad_token_id", None), "pad_token_id", many=False)
    pad_id = pads[0] if pads else end_id if end_id is not None else 0  # transformers: the first end token
    do_sample = bool(default(do_sample, "do_sample", False))
    penalty = default(repetition_penalty, "repetition_penalty", 1.0)
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not (math.isfinite(penalty)
                                                                                  and penalty > 0):
        raise HFValueError(f"repetition_penalty must be a finite number > 0, got {penalty!r}")
    explicit = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if v is not None}
    _check_sampling(explicit)
    if explicit and not do_sample:  # transformers warns the same way, and decodes greedily
        warnings.warn(f"do_sample is False, so {', '.join(f'{k}={v!r}' for k, v in explicit.items())} "
                      f"{'has' if len(explicit) == 1 else 'have'} no effect: greedy decoding; pass do_sample=True to "
                      "sample", UserWarning, stacklevel=2)
    sampling = SamplingConfig(repetition_penalty=float(penalty), stop_token_ids=more_ends)
    if do_sample:
        t = float(default(temperature, "temperature", 1.0))
        if t <= 0:
            raise HFValueError(f"temperature has to be a strictly positive float with do_sample=True, got {t}; "
                               "pass do_sample=False for greedy decoding")
        sampling = SamplingConfig(t, int(default(top_k, "top_k", 50)),
                                  float(default(top_p, "top_p", 1.0)), int(seed), repetition_penalty=float(penalty),
                                  stop_token_ids=more_ends)
    sink = None
    if streamer is not None:
        if input_ids.shape[0] != 1:
            raise HFValueError(f"streamer supports batch size 1 (as Hugging Face's streamers), "
                               f"got a batch of {input_ids.shape[0]}")
        sink = _StreamerSink(streamer)

    rows = input_ids.tolist()
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else \
                type(attention_mask).__name__
            raise HFValueError(f"attention_mask must be a tensor shaped as input_ids {tuple(input_ids.shape)}, "
                               f"got {shape}")
        mask = attention_mask.tolist()
        prompts = [[t for t, m in zip(row, ms) if m] for row, ms in zip(rows, mask)]
    else:
        prompts = [list(row) for row in rows]
    if any(not p for p in prompts):
        raise HFValueError("a row of input_ids has no unmasked token")
    vocab = int(model.config.vocab_size)
    bad = next((t for p in prompts for t in p if not 0 <= t < vocab), None)
    if bad is not None:
        raise HFValueError(f"input_ids holds token id {bad}, outside the model's vocabulary (0..{vocab - 1})")

    longest = max(len(p) for p in prompts)
    runner = _runner_for(model, batch, longest + max_new_tokens + 1, prompt_lookup_num_tokens)
    drafter = make_drafter(DraftConfig(prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                                       max_matching_ngram_size=max_matching_ngram_size, is_public_pool=False))
    if sink is not None:
        sink.streamer.put(input_ids.detach().cpu())
    with torch.inference_mode():
        results = run_single_call(runner, prompts, max_new_tokens=max_new_tokens,
                                  end_id=end_id if end_id is not None else -1, drafter=drafter, sampling=sampling,
                                  on_step=sink)
    if sink is not None:
        sink.streamer.end()
    new = max(len(r.output_ids) for r in results)
    out = [row + r.output_ids + [pad_id] * (new - len(r.output_ids)) for row, r in zip(rows, results)]
    return torch.tensor(out, dtype=input_ids.dtype, device=input_ids.device)
