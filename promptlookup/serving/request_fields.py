"""The OpenAI request fields the server reads: every field honoured or refused with 400.

Pure validation, no model work except what a field needs to be checked against (the
vocabulary, the engine limits): :func:`parse_request` runs on a worker thread, so a large
body never stalls the event loop that streams other requests.

Honoured: ``max_tokens`` / ``max_completion_tokens`` (chat; a 400 where both differ), ``temperature``, ``top_p``, ``top_k``
(vLLM's; -1 is "none"), ``seed``, ``stop``, ``stop_token_ids`` (vLLM's: more end tokens), ``ignore_eos`` (vLLM's), ``n`` (with
``best_of`` equal to it or absent), ``presence_penalty`` and ``frequency_penalty`` (in
[-2, 2], OpenAI's range), ``repetition_penalty`` (> 0, vLLM's), ``logit_bias`` ({token id:
bias in [-100, 100]}), ``min_tokens`` (vLLM's), ``echo`` (completions), ``logprobs`` (completions: an
integer in [0, 20]; chat: a boolean, with ``top_logprobs`` in [0, 20]; the raw model's, see
:mod:`.logprob_format`), ``stream``,
``stream_options.include_usage``, ``response_format`` ``{"type": "text"}`` (the default),
``tool_choice`` ``"none"``, and the metadata fields ``user``, ``metadata``, ``service_tier``,
``parallel_tool_calls`` (meaningless without tools; type-checked) and ``store`` ``false``
(``true`` is refused: nothing is stored). Refused (400 naming the
field): tools and function calling, structured output, ``echo`` with ``logprobs`` (the prompt's
log-probabilities), ``suffix``, predicted outputs, audio, non-text modalities and vLLM's guided decoding.
Any other field is unknown (a typo such as ``temprature``, or another server's extension):
400 ``unknown_field`` naming it, as trtllm-serve (its request models forbid extra fields) and
OpenAI answer; ``serve.py --ignore_unknown_fields`` accepts such requests instead, as vLLM
does, logging each unknown name once (:func:`unknown_fields`).

Seeds: with ``seed``, choice ``i`` samples with request id ``i`` (reproducible; choice 0
is what ``run.py --random_seed`` gives). Without one (or ``null``), each choice gets a fresh
random 62-bit request id (the seed stays 0), so identical requests sample independently
while still sharing one forward pass per step (the batch groups requests by sampling
settings, and the request id is not one of them).
"""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Callable

from ..api import SamplingParams
from ..errors import UserError
from ..runtime.logprobs import MAX_TOP_LOGPROBS

MAX_N = 128  # choices per request


class ApiError(Exception):
    """A request the server refuses: OpenAI's error shape with this status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def _get(body: dict, name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ApiError(f"'{name}' must be {what}, got {json.dumps(value)[:80]}", name, "invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(f"'{name}' must be a finite number, got {value}", name, "invalid_value")
    return value


def check_text(text: str, param: str) -> str:
    """``text`` if it is valid Unicode (encodable as UTF-8), else a 400 naming ``param``
    (JSON's ``"\\ud800"`` escapes decode to lone surrogates that no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(f"'{param}' holds invalid Unicode ({exc.reason} at character {exc.start})", param,
                       "invalid_unicode") from None
    return text


# name -> (allowed value, or a predicate that accepts the value; why it is refused)
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (lambda v: v in (None, []), "tool calling is not supported"),
    "functions": (lambda v: v in (None, []), "function calling is not supported"),
    "tool_choice": (lambda v: v in (None, "none"), "tool calling is not supported"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not supported"),
    "response_format": (lambda v: v is None or v == {"type": "text"},
                        "only response_format {\"type\": \"text\"} is supported (no structured output)"),
    "suffix": (lambda v: v in (None, ""), "suffix (insertion) is not supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only the text modality is supported"),
    "reasoning_effort": (lambda v: v is None, "this model has no reasoning setting"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "use_beam_search": (lambda v: v in (None, False), "beam search is not supported"),
    "guided_json": (lambda v: v is None, "guided decoding is not supported"),
    "guided_regex": (lambda v: v is None, "guided decoding is not supported"),
    "guided_choice": (lambda v: v is None, "guided decoding is not supported"),
    "guided_grammar": (lambda v: v is None, "guided decoding is not supported"),
    "include_stop_str_in_output": (lambda v: v in (None, False), "the stop string is always cut from the text"),
    "store": (lambda v: v in (None, False), "stored completions are not supported: nothing is stored"),
    "skip_special_tokens": (lambda v: v in (None, True), "special tokens are always skipped in the text"),
}


# The fields read above (honoured, checked, or metadata), beside those of _UNSUPPORTED.
_READ = frozenset({
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
    "ignore_eos",
    "n", "best_of", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens",
    "logprobs", "top_logprobs", "echo", "stream", "stream_options",
    "user", "metadata", "store", "service_tier", "parallel_tool_calls",
})
_KNOWN = {True: _READ | {"messages"} | _UNSUPPORTED.keys(),
          False: (_READ - {"max_completion_tokens"}) | {"prompt"} | _UNSUPPORTED.keys()}  # (a chat field)
# metadata fields: nothing reads their values, but a value of the wrong type is still a 400
_METADATA_TYPES = {"user": ((str,), "a string"), "metadata": ((dict,), "an object"), "service_tier": ((str,), "a string"),
                   "parallel_tool_calls": ((bool,), "a boolean")}


def unknown_fields(body: dict, chat: bool, ignore: bool = False) -> list[str]:
    """The fields of ``body`` this server does not know, sorted; unless ``ignore``, the first
    is a 400 ``unknown_field`` naming it (``messages`` in a completions request and ``prompt``
    in a chat request are unknown there too)."""
    unknown = sorted(set(body) - _KNOWN[chat])
    if unknown and not ignore:
        other = {"messages": "/v1/chat/completions", "prompt": "/v1/completions"}.get(unknown[0])
        hint = (f"it belongs to {other}" if other else
                "check its spelling, or start the server with --ignore_unknown_fields to accept and ignore such fields")
        raise ApiError(f"unknown field {unknown[0]!r}: this server does not read it; {hint}", unknown[0],
                       "unknown_field")
    return unknown


def refuse_unsupported(body: dict, chat: bool) -> None:
    """400 for every known field this server cannot honour with the value given, and for
    metadata of the wrong type."""
    for name, (kinds, what) in _METADATA_TYPES.items():
        _get(body, name, kinds, None, what)
    for name, (ok, why) in _UNSUPPORTED.items():
        if name in body:
            try:
                accepted = ok(body[name])
            except TypeError:  # an unhashable value compared to a list
                accepted = False
            if not accepted:
                raise ApiError(f"'{name}': {why}", name, "unsupported_value")
    if chat and body.get("echo") not in (None, False):
        raise ApiError("'echo' is a completions field; chat completions do not echo", "echo", "unsupported_value")
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        raise ApiError("stream_options.continuous_usage_stats is not supported", "stream_options",
                       "unsupported_value")


def check_model(body: dict, names: tuple[str, ...]) -> None:
    """404 ``model_not_found`` unless ``model`` is one of ``names`` (the served name and its
    aliases). An absent ``model`` is accepted, as trtllm-serve does (the server has one)."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise ApiError("'model' must be a string", "model", "invalid_type")
    if model not in names:
        raise ApiError(f"the model {model!r} does not exist; this server serves {', '.join(map(repr, names))}",
                       "model", "model_not_found", 404)


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings: ``n`` choices, choice ``i`` submitted with
    ``params`` and request id ``request_ids[i]``."""

    params: SamplingParams
    request_ids: tuple[int, ...]
    echo: bool
    logprobs: int | None = None  # top alternatives per token's log-probability (None: none asked)
    seeded: bool = True  # False: request_ids are random (no 'seed'), so each prompt draws its own

    @property
    def n(self) -> int:
        return len(self.request_ids)

    def ids_of_prompt(self, i: int) -> tuple[int, ...]:
        """The request ids of prompt ``i``'s choices: with a seed, ``request_ids`` for every
        prompt (each what the prompt alone gives); without, fresh random ones for each prompt
        after the first, so that repeated prompts are sampled independently, as separate
        requests are."""
        return self.request_ids if self.seeded or i == 0 else tuple(secrets.randbits(62) for _ in range(self.n))


def _penalty(body: dict, name: str, neutral: float) -> float:
    value = float(_get(body, name, (int, float), neutral, "a number"))
    if name == "repetition_penalty":
        if value <= 0:
            raise ApiError(f"'repetition_penalty' must be > 0 (1 is neutral), got {value}", name, "invalid_value")
    elif not -2 <= value <= 2:
        raise ApiError(f"'{name}' must be in [-2, 2], got {value}", name, "invalid_value")
    return value


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float] | None:
    bias = _get(body, "logit_bias", (dict,), None, "an object mapping token ids to numbers")
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise ApiError(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias", "invalid_value") from None
        if not 0 <= token < vocab_size:
            raise ApiError(f"'logit_bias' token {token} is outside the vocabulary [0, {vocab_size})", "logit_bias",
                           "invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ApiError(f"'logit_bias' values must be numbers in [-100, 100], got {value!r} for token {token}",
                           "logit_bias", "invalid_value")
        out[token] = float(value)
    return out


def _logprobs(body: dict, chat: bool, echo: bool) -> int | None:
    """How many top alternatives per token the request asks for (None: no log-probabilities).
    Completions: ``logprobs`` an integer in [0, 20]; chat: ``logprobs`` a boolean and
    ``top_logprobs`` in [0, 20], which needs ``logprobs: true`` (OpenAI's rules)."""
    if chat:
        wanted = _get(body, "logprobs", (bool,), False, "a boolean")
        top = _get(body, "top_logprobs", (int,), None, "an integer")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ApiError(f"'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs",
                           "invalid_value")
        if top is not None and not wanted:
            raise ApiError("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
        return (top or 0) if wanted else None
    if body.get("top_logprobs") is not None:
        raise ApiError("'top_logprobs' is a chat field; completions take 'logprobs': <integer>", "top_logprobs",
                       "unsupported_value")
    n = _get(body, "logprobs", (int,), None, "an integer")
    if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ApiError(f"'logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {n}", "logprobs", "invalid_value")
    if n is not None and echo:
        raise ApiError("'echo' with 'logprobs' would need the prompt's log-probabilities, which this server does "
                       "not compute; drop one of them", "logprobs", "unsupported_value")
    return n


COMPLETIONS_MAX_TOKENS = 16  # /v1/completions' max_tokens when none is given (OpenAI's and vLLM's)


def default_max_tokens(chat: bool, room: int) -> int:
    """``max_tokens`` when the request gives none: 16 on /v1/completions (OpenAI's legacy
    default, vLLM's); on /v1/chat/completions the ``room`` left for output after the prompt
    (vLLM's: the rest of the context, here also within the KV cache), at least 1 (the
    context check then names the prompt that fills it)."""
    return max(1, room) if chat else COMPLETIONS_MAX_TOKENS


def sampling_from_body(body: dict, max_seq_len: int, vocab_size: int, chat: bool, room: int) -> Sampling:
    """The :class:`Sampling` of ``body``; 400 for a wrong type or a value out of range.
    ``room``: the output tokens that fit after the prompt (:func:`default_max_tokens`)."""
    n = _get(body, "n", (int,), 1, "an integer")
    if not 1 <= n <= MAX_N:
        raise ApiError(f"'n' must be in [1, {MAX_N}], got {n}", "n", "invalid_value")
    best_of = _get(body, "best_of", (int,), n, "an integer")
    if best_of != n:
        raise ApiError(f"best_of={best_of} (other than n) is not supported: every sample is returned", "best_of",
                       "unsupported_value")
    max_tokens = _get(body, "max_tokens", (int,), None, "an integer")
    completion_tokens = _get(body, "max_completion_tokens", (int,), None, "an integer")
    if max_tokens is not None and completion_tokens is not None and max_tokens != completion_tokens:
        raise ApiError(f"max_tokens={max_tokens} and max_completion_tokens={completion_tokens} differ; give one of them",
                       "max_completion_tokens", "invalid_value")
    if max_tokens is None:
        max_tokens = completion_tokens if completion_tokens is not None else default_max_tokens(chat, room)
    temperature = _get(body, "temperature", (int, float), 1.0, "a number")
    top_p = _get(body, "top_p", (int, float), 1.0, "a number")
    top_k = _get(body, "top_k", (int,), 0, "an integer")
    if top_k == -1:  # vLLM's "no top-k"
        top_k = 0
    seed = _get(body, "seed", (int,), None, "an integer")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise ApiError("'stop' must be a string or a list of strings", "stop", "invalid_type")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    stops = [check_text(s, "stop") for s in stops if s]
    stop_ids = _get(body, "stop_token_ids", (list,), [], "a list of token ids")
    for t in stop_ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ApiError(f"'stop_token_ids' must hold token ids in [0, {vocab_size}), got {json.dumps(t)[:40]}",
                           "stop_token_ids", "invalid_value")
    ignore_eos = _get(body, "ignore_eos", (bool,), False, "a boolean")
    echo = _get(body, "echo", (bool,), False, "a boolean")
    if not 0 <= temperature <= 2:
        raise ApiError(f"'temperature' must be in [0, 2], got {temperature}", "temperature", "invalid_value")
    if not 0 < top_p <= 1:
        raise ApiError(f"'top_p' must be in (0, 1], got {top_p}", "top_p", "invalid_value")
    if top_k < 0:
        raise ApiError(f"'top_k' must be >= 0 (or -1 for none), got {top_k}", "top_k", "invalid_value")
    if seed is not None and not 0 <= seed < 2**63:
        raise ApiError(f"'seed' must be in [0, 2**63), got {seed}", "seed", "invalid_value")
    if max_tokens < 1:
        raise ApiError(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens", "invalid_value")
    if max_tokens > max_seq_len - 1:
        raise ApiError(f"'max_tokens' {max_tokens} is beyond this model's context of {max_seq_len} tokens; "
                       f"ask for at most {max_seq_len - 1}", "max_tokens", "invalid_value")
    min_tokens = _get(body, "min_tokens", (int,), 0, "an integer")
    if not 0 <= min_tokens <= max_tokens:
        raise ApiError(f"'min_tokens' must be in [0, max_tokens={max_tokens}], got {min_tokens}", "min_tokens",
                       "invalid_value")
    logprobs = _logprobs(body, chat, echo)
    penalties = {name: _penalty(body, name, neutral) for name, neutral in
                 (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0))}
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                                seed=seed if seed is not None else 0, stop=stops or None,
                                ignore_eos=ignore_eos, logit_bias=_logit_bias(body, vocab_size),
                                min_tokens=min_tokens, logprobs=logprobs, stop_token_ids=stop_ids or None,
                                **penalties)
    except UserError as exc:  # every field was checked above; this is a rule SamplingParams adds
        raise ApiError(str(exc), None, "invalid_value") from None
    ids = tuple(range(n)) if seed is not None else tuple(secrets.randbits(62) for _ in range(n))
    return Sampling(params, ids, echo, logprobs, seeded=seed is not None)


def completion_prompts(body: dict) -> list[str | list[int]]:
    """``prompt``: a non-empty string, a list of token ids, or a non-empty list of several
    of either (vLLM's and OpenAI's batch form: each prompt gets ``n`` choices)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt)):
        return [_one_prompt(prompt, "prompt")]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [_one_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    raise ApiError("'prompt' must be a string, a list of token ids, or a list of several of either", "prompt",
                   "invalid_type")


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _one_prompt(prompt: str | list, name: str) -> str | list[int]:
    """One prompt of ``prompt``: a non-empty string or a non-empty list of token ids."""
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(f"'{name}' must not be empty", "prompt", "invalid_value")
        return check_text(prompt, "prompt")
    if not prompt or not all(_is_token(t) for t in prompt):
        raise ApiError(f"'{name}' must be a string or a non-empty list of token ids", "prompt", "invalid_type")
    return prompt


def chat_messages(body: dict) -> list[dict[str, str]]:
    """``messages`` as ``[{"role", "content"}]`` with string contents (and ``name`` where given,
    which the chat template may use, as ``LLM.chat`` keeps it).

    ``content`` may be a string, a list of parts (the ``text`` of ``{"type": "text"}`` parts
    joined by newlines, as vLLM and trtllm-serve join them; any other part type is refused), or ``null`` on an assistant turn (read
    as ``""``). Tool calls and tool results in a message are refused (the server does not
    call tools), and so is any other key of a message, which nothing would read."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", "messages", "invalid_type")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a string 'role'", "messages", "invalid_type")
        role, content = m["role"], m.get("content")
        if m.get("tool_calls") or m.get("function_call") or "tool_call_id" in m:
            raise ApiError(f"messages[{i}] holds tool calls; tool calling is not supported", "messages",
                           "unsupported_value")
        other = sorted(set(m) - {"role", "content", "name", "tool_calls", "function_call"})
        if other:
            raise ApiError(f"messages[{i}]: unknown key{'s' if len(other) > 1 else ''} {', '.join(map(repr, other))}; "
                           "a message has role, content and optionally name", "messages", "invalid_value")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise ApiError(f"messages[{i}].name must be a string", "messages", "invalid_type")
        if content is None and role == "assistant":
            content = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(f"messages[{i}]: only text content parts ({{\"type\": \"text\", \"text\": ...}}) "
                                   f"are supported, got {json.dumps(part)[:60]}", "messages", "unsupported_value")
                texts.append(part["text"])
            content = "\n".join(texts)  # vLLM's and trtllm-serve's joint
        elif not isinstance(content, str):
            raise ApiError(f"messages[{i}].content must be a string or a list of text parts", "messages",
                           "invalid_type")
        entry = {"role": check_text(role, "messages"), "content": check_text(content, "messages")}
        if name is not None:
            entry["name"] = check_text(name, "messages")
        clean.append(entry)
    return clean
