"""The OpenAI-compatible HTTP server behind ``serve.py`` (Starlette on uvicorn).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (both with SSE
streaming, ``"stream": true``), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(:mod:`.metrics`). The request fields, each honoured or refused: :mod:`.request_fields`.

Every choice of a request becomes one request of the :class:`~promptlookup.api.LLM`'s
continuous-batching scheduler (``n`` choices: ``n`` requests of the same prompt, whose
cached prefix they share through block reuse; a completions ``prompt`` that lists several
prompts: ``n`` choices of each, choice ``j`` of prompt ``i`` at index ``i * n + j``, vLLM's
order): it joins the live batch at the next step and leaves it when done. A client that disconnects (streaming or not) cancels its
requests, which leave the batch before the next step and free their KV blocks.

A request's body is read up to ``max_request_bytes`` (413 beyond, before any parsing),
then parsed, validated and tokenized on a worker thread, so that no request stalls the
event loop that streams the others. With ``api_key``, the ``/v1`` routes need
``Authorization: Bearer <key>`` (401 otherwise). Beyond ``max_waiting_requests`` requests
that cannot join the batch now, a request is refused with 429 and ``Retry-After``; one whose
choices (``n`` times its prompts) exceed what an idle server holds (``max_batch_size`` +
``max_waiting_requests``) with 400, as no retry would succeed.
While draining (:meth:`OpenAIServer.begin_drain`, a shutdown) new requests get 503;
:meth:`OpenAIServer.abort_inflight` ends the rest with an error event in their stream (503
for non-streamed ones).

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and speak
the API's field names: 400 for a body that is not a JSON object, a field of the wrong
type or range, a field the server cannot honour, invalid Unicode, or a prompt over the
engine's limits (``context_length_exceeded``); 404 ``model_not_found``; 401, 413, 429, 503
as above. A :class:`~promptlookup.errors.UserError` from the library is a 400, anything
else a 500: statuses follow the error's type, never its text. Extensions: ``top_k``,
``ignore_eos``, ``min_tokens``, ``repetition_penalty``, ``stop_token_ids`` (vLLM's), each
choice's ``stop_reason`` (vLLM's: the stop string or stop token that ended it, else null), and
``usage.prompt_lookup`` (drafted/accepted/steps). ``logprobs`` (and chat's ``top_logprobs``)
are the raw model's, in OpenAI's two shapes (:mod:`.logprob_format`), streamed or not.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..api import LLM
from ..api.llm import RequestOutput
from ..errors import UserError
from ..text import chat_ids, has_chat_template
from .logprob_format import LogprobWriter, TokenTexts
from .metrics import prometheus_text, weight_bytes
from .request_fields import (ApiError, Sampling, _get, chat_messages, check_model, completion_prompts,  # noqa: F401
                             refuse_unsupported, sampling_from_body, unknown_fields)

SHUTDOWN_MESSAGE = "the server is shutting down; retry elsewhere or later"


def default_max_request_bytes(max_seq_len: int) -> int:
    """The default body limit: 64 bytes per token of the context, at least 1 MiB."""
    return max(1 << 20, 64 * max_seq_len)


def default_max_waiting_requests(max_batch_size: int) -> int:
    """The default queue limit: eight batches' worth of requests waiting to join."""
    return 8 * max_batch_size


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    return JSONResponse({"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.code}},
                        status_code=exc.status, headers=headers)


def chat_prompt(body: dict, llm: LLM) -> list[int]:
    messages = chat_messages(body)
    if not has_chat_template(llm.tokenizer):
        raise ApiError("this model's tokenizer has no chat template; use /v1/completions", "messages",
                       "unsupported_value")
    from jinja2 import TemplateError

    try:
        return chat_ids(llm.tokenizer, messages)
    except TemplateError as exc:  # the template's own rules (e.g. roles must alternate)
        raise ApiError(f"the chat template refused these messages: {exc}", "messages", "invalid_value") from None


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized request, ready to submit: its prompts (chat: one), each with
    the text ``echo`` puts before its choices ("" without echo)."""

    prompt_ids: tuple[list[int], ...]
    sampling: Sampling
    echo_texts: tuple[str, ...]
    stream: bool
    include_usage: bool

    @property
    def choices(self) -> int:
        return len(self.prompt_ids) * self.sampling.n

    def echo(self, choice: int) -> str:
        """The echoed text before choice ``choice`` (index ``i * n + j``: prompt ``i``'s)."""
        return self.echo_texts[choice // self.sampling.n]


# ----------------------------------------------------------------------------- app
class OpenAIServer:
    """The Starlette app over one :class:`LLM` (see the module docstring).

    ``model_name``: the served name, or several (the first is the one reported; all are
    accepted in ``model``). ``max_request_bytes`` / ``max_waiting_requests``: ``None`` picks
    the defaults (:func:`default_max_request_bytes`, :func:`default_max_waiting_requests`).
    """

    def __init__(self, llm: LLM, model_name: str | Sequence[str], *, api_key: str | None = None,
                 max_request_bytes: int | None = None, max_waiting_requests: int | None = None,
                 ignore_unknown_fields: bool = False) -> None:
        self.llm = llm
        self.model_names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
        if not self.model_names:
            raise UserError("give at least one served model name")
        self.model_name = self.model_names[0]
        self.api_key = api_key or None
        self.ignore_unknown_fields = ignore_unknown_fields
        self.ignored_fields: set[str] = set()  # unknown field names accepted and logged once each
        limits = llm.limits
        self.max_request_bytes = max_request_bytes or default_max_request_bytes(limits.max_seq_len)
        self.max_waiting_requests = (max_waiting_requests if max_waiting_requests is not None
                                     else default_max_waiting_requests(limits.max_batch_size))
        self.draining = False  # new requests get 503
        self.aborted = False  # in-flight requests were ended by abort_inflight
        self.created = int(time.time())
        self.weights_bytes = weight_bytes(llm.runner.model)
        self.token_texts = TokenTexts(llm.tokenizer)  # tokens' strings for logprobs, each computed once
        # one worker: tokenizers are not all safe for concurrent calls, and a single
        # thread keeps a burst of large bodies from taking every core from the batch
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="promptlookup-prepare")
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ])

    # ------------------------------------------------------------------ lifecycle
    def begin_drain(self) -> None:
        """Refuse new requests (503) from now on; in-flight ones go on."""
        self.draining = True

    def abort_inflight(self) -> int:
        """End every waiting and live request with an error (their blocks freed); return how many."""
        self.draining = self.aborted = True
        return self.llm.scheduler.abort_all(SHUTDOWN_MESSAGE)

    def idle(self) -> bool:
        """No request waiting or live."""
        stats = self.llm.scheduler.stats
        return stats.live == 0 and stats.waiting == 0

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError("missing or wrong API key; send 'Authorization: Bearer <key>'", None, "invalid_api_key",
                           401)

    # ------------------------------------------------------------------ routes
    async def health(self, request: Request) -> Response:
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        alive = self.llm.scheduler.alive
        return JSONResponse({"status": "ok" if alive else "dead"}, status_code=200 if alive else 503)

    async def models(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except ApiError as exc:
            return error_response(exc)
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "promptlookup",
             "max_model_len": self.llm.limits.max_seq_len}]})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(prometheus_text(self.llm, self.weights_bytes),
                                 media_type="text/plain; version=0.0.4")

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    # ------------------------------------------------------------------ request -> outputs
    async def _read_body(self, request: Request) -> bytes:
        limit = self.max_request_bytes
        declared = request.headers.get("content-length", "")
        too_big = ApiError(f"the request body is larger than this server's limit of {limit} bytes "
                           "(serve.py --max_request_bytes)", None, "request_too_large", 413)
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def _prepare(self, raw: bytes, chat: bool) -> Prepared:
        """Parse, validate and tokenize a body (runs on the worker thread)."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ApiError("the request body is not valid JSON", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object", None, "invalid_json")
        check_model(body, self.model_names)
        for name in unknown_fields(body, chat, self.ignore_unknown_fields):
            if name not in self.ignored_fields:
                self.ignored_fields.add(name)
                print(f"note: ignoring the unknown request field {name!r} (--ignore_unknown_fields)", file=sys.stderr,
                      flush=True)
        stream = _get(body, "stream", (bool,), False, "a boolean")
        options = _get(body, "stream_options", (dict,), None, "an object")
        if options is not None and not stream:
            raise ApiError("stream_options is only allowed when stream is true", "stream_options", "invalid_value")
        options = options or {}
        extra = sorted(set(options) - {"include_usage"})
        if extra:
            raise ApiError(f"stream_options: unknown key(s) {', '.join(map(repr, extra))}; it takes include_usage",
                           "stream_options", "invalid_value")
        include_usage = _get(options, "include_usage", (bool,), False, "a boolean")
        refuse_unsupported(body, chat)
        limits = self.llm.limits
        param = "messages" if chat else "prompt"
        prompts: list[str | list[int]] = [] if chat else completion_prompts(body)
        all_ids = [chat_prompt(body, self.llm)] if chat else [self.llm.encode(p)[1] for p in prompts]
        which = [""] if len(all_ids) == 1 else [f"prompt[{i}]: " for i in range(len(all_ids))]
        for ids, name in zip(all_ids, which):
            bad = [t for t in ids if not 0 <= t < limits.vocab_size]
            if bad:
                raise ApiError(f"{name}token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})", param,
                               "invalid_value")
            if not ids:
                raise ApiError(f"{name}the prompt has no tokens", param, "invalid_value")
        longest = max(len(ids) for ids in all_ids)
        sampling = sampling_from_body(body, limits.max_seq_len, limits.vocab_size, chat, self._room(longest))
        for ids, name in zip(all_ids, which):
            self._check_context(len(ids), sampling.params.max_tokens, param, name)
        echoes = [""] * len(all_ids) if not sampling.echo else [
            p if isinstance(p, str) else self.llm.decode(ids) for p, ids in zip(prompts, all_ids)]
        return Prepared(tuple(all_ids), sampling, tuple(echoes), stream, include_usage)

    def _room(self, prompt_len: int) -> int:
        """Output tokens that fit after a prompt of this length: within the context and within
        what one request may reserve of the KV cache (its prompt, output and a full draft)."""
        return min(self.llm.limits.max_seq_len - prompt_len, self.llm.scheduler.kv_room(prompt_len))

    def _check_context(self, prompt_len: int, max_tokens: int, param: str, name: str = "") -> None:
        """``name``: which prompt, as the messages' prefix ("" for a request's only prompt)."""
        limits = self.llm.limits
        if prompt_len > limits.max_input_len:
            raise ApiError(f"{name}the prompt has {prompt_len} tokens; this model takes at most "
                           f"{limits.max_input_len}", param, "context_length_exceeded")
        if prompt_len + max_tokens > limits.max_seq_len:
            raise ApiError(f"{name}the prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) exceeds this model's "
                           f"context of {limits.max_seq_len} tokens; ask for at most "
                           f"{limits.max_seq_len - prompt_len} tokens", "max_tokens", "context_length_exceeded")
        scheduler = self.llm.scheduler
        if scheduler.kv_blocks_for(prompt_len, max_tokens) > scheduler.kv_capacity:
            raise ApiError(f"{name}the prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) needs more KV cache "
                           "than this server holds; lower max_tokens", "max_tokens", "context_length_exceeded")

    def _submit(self, p: Prepared) -> list[RequestOutput]:
        """Queue the request's choices (on the event loop: the queue check and the submits
        happen with no await between them)."""
        stats = self.llm.scheduler.stats
        if self.draining:
            raise ApiError(SHUTDOWN_MESSAGE, None, "service_unavailable", 503)
        batch, n, held = self.llm.limits.max_batch_size, p.sampling.n, p.choices
        most = batch + self.max_waiting_requests
        if held > most:  # more than an idle server holds: never a retry
            what = (f"'n' {n} is" if len(p.prompt_ids) == 1 else
                    f"{held} choices ({len(p.prompt_ids)} prompts times 'n' {n}) are")
            raise ApiError(f"{what} more choices than this server holds at once ({batch} running, the engine's "
                           f"max_batch_size, and {self.max_waiting_requests} waiting, --max_waiting_requests); ask for "
                           f"at most {most}", "n" if len(p.prompt_ids) == 1 else "prompt", "invalid_value")
        behind = stats.waiting + stats.live + held - batch
        if behind > self.max_waiting_requests:
            raise ApiError(f"too many requests are waiting (limit {self.max_waiting_requests}); retry shortly",
                           None, "rate_limit_exceeded", 429)
        outs: list[RequestOutput] = []
        try:  # prompt i's choice j: index i * n + j, request id j when seeded (as the prompt alone would sample)
            for i, ids in enumerate(p.prompt_ids):
                for j, rid in enumerate(p.sampling.ids_of_prompt(i)):
                    outs.append(self.llm.generate_async(ids, p.sampling.params, streaming=True, request_id=rid,
                                                        index=i * n + j))
        except UserError as exc:  # a rule of the library's that the checks above did not foresee
            for o in outs:
                o.abort()
            raise ApiError(str(exc), None, "invalid_value") from None
        return outs

    async def _serve(self, request: Request, chat: bool) -> Response:
        try:
            self._authorize(request)
            if self.draining:
                raise ApiError(SHUTDOWN_MESSAGE, None, "service_unavailable", 503)
            raw = await self._read_body(request)
            prepared = await asyncio.get_running_loop().run_in_executor(self._prepare_pool, self._prepare, raw, chat)
            outs = self._submit(prepared)
        except UserError as exc:  # the library refused the request: a client error, whatever its text
            return error_response(ApiError(str(exc), None, "invalid_value"))
        except ApiError as exc:
            return error_response(exc, {"Retry-After": "1"} if exc.status in (429, 503) else None)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if prepared.stream:
            return StreamingResponse(self._sse(outs, prepared, rid, chat), media_type="text/event-stream")
        finals = await _unless_disconnected(request, outs)
        if finals is None:
            return Response(status_code=499)
        failed = next((f for f in finals if f.error is not None), None)
        if failed is not None:
            status = 503 if self.aborted else 500
            return error_response(ApiError(failed.error or "generation failed", None,
                                           "service_unavailable" if self.aborted else "generation_failed", status))
        choices = []
        for i, final in enumerate(finals):
            c = final.outputs[0]
            logprobs = self._writer(prepared, chat, i).take(c.token_logprobs, len(c.token_ids))
            choice: dict[str, Any] = {"index": i, "finish_reason": _finish(c.finish_reason), "logprobs": logprobs,
                                      "stop_reason": c.stop_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = prepared.echo(i) + c.text
            choices.append(choice)
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices, "usage": _usage(finals, prepared.sampling.n)})

    def _writer(self, p: Prepared, chat: bool, index: int) -> LogprobWriter:
        """Choice ``index``'s log-probabilities in the endpoint's shape (:mod:`.logprob_format`)."""
        return LogprobWriter(self.token_texts, chat, p.sampling.logprobs or 0, len(p.echo(index)))

    async def _sse(self, outs: list[RequestOutput], p: Prepared, rid: str, chat: bool) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        writers = [self._writer(p, chat, i) for i in range(len(outs))]  # each chunk: the entries of the tokens since the last

        def chunk(index: int, text: str | None, finish: str | None, first: bool = False,
                  logprobs: dict[str, Any] | None = None) -> str:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if text:
                    delta["content"] = text
                choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish,
                                          "logprobs": logprobs}
            else:
                choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
            choice["stop_reason"] = outs[index].outputs[0].stop_reason if finish else None
            payload = {"id": rid, "object": kind, "created": created, "model": self.model_name, "choices": [choice]}
            return f"data: {json.dumps(payload)}\n\n"

        updates: asyncio.Queue[tuple[int, str, str | None, bool, dict[str, Any] | None]] = asyncio.Queue()

        async def pump(index: int, out: RequestOutput) -> None:
            try:
                async for o in out:
                    c = o.outputs[0]
                    if c.text_diff or o.finished:
                        logprobs = writers[index].take(c.token_logprobs, len(c.token_ids))
                        updates.put_nowait((index, c.text_diff, _finish(c.finish_reason) if o.finished else None, False,
                                            logprobs))
            except RuntimeError:  # the request failed in the scheduler (out.error says why)
                pass
            finally:
                updates.put_nowait((index, "", None, True, None))

        tasks = [asyncio.ensure_future(pump(i, o)) for i, o in enumerate(outs)]
        try:
            for i in range(len(outs)):
                if chat:
                    yield chunk(i, None, None, first=True)
                elif p.echo(i):
                    yield chunk(i, p.echo(i), None)
            done = 0
            while done < len(outs):
                index, text, finish, ended, logprobs = await updates.get()
                if not ended:
                    yield chunk(index, text, finish, logprobs=logprobs)
                    continue
                done += 1
                error = outs[index].error
                if error is not None:
                    err = {"error": {"message": error, "type": "server_error", "param": None,
                                     "code": "service_unavailable" if self.aborted else None}}
                    yield f"data: {json.dumps(err)}\n\n"
                    break
            else:
                if p.include_usage:
                    payload = {"id": rid, "object": kind, "created": created, "model": self.model_name,
                               "choices": [], "usage": _usage(outs, p.sampling.n)}
                    yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for o in outs:
                o.abort()  # a disconnect cancels the requests; after completion this is a no-op
            for t in tasks:
                t.cancel()


def _finish(reason: str | None) -> str | None:
    return "length" if reason == "length" else ("stop" if reason is not None else None)


def _usage(outs: Sequence[RequestOutput], n: int) -> dict[str, Any]:
    """Token counts of a request's choices (``n`` per prompt): each prompt counted once."""
    prompt = sum(len(o.prompt_token_ids) for o in outs[::n])
    completion = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_lookup": {name: sum(getattr(o.outputs[0], name) for o in outs)
                              for name in ("drafted", "accepted", "steps")}}


async def _unless_disconnected(request: Request, outs: list[RequestOutput]) -> list[RequestOutput] | None:
    """The final outputs, or ``None`` (requests cancelled) if the client goes away first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def final(out: RequestOutput) -> RequestOutput:
        try:
            return await out.aresult()
        except RuntimeError:  # failed: out.error says why
            return out

    result = asyncio.ensure_future(asyncio.gather(*(final(o) for o in outs)))
    gone = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if result in done:
        return list(result.result())
    for o in outs:
        o.abort()
    result.cancel()
    return None
