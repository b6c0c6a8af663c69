"""The LLM API's inputs, checked and normalized before anything is submitted.

Every refusal is one line that names the API's own parameter (``temperature``,
``max_tokens``, ``end_id``, ``prompts``, ``messages``...), never a command-line flag, and
is both a :class:`~promptlookup.errors.UserError` (so scripts report it as every other
bad input) and the built-in class Python code expects: :class:`ParamTypeError` is a
``TypeError`` (a value of the wrong type), :class:`ParamValueError` a ``ValueError`` (the
right type, out of range). The same rules as ``run.py``'s flags: numbers finite, ``top_p``
in (0, 1], ``repetition_penalty`` > 0, ``end_id`` inside the engine's vocabulary.

Also here: the range of ``logprobs`` (:func:`check_logprobs`), chat messages with
content parts (:func:`chat_conversations`) and the documented finish reasons
(:func:`api_finish_reason`).
Cost: O(size of the inputs), once per call.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

from ..errors import UserError

# The documented finish reasons (vLLM's): the end token or a stop string, max_tokens, abort().
FINISH_REASONS = ("stop", "length", "abort")
_FROM_SCHEDULER = {"cancelled": "abort"}  # the scheduler's name for a cancelled request


class ParamTypeError(UserError, TypeError):
    """An LLM API argument of the wrong type (one line, naming the parameter)."""


class ParamValueError(UserError, ValueError):
    """An LLM API argument of the right type but an unusable value (one line, naming it)."""


def _type_name(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _got(value: object) -> str:
    """A wrong-typed value for a message: its type and repr (``None`` once)."""
    return "None" if value is None else f"{type(value).__name__} {value!r}"


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` (numpy integers included; ``bool`` refused), at least ``minimum``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ParamTypeError(f"{name} must be an integer >= {minimum}, got {_got(value)}")
    if value < minimum:
        raise ParamValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(name: str, value: object, rule: str, ok: Any) -> float:
    """``value`` as a finite ``float`` (ints and numpy floats included; ``bool``, nan and inf
    refused) for which ``ok(value)`` holds; ``rule`` describes the range in the message."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ParamTypeError(f"{name} must be a number{' ' + rule if rule else ''}, got {_got(value)}")
    v = float(value)
    if not math.isfinite(v) or not ok(v):
        raise ParamValueError(f"{name} must be a finite number{' ' + rule if rule else ''}, got {v!r}")
    return v


def check_logprobs(value: object) -> int | None:
    """``SamplingParams.logprobs``: ``None`` (none), or how many top alternatives to return with
    each token's log-probability, in [0, 20] (OpenAI's bound; the engine computes them,
    :mod:`promptlookup.runtime.logprobs`)."""
    from ..runtime.logprobs import MAX_TOP_LOGPROBS

    if value is None:
        return None
    n = check_int("logprobs", value, 0)
    if n > MAX_TOP_LOGPROBS:
        raise ParamValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {n}")
    return n


def check_vocab(params: Any, end_id: int, vocab_size: int) -> None:
    """The token ids of a request's settings lie in the engine's vocabulary: ``end_id`` (else
    generation could never stop on it; not checked with ``ignore_eos``), ``stop_token_ids`` and
    ``logit_bias``'s keys."""
    if not params.ignore_eos and not 0 <= end_id < vocab_size:
        raise ParamValueError(f"end_id {end_id} is outside the engine's vocabulary (0..{vocab_size - 1}); pass a "
                              "token id in that range, or end_id=None for the tokenizer's end-of-sequence token")
    outside = [t for t in params.stop_token_ids or () if t >= vocab_size]
    if outside:
        raise ParamValueError(f"stop_token_ids has token id {outside[0]}, outside the engine's vocabulary "
                              f"(0..{vocab_size - 1})")
    outside = [t for t, _ in params.logit_bias or () if t >= vocab_size]
    if outside:
        raise ParamValueError(f"logit_bias has token id {outside[0]}, outside the engine's vocabulary "
                              f"(0..{vocab_size - 1})")


def check_prompt_ids(where: str, ids: Sequence[int], max_tokens: int, limits: Any) -> None:
    """A request's prompt (``where`` names it: ``prompts[2]``) fits the engine: at least one token,
    every id in the vocabulary, at most ``max_input_len`` tokens, and room for ``max_tokens`` more
    within ``max_seq_len`` (the runtime's rules, named by this API's parameters)."""
    if not ids:
        raise ParamValueError(f"{where} has no tokens; give a prompt of at least one token")
    bad = next((t for t in ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise ParamValueError(f"{where} has token id {bad}, outside the engine's vocabulary "
                              f"(0..{limits.vocab_size - 1})")
    if len(ids) > limits.max_input_len:
        raise ParamValueError(f"{where} has {len(ids)} tokens, more than the engine's max_input_len "
                              f"{limits.max_input_len}; shorten it (or rebuild the engine with a larger max_input_len)")
    room = limits.max_seq_len - len(ids)
    if max_tokens > room:
        raise ParamValueError(f"{where} ({len(ids)} token{'s' if len(ids) > 1 else ''}) plus max_tokens={max_tokens} "
                              f"exceeds the engine's max_seq_len {limits.max_seq_len}; pass max_tokens <= {room}")


def api_finish_reason(reason: str | None) -> str | None:
    """The documented name of a scheduler finish reason (``cancelled`` -> ``abort``)."""
    return _FROM_SCHEDULER.get(reason, reason) if reason is not None else None


def refuse_keywords(method: str, unknown: Mapping[str, object], accepted: str) -> None:
    """One line for keywords ``method`` does not take: SamplingParams fields go there."""
    if not unknown:
        return
    from .configs import SamplingParams

    names = sorted(unknown)
    fields = [n for n in names if n in SamplingParams.__dataclass_fields__]
    if fields:
        given = ", ".join(f"{n}={unknown[n]!r}" for n in fields)
        raise ParamTypeError(f"{method}() got {', '.join(fields)}: {'these are' if len(fields) > 1 else 'it is a'} "
                             f"SamplingParams field{'s' if len(fields) > 1 else ''}; pass "
                             f"sampling_params=SamplingParams({given})")
    raise ParamTypeError(f"{method}() got unexpected keyword{'s' if len(names) > 1 else ''} {', '.join(names)}; "
                         f"it takes {accepted}")


def sampling_params_list(value: object, count: int) -> list[Any]:
    """One :class:`~.configs.SamplingParams` per prompt from ``None`` (the defaults), one
    ``SamplingParams`` or a dict of its fields (for every prompt), or a list of those (one per
    prompt)."""
    from .configs import SamplingParams

    def one(v: object, where: str) -> SamplingParams:
        if isinstance(v, SamplingParams):
            return v
        if isinstance(v, Mapping):
            bad = sorted(str(k) for k in v if k not in SamplingParams.__dataclass_fields__)
            if bad:
                raise ParamTypeError(f"{where}: {', '.join(bad)} {'are not SamplingParams fields' if len(bad) > 1 else 'is not a SamplingParams field'}; "
                                     f"its fields are {', '.join(SamplingParams.__dataclass_fields__)}")
            return SamplingParams(**v)
        raise ParamTypeError(f"{where} must be a SamplingParams or a dict of its fields (e.g. {{'max_tokens': 4}}), "
                             f"got {_type_name(v)}")

    if value is None:
        return [SamplingParams()] * count
    if isinstance(value, (SamplingParams, Mapping)):
        return [one(value, "sampling_params")] * count
    if isinstance(value, (list, tuple)):
        params = [one(v, f"sampling_params[{i}]") for i, v in enumerate(value)]
        if len(params) != count:
            raise ParamValueError(f"sampling_params: got {len(params)} SamplingParams for {count} prompts; "
                                  "give one, or one per prompt")
        return params
    return [one(value, "sampling_params")]


def _is_token_ids(value: object) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)


_PROMPT_KEYS = ("prompt", "prompt_token_ids")  # TextPrompt / TokensPrompt (TensorRT-LLM's, vLLM's)


def _prompt_dict(p: Mapping[Any, Any], where: str) -> str | list[int]:
    """``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` as the text or the ids; any other key
    (``multi_modal_data``...) is refused, never dropped."""
    keys = sorted(str(k) for k in p)
    if len(keys) != 1 or keys[0] not in _PROMPT_KEYS:
        raise ParamValueError(f"{where}: a prompt dict takes exactly one of 'prompt' (text) or 'prompt_token_ids' "
                              f"(token ids), got keys {', '.join(keys) or 'none'}")
    value = p[keys[0]]
    if keys[0] == "prompt" and isinstance(value, str):
        return value
    if keys[0] == "prompt_token_ids" and _is_token_ids(value):
        return [int(t) for t in value]
    raise ParamTypeError(f"{where}['{keys[0]}'] must be {'a string' if keys[0] == 'prompt' else 'a non-empty list of token ids'}, "
                         f"got {_type_name(value)}")


def prompt_list(inputs: object) -> tuple[list[str | list[int]], bool]:
    """``(prompts, single)``: a string, a token-id list or a prompt dict (``{"prompt": text}``,
    ``{"prompt_token_ids": ids}``) is one prompt; a list of those is a batch. Anything else
    (``None``, a number, a list mixing other things) is refused."""
    usage = "a string, a list of token ids, a {'prompt': ...} or {'prompt_token_ids': ...} dict, or a list of those"
    if isinstance(inputs, str):
        return [inputs], True
    if _is_token_ids(inputs):
        return [[int(t) for t in inputs]], True  # type: ignore[union-attr]
    if isinstance(inputs, Mapping):
        return [_prompt_dict(inputs, "prompts")], True
    if not isinstance(inputs, (list, tuple)):
        raise ParamTypeError(f"prompts (inputs) must be {usage}; got {_type_name(inputs)}")
    out: list[str | list[int]] = []
    for i, p in enumerate(inputs):
        if isinstance(p, str):
            out.append(p)
        elif _is_token_ids(p):
            out.append([int(t) for t in p])
        elif isinstance(p, Mapping):
            out.append(_prompt_dict(p, f"prompts[{i}]"))
        elif isinstance(p, (list, tuple)) and not p:
            raise ParamValueError(f"prompts[{i}] is an empty token list; a prompt needs at least one token")
        else:
            raise ParamTypeError(f"prompts[{i}] must be a string, a list of token ids or a prompt dict, got "
                                 f"{_type_name(p)}")
    return out, False


def _content(content: object, role: str, where: str) -> str:
    """A message's content as text: a string, a list of text parts (joined by newlines, as
    vLLM and trtllm-serve join them), or ``None`` on an assistant turn (empty)."""
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text" or not isinstance(part.get("text"), str):  # type: ignore[union-attr]
                what = f"part type {kind!r}" if isinstance(kind, str) else f"a {_type_name(part)}"
                raise ParamValueError(f"{where}.content[{j}]: {what} is not supported; only text parts "
                                      "({'type': 'text', 'text': ...}) are")
            texts.append(part["text"])  # type: ignore[index]
        return "\n".join(texts)
    raise ParamTypeError(f"{where}.content must be a string or a list of text parts, got {_type_name(content)}")


def _conversation(messages: Sequence[object], where: str) -> list[dict[str, str]]:
    if not messages:
        raise ParamValueError(f"{where} is an empty conversation; give at least one message")
    out = []
    for i, m in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(m, Mapping):
            raise ParamTypeError(f"{at} must be a dict with 'role' and 'content', got {_type_name(m)}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ParamValueError(f"{at} needs a 'role' string (system, user or assistant), got {role!r}")
        if "content" not in m:
            raise ParamValueError(f"{at} has no 'content'")
        extra = sorted(str(k) for k in m if k not in ("role", "content", "name"))
        if extra:
            raise ParamValueError(f"{at}: {', '.join(extra)} not supported; a message has role and content")
        msg = {"role": role, "content": _content(m["content"], role, at)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]  # type: ignore[assignment]
        out.append(msg)
    return out


def chat_conversations(messages: object) -> tuple[list[list[dict[str, str]]], bool]:
    """``(conversations, single)``: one conversation (a list of ``{"role", "content"}``
    dicts) or a list of them, each message's content reduced to text."""
    if not isinstance(messages, (list, tuple)):
        raise ParamTypeError(f"messages must be a list of {{'role', 'content'}} dicts, or a list of such lists; "
                             f"got {_type_name(messages)}")
    if messages and all(isinstance(c, (list, tuple)) for c in messages):
        return [_conversation(c, f"messages[{i}]") for i, c in enumerate(messages)], False
    return [_conversation(messages, "messages")], True


__all__ = [
    "FINISH_REASONS",
    "ParamTypeError",
    "ParamValueError",
    "api_finish_reason",
    "chat_conversations",
    "check_vocab",
    "check_float",
    "check_int",
    "check_logprobs",
    "check_prompt_ids",
    "prompt_list",
    "refuse_keywords",
    "sampling_params_list",
]
