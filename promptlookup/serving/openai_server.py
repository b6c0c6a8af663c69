"""The OpenAI-compatible HTTP server behind ``serve.py`` (Starlette on uvicorn).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (both with SSE
streaming, ``"stream": true``), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus text: requests, tokens, drafted and accepted tokens, acceptance rate, batch).

Every request becomes one request of the :class:`~promptlookup.api.LLM`'s
continuous-batching scheduler: it joins the live batch at the next step and leaves it
when done. A client that disconnects (streaming or not) cancels its request, which
leaves the batch before the next step and frees its KV blocks.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with 400
for: a body that is not a JSON object, a known field of the wrong type or range, a
prompt over the engine's ``max_input_len``, ``max_tokens`` beyond the engine
(prompt + max_tokens > ``max_seq_len``), ``n`` > 1 and several prompts in one request.
Unknown fields are ignored, as OpenAI's server does. Extensions: ``top_k``, ``seed``,
``ignore_eos`` (vLLM's), and ``usage.prompt_lookup`` (drafted/accepted/steps).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..api import LLM, SamplingParams
from ..api.llm import RequestOutput
from ..errors import UserError
from ..text import chat_ids, has_chat_template


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def error_response(exc: ApiError) -> JSONResponse:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return JSONResponse({"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}},
                        status_code=exc.status)


# ----------------------------------------------------------------------------- fields
def _get(body: dict, name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ApiError(f"'{name}' must be {what}, got {json.dumps(value)[:80]}", name, "invalid_type")
    return value


def sampling_from_body(body: dict, llm: LLM) -> SamplingParams:
    n = _get(body, "n", (int,), 1, "an integer")
    if n != 1:
        raise ApiError(f"n={n} is not supported; this server returns one choice per request (n=1)", "n",
                       "unsupported_value")
    best_of = _get(body, "best_of", (int,), 1, "an integer")
    if best_of != 1:
        raise ApiError("best_of > 1 is not supported", "best_of", "unsupported_value")
    if body.get("logprobs") not in (None, False):
        raise ApiError("logprobs are not supported", "logprobs", "unsupported_value")
    max_tokens = _get(body, "max_tokens", (int,), None, "an integer")
    if max_tokens is None:
        max_tokens = _get(body, "max_completion_tokens", (int,), 16, "an integer")
    temperature = _get(body, "temperature", (int, float), 1.0, "a number")
    top_p = _get(body, "top_p", (int, float), 1.0, "a number")
    top_k = _get(body, "top_k", (int,), 0, "an integer")
    if top_k == -1:  # vLLM's "no top-k"
        top_k = 0
    seed = _get(body, "seed", (int,), 0, "an integer")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise ApiError("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if isinstance(stop, list):
        stop = [s for s in stop if s] or None
    elif stop == "":
        stop = None
    ignore_eos = _get(body, "ignore_eos", (bool,), False, "a boolean")
    if not 0 <= temperature <= 2:
        raise ApiError(f"'temperature' must be in [0, 2], got {temperature}", "temperature", "invalid_value")
    if max_tokens < 1:
        raise ApiError(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens", "invalid_value")
    limit = llm.limits.max_seq_len - 1
    if max_tokens > limit:
        raise ApiError(f"'max_tokens' {max_tokens} is beyond this engine (max_seq_len {llm.limits.max_seq_len}); "
                       f"ask for at most {limit}", "max_tokens", "invalid_value")
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                              seed=seed, stop=stop, ignore_eos=ignore_eos)
    except UserError as exc:
        raise ApiError(str(exc), None, "invalid_value") from None


def completion_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError("'prompt' must not be empty", "prompt", "invalid_value")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError("several prompts in one request are not supported; send one request per prompt", "prompt",
                       "unsupported_value")
    raise ApiError("'prompt' must be a string or a list of token ids", "prompt", "invalid_type")


def chat_prompt(body: dict, llm: LLM) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list", "messages", "invalid_type")
    clean = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ApiError("each message must be an object with string 'role' and 'content'", "messages",
                           "invalid_type")
        clean.append({"role": m["role"], "content": m["content"]})
    if not has_chat_template(llm.tokenizer):
        raise ApiError("this model's tokenizer has no chat template; use /v1/completions", "messages",
                       "unsupported_value")
    return chat_ids(llm.tokenizer, clean)


# ----------------------------------------------------------------------------- app
class OpenAIServer:
    """The Starlette app over one :class:`LLM` (see the module docstring)."""

    def __init__(self, llm: LLM, model_name: str) -> None:
        self.llm = llm
        self.model_name = model_name
        self.created = int(time.time())
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ])

    async def health(self, request: Request) -> Response:
        alive = self.llm.scheduler._thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "dead"}, status_code=200 if alive else 503)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "promptlookup",
             "max_model_len": self.llm.limits.max_seq_len}]})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(prometheus_text(self.llm), media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    # ------------------------------------------------------------------ core
    async def _serve(self, request: Request, chat: bool) -> Response:
        try:
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError):
                raise ApiError("the request body is not valid JSON", None, "invalid_json") from None
            if not isinstance(body, dict):
                raise ApiError("the request body must be a JSON object", None, "invalid_json")
            model = body.get("model")
            if model is not None and not isinstance(model, str):
                raise ApiError("'model' must be a string", "model", "invalid_type")
            stream = _get(body, "stream", (bool,), False, "a boolean")
            options = _get(body, "stream_options", (dict,), {}, "an object")
            params = sampling_from_body(body, self.llm)
            prompt = chat_prompt(body, self.llm) if chat else completion_prompt(body)
            try:
                out = self.llm.generate_async(prompt, params, streaming=True)
            except UserError as exc:
                text = str(exc)
                code = "context_length_exceeded" if "max_input_len" in text or "max_seq_len" in text else "invalid_value"
                param = "max_tokens" if "max_tokens" in text else ("messages" if chat else "prompt")
                raise ApiError(text, param, code) from None
        except ApiError as exc:
            return error_response(exc)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if stream:
            return StreamingResponse(self._sse(out, rid, chat, bool(options.get("include_usage"))),
                                     media_type="text/event-stream")
        final = await _unless_disconnected(request, out)
        if final is None:
            return Response(status_code=499)
        if final.error is not None:
            return error_response(ApiError(final.error, None, "generation_failed", 500))
        c = final.outputs[0]
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(c.finish_reason), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "usage": _usage(final)})

    async def _sse(self, out: RequestOutput, rid: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if text:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            payload = {"id": rid, "object": kind, "created": created, "model": self.model_name, "choices": [choice]}
            return f"data: {json.dumps(payload)}\n\n"

        try:
            if chat:
                yield chunk(None, None, first=True)
            async for o in out:
                if o.error is not None:
                    err = {"error": {"message": o.error, "type": "server_error", "param": None, "code": None}}
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                c = o.outputs[0]
                if c.text_diff or o.finished:
                    yield chunk(c.text_diff, _finish(c.finish_reason) if o.finished else None)
            else:
                if include_usage:
                    payload = {"id": rid, "object": kind, "created": created, "model": self.model_name,
                               "choices": [], "usage": _usage(out)}
                    yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"
        except RuntimeError as exc:  # the request failed in the scheduler
            err = {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
            yield f"data: {json.dumps(err)}\n\n"
        finally:
            out.abort()  # a disconnect cancels the request; after completion this is a no-op


def _finish(reason: str | None) -> str | None:
    return "length" if reason == "length" else ("stop" if reason is not None else None)


def _usage(out: RequestOutput) -> dict[str, Any]:
    c = out.outputs[0]
    return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(c.token_ids),
            "total_tokens": len(out.prompt_token_ids) + len(c.token_ids),
            "prompt_lookup": {"drafted": c.drafted, "accepted": c.accepted, "steps": c.steps}}


async def _unless_disconnected(request: Request, out: RequestOutput) -> RequestOutput | None:
    """The final output, or ``None`` (request cancelled) if the client goes away first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    result = asyncio.ensure_future(out.aresult())
    gone = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if result in done:
        try:
            return result.result()
        except RuntimeError:
            return out
    out.abort()
    result.cancel()
    return None


def prometheus_text(llm: LLM) -> str:
    """The ``/metrics`` body (Prometheus text exposition format 0.0.4)."""
    s = llm.scheduler.stats
    blocks = llm.runner.blocks
    in_use = sum(1 for c in blocks.refcount if c > 0)
    rows = [
        ("promptlookup_requests_total", "counter", "Requests by outcome.", [
            ('{state="submitted"}', s.requests_submitted), ('{state="finished"}', s.requests_finished),
            ('{state="cancelled"}', s.requests_cancelled), ('{state="failed"}', s.requests_failed)]),
        ("promptlookup_generated_tokens_total", "counter", "Tokens generated.", [("", s.generated_tokens)]),
        ("promptlookup_draft_tokens_total", "counter", "Draft tokens verified.", [("", s.drafted)]),
        ("promptlookup_accepted_draft_tokens_total", "counter", "Draft tokens accepted.", [("", s.accepted)]),
        ("promptlookup_acceptance_rate", "gauge", "Accepted / drafted tokens since start.",
         [("", s.accepted / s.drafted if s.drafted else 0.0)]),
        ("promptlookup_tokens_per_step", "gauge", "Generated tokens per sequence step since start.",
         [("", s.generated_tokens / s.sequence_steps if s.sequence_steps else 0.0)]),
        ("promptlookup_sequence_steps_total", "counter", "Verification steps, one per live sequence.",
         [("", s.sequence_steps)]),
        ("promptlookup_batch_steps_total", "counter", "Forward passes of the live batch.", [("", s.batch_steps)]),
        ("promptlookup_live_requests", "gauge", "Requests in the live batch.", [("", s.live)]),
        ("promptlookup_waiting_requests", "gauge", "Requests waiting to join the batch.", [("", s.waiting)]),
        ("promptlookup_kv_blocks_in_use", "gauge", "KV cache blocks referenced by live requests.", [("", in_use)]),
        ("promptlookup_kv_blocks_total", "gauge", "KV cache blocks.", [("", len(blocks.refcount) - 1)]),
        ("promptlookup_draft_token_budget", "gauge", "Tokens one step may feed (batch-aware draft budget).",
         [("", llm.scheduler.token_budget)]),
    ]
    lines = []
    for name, kind, help_text, samples in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {value}" for labels, value in samples]
    return "\n".join(lines) + "\n"
