"""``promptlookup.LLM``: TensorRT-LLM's LLM API over this project's runtime.

    from promptlookup import LLM, NGramDecodingConfig, SamplingParams
    llm = LLM("engine_dir", speculative_config=NGramDecodingConfig(max_draft_len=10, max_matching_ngram_size=2))
    for out in llm.generate(["prompt one", "prompt two"], SamplingParams(max_tokens=64)):
        print(out.outputs[0].text, out.outputs[0].accepted, out.outputs[0].tokens_per_step)

Every request runs through one continuous-batching :class:`~promptlookup.decoding.scheduler.Scheduler`
(the live V2 batch), so ``generate`` of a list, ``generate_async`` calls from many tasks,
and ``serve.py``'s clients all share one batch, one public n-gram pool and one KV cache.
Outputs equal ``decoding.generate``'s for the same prompts (``generate`` numbers a
list's requests 0..n-1, as ``decoding.generate`` does, so sampled outputs agree too).
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

from ..defaults import BACKENDS, DEFAULT_BACKEND, DEFAULT_DRAFT_LENGTH_POLICY, DRAFT_LENGTH_POLICIES
from ..errors import UserError
from ..decoding.scheduler import FINISH_ERROR, GenerationRequest, RequestHandle, Scheduler, TokenEvent
from ..runtime.results import SequenceResult
from ..text import REPLACEMENT, IncrementalDetokenizer, decode_text, encode_text, find_stop, stop_hold, stop_token_count
from ..text import chat_ids, has_chat_template
from .configs import KvCacheConfig, LookaheadDecodingConfig, NGramDecodingConfig, RuntimeConfig, SamplingParams
from .model_cache import AutoBuild, resolve_engine
from . import samples
from .validation import (ParamTypeError, ParamValueError, api_finish_reason, chat_conversations, check_int,
                         check_prompt_ids, check_vocab, prompt_list, refuse_keywords, sampling_params_list)





def _tokenizer(tokenizer: Any, default: str | os.PathLike[str]) -> Any:
    """``LLM(tokenizer=...)``: a folder (or None: ``default``'s), or a tokenizer object, as
    TensorRT-LLM's LLM takes (a Hugging Face tokenizer: ``encode``, ``decode``, ``eos_token_id``)."""
    from ..runtime import load_tokenizer

    if isinstance(tokenizer, (str, os.PathLike)) and not Path(tokenizer).is_dir():
        raise UserError(f"tokenizer={str(tokenizer)!r} is not a directory; pass a tokenizer folder, a Hugging Face "
                        "tokenizer, or None for the model's own")
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        return load_tokenizer(tokenizer or default)
    missing = [name for name in ("encode", "decode", "eos_token_id") if not hasattr(tokenizer, name)]
    if missing:
        raise UserError(f"tokenizer: a {type(tokenizer).__name__} has no {', '.join(missing)}; pass a tokenizer "
                        "folder or a Hugging Face tokenizer")
    return tokenizer


@dataclass(frozen=True)
class Logprob:
    """One token's entry in :attr:`CompletionOutput.logprobs` (vLLM's ``Logprob``; TensorRT-LLM's
    has ``logprob`` and ``rank`` too): its log-probability under the raw model, its rank there
    (1: the most likely; None: unknown) and its text alone."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput(SequenceResult):
    """One generated sequence: the request's :class:`~promptlookup.runtime.results.SequenceResult`
    so far (``steps``, ``drafted``, ``accepted``, ``draft_flags``, ``acceptance_rate``,
    ``tokens_per_step``: the same counters as ``decoding.generate``'s), seen with
    TensorRT-LLM's names (``token_ids`` is ``output_ids``) and its text."""

    index: int = 0
    text: str = ""
    finish_reason: str | None = None  # "stop" (end_id or a stop string), "length", "abort" (abort())
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's; None for end_id)
    text_diff: str = ""  # text added by the latest update (streaming)
    token_ids_diff: list[int] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return self.output_ids

    @property
    def logprobs(self) -> list[dict[int, Logprob]] | None:
        """Per token (vLLM's and TensorRT-LLM's shape): ``{token id: Logprob}`` for the token,
        then the ``SamplingParams.logprobs`` most likely tokens at its position (ranks 1, 2, ...;
        the raw model's values, :mod:`promptlookup.runtime.logprobs`); None unless asked for."""
        if self.token_logprobs is None:
            return None
        decode = self.__dict__.get("_decode")  # set by RequestOutput: a token's text alone
        texts: dict[int, str] = self.__dict__.setdefault("_texts", {})  # decoded once per token id

        def text(t: int) -> str | None:
            if decode is None:
                return None
            if t not in texts:
                texts[t] = decode([t])
            return texts[t]

        out = []
        for e in self.token_logprobs:
            entries = {e.token: Logprob(e.logprob, e.rank, text(e.token))}
            for rank, (t, v) in enumerate(e.top, start=1):
                entries.setdefault(t, Logprob(v, rank, text(t)))
            out.append(entries)
        return out

    @token_ids.setter
    def token_ids(self, ids: list[int]) -> None:
        self.output_ids = ids


class RequestOutput:
    """A request's output, updated as events arrive; iterate it (``for``/``async for``)
    to stream, or call ``result()`` / ``await aresult()`` for the final state.

    Stop strings: the text is cut before the first stop string found, ``token_ids`` keep
    the shortest prefix whose text contains it, and the request is cancelled (its KV
    blocks freed). While streaming, a trailing partial stop string or incomplete
    character is held back until it resolves.
    """

    def __init__(self, llm: "LLM", handle: RequestHandle, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, index: int = 0) -> None:
        self.llm = llm
        self.handle = handle
        self.request_id = handle.id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.outputs = [CompletionOutput(index=index, token_logprobs=None if params.logprobs is None else [])]
        self.outputs[0]._decode = llm.tokenizer.decode  # type: ignore[attr-defined]  # Logprob.decoded_token
        self.finished = False
        self.error: str | None = None
        self._text = IncrementalDetokenizer(llm.tokenizer)  # the text of the output ids, O(new tokens) per event
        self._stop_id: int | None = None  # the stop token (stop_token_ids) that ended it, once one has

    def __repr__(self) -> str:
        """vLLM's and TensorRT-LLM's shape: the request id, the prompt and its outputs (text, ids,
        finish reason), with ``finished``."""
        outs = ", ".join(f"CompletionOutput(index={o.index}, text={o.text!r}, token_ids={o.token_ids}, "
                         f"finish_reason={o.finish_reason!r})" for o in self.outputs)
        return (f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, outputs=[{outs}], finished={self.finished})")

    # ------------------------------------------------------------------ events
    def _apply(self, event: TokenEvent) -> bool:
        """Fold one event in; True when the visible output changed (or it finished)."""
        if self.finished:
            return False
        out = self.outputs[0]
        before_text, before_ids = out.text, len(out.token_ids)
        searched = len(self._text.text)  # text already searched for stop strings
        out.token_ids = list(out.token_ids)  # a new list per update: one handed out earlier stays as it was
        if out.token_logprobs is not None:
            out.token_logprobs = list(out.token_logprobs)
        if event.tokens:
            out.add(event)
            stop_token = event.tokens[-1] in (self.params.stop_token_ids or ())  # it ended the request (commit)
            # vLLM's: a stop token stays in token_ids, its text is not added (as the end token's is not)
            self._text.push(event.tokens[:-1] if stop_token else event.tokens)
            if stop_token:  # one that is also the end token ends it as the end token, with no stop_reason (vLLM's)
                self._stop_id = None if event.tokens[-1] == self.handle.request.end_id else event.tokens[-1]
        if event.finish_reason is not None:
            self.finished = True
            out.finish_reason = api_finish_reason(event.finish_reason)
            if event.finish_reason == FINISH_ERROR:
                self.error = event.error or "generation failed"
            self._text.flush()
        ids = out.token_ids
        full = self._text.text
        stops = self.params.stop or ()
        if self.params.min_tokens > 1:  # a stop string counts only where it needs the min_tokens-th token
            searched = max(searched, len(decode_text(self.llm.tokenizer, ids[: self.params.min_tokens - 1])))
        hit = find_stop(full, stops, searched)
        if hit is not None:
            cut, stop = hit
            keep = stop_token_count(self.llm.tokenizer, ids, stop, at=cut)
            del ids[keep:]
            del out.draft_flags[keep:]
            if out.token_logprobs is not None:
                del out.token_logprobs[keep:]
            out.text, out.stop_reason, out.finish_reason = full[:cut], stop, "stop"
            out.accepted = sum(out.draft_flags)
            self.finished = True
            self.handle.stop()
        elif self.finished:
            out.text = full.rstrip(REPLACEMENT)  # a character cut by the end never completes: drop it
            out.stop_reason = self._stop_id
        else:
            hold = stop_hold(full, stops)
            out.text = full[: len(full) - hold] if hold else full
        out.finished = out.finish_reason == "stop"  # ended on end_id or a stop string (SequenceResult's meaning)
        if not out.text.startswith(before_text):  # a decoder that rewrote shown text: resend all
            before_text = ""
        out.text_diff = out.text[len(before_text):]
        out.token_ids_diff = out.token_ids[before_ids:]
        return self.finished or bool(out.text_diff) or bool(out.token_ids_diff)

    def _check(self) -> "RequestOutput":
        if self.error is not None:
            raise RuntimeError(f"request {self.request_id} failed: {self.error}")
        return self

    # ------------------------------------------------------------------ sync
    def __iter__(self) -> Iterator["RequestOutput"]:
        if self.finished:
            yield self._check()
            return
        for event in self.handle.events():
            if self._apply(event):
                yield self._check()
            if self.finished:
                return

    def result(self) -> "RequestOutput":
        for _ in self:
            pass
        return self._check()

    # ------------------------------------------------------------------ async
    async def __aiter__(self) -> AsyncIterator["RequestOutput"]:
        if self.finished:
            yield self._check()
            return
        async for event in self.handle.aevents():
            if self._apply(event):
                yield self._check()
            if self.finished:
                return

    async def aresult(self) -> "RequestOutput":
        async for _ in self:
            pass
        return self._check()

    def abort(self) -> None:
        """Cancel the request; it leaves the batch before the next step."""
        self.handle.cancel()


class LLM:
    """A model ready to generate: an engine, its tokenizer, a drafter and the scheduler.

    ``model``: an engine directory, or a Hugging Face Llama directory or GGUF file, which
    is converted and built once into ``cache_dir`` (:mod:`.model_cache`). ``tokenizer``:
    a directory (default: the engine's). ``speculative_config``: an
    :class:`NGramDecodingConfig` (prompt lookup), a :class:`LookaheadDecodingConfig`, or
    ``None`` (plain decoding). ``draft_length_policy``: ``None`` means the project's one
    default, :data:`promptlookup.defaults.DEFAULT_DRAFT_LENGTH_POLICY` (``"cost"``, as in
    ``decoding.generate``, ``run.py`` and ``serve.py``; read as ``"full"`` by the TensorRT-LLM
    backend, which verifies every draft). ``draft_token_budget``: see
    :mod:`promptlookup.decoding.draft_budget`. Close it (``shutdown()`` or ``with``) to stop
    the scheduler thread. ``runtime_config`` (device, CPU threads, ...) goes whole to the
    runner; ``device`` alone is its shorthand.

    ``backend``: ``"auto"``/``"torch"`` (this project's runtime, above) or ``"trtllm"``:
    ``model`` is a Hugging Face checkpoint directory run by TensorRT-LLM's own LLM API, with
    the speculative config mapped onto the installed release (:mod:`.trtllm_llm`; ``generate``
    only, and whatever TensorRT-LLM would not honour is refused in one line).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        tokenizer: str | os.PathLike[str] | Any = None,
        *,
        speculative_config: NGramDecodingConfig | LookaheadDecodingConfig | None = None,
        kv_cache_config: KvCacheConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        build: AutoBuild | None = None,
        device: str | None = None,
        draft_length_policy: str | None = None,
        draft_token_budget: int | None = None,
        backend: str = DEFAULT_BACKEND,
        runtime_config: RuntimeConfig | None = None,
    ) -> None:
        from ..decoding import drafter_for
        from ..engine.load import load_runner

        if speculative_config is not None and not isinstance(
            speculative_config, (NGramDecodingConfig, LookaheadDecodingConfig)
        ):
            raise UserError(f"speculative_config must be an NGramDecodingConfig or LookaheadDecodingConfig, "
                            f"got {type(speculative_config).__name__}")
        if speculative_config is None:  # nothing would read them
            unread = [name for name, v in (("draft_length_policy", draft_length_policy),
                                           ("draft_token_budget", draft_token_budget)) if v is not None]
            if unread:
                raise UserError(f"{' and '.join(unread)} shape{'s' if len(unread) == 1 else ''} speculative decoding, "
                                "which is off (speculative_config=None); pass an NGramDecodingConfig or "
                                f"LookaheadDecodingConfig, or drop {'it' if len(unread) == 1 else 'them'}")
        if draft_length_policy is None:  # the default, which TensorRT-LLM (no step-cost table) reads as full
            draft_length_policy = "full" if backend == "trtllm" else DEFAULT_DRAFT_LENGTH_POLICY
        if draft_length_policy not in DRAFT_LENGTH_POLICIES:
            raise UserError(f"unknown draft length policy {draft_length_policy!r}; choose cost or full")
        runtime = RuntimeConfig.resolve(runtime_config, device)
        from ..runtime.device import resolve_device

        resolve_device(runtime.device, "device" if runtime_config is None else "runtime_config.device")  # named here
        kv = kv_cache_config or KvCacheConfig()
        if not isinstance(kv, KvCacheConfig):
            raise UserError(f"kv_cache_config must be a KvCacheConfig, got {type(kv).__name__}")
        self.speculative_config = speculative_config
        if backend not in BACKENDS:
            raise UserError(f"backend {backend!r} is not a backend; choose auto, torch or trtllm")
        self.trtllm: Any = None
        if backend == "trtllm":
            from .trtllm_llm import TrtllmGeneration, refuse_unmapped

            refuse_unmapped(draft_length_policy=draft_length_policy, draft_token_budget=draft_token_budget,
                            device=device, cache_dir=cache_dir, build=build, kv=kv, runtime_config=runtime_config)
            self.tokenizer = _tokenizer(tokenizer, model)
            self.trtllm = TrtllmGeneration(model, self.tokenizer, speculative_config, kv)
            self.runner = self.drafter = self.scheduler = None
            return
        runtime.apply_threads()  # before a build measures its step costs
        self.engine_dir: Path = resolve_engine(model, cache_dir=cache_dir, build=build)
        self.tokenizer = _tokenizer(tokenizer, self.engine_dir)
        self.runner = load_runner(self.engine_dir, runtime, kv, backend=backend)
        if not self.runner.capabilities.live_batch:
            raise UserError(f"{self.engine_dir} is a TensorRT-LLM engine; the promptlookup LLM API runs PyTorch "
                            "engines (use TensorRT-LLM's own LLM API for it)")
        limits = self.runner.limits
        self.drafter = None
        step_costs = batch_costs = None
        if isinstance(speculative_config, NGramDecodingConfig):
            k = speculative_config.max_draft_len
            if k > limits.max_draft_len:
                raise UserError(f"max_draft_len {k} exceeds the engine's max_draft_len {limits.max_draft_len}; "
                                f"lower it or rebuild with --max_draft_len {k}")
            self.drafter = drafter_for(speculative_config.draft_config(), self.runner.capabilities, workflow="v2",
                                       end_id=None, tokenizer=self.tokenizer)
        lookahead = None
        if isinstance(speculative_config, LookaheadDecodingConfig):
            from ..decoding.lookahead import step_tokens

            lookahead = speculative_config.lookahead_config()
            need = step_tokens(lookahead)
            if need > limits.max_draft_len:
                raise UserError(f"LookaheadDecodingConfig{list(lookahead.triple)} feeds up to {need} draft tokens per "
                                f"step, more than the engine's max_draft_len {limits.max_draft_len}; rebuild with "
                                f"--max_draft_len {need} or use a smaller window")
        if speculative_config is not None and draft_length_policy == "cost":
            step_costs = self.runner.step_cost_table  # measured when the engine was built (None: full drafts)
            batch_costs = self.runner.batch_step_costs  # the same for batched steps (None: from the table above)
        self.scheduler = Scheduler(self.runner, self.drafter, token_budget=draft_token_budget, step_costs=step_costs,
                                   lookahead=lookahead, batch_costs=batch_costs)

    # ------------------------------------------------------------------ text
    @property
    def limits(self):
        return self.runner.limits

    @property
    def default_end_id(self) -> int:
        end = self.tokenizer.eos_token_id
        if end is None:
            raise UserError("the tokenizer defines no end-of-sequence token; pass SamplingParams(end_id=...)")
        return int(end)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_text(self.tokenizer, ids)

    def encode(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt: text is tokenized as given (no chat template);
        token ids are used exactly."""
        if isinstance(prompt, str):
            return prompt, encode_text(self.tokenizer, prompt, use_chat_template=False)
        if isinstance(prompt, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise UserError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    # ------------------------------------------------------------------ generation
    def _submit(self, prompt: str | Sequence[int], params: SamplingParams, request_id: int,
                loop: asyncio.AbstractEventLoop | None, index: int = 0, where: str = "prompt") -> RequestOutput:
        """Queue one request; ``where`` names its prompt in errors (``prompts[2]``)."""
        if not isinstance(params, SamplingParams):
            raise UserError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self.encode(prompt)
        check_prompt_ids(where, ids, params.max_tokens, self.limits)
        end_id = params.end_id if params.end_id is not None else self.default_end_id
        if params.ignore_eos:
            end_id = self.limits.vocab_size  # outside the vocabulary: never produced
        check_vocab(params, end_id, self.limits.vocab_size)
        request = GenerationRequest(ids, params.max_tokens, end_id, params.sampling_config(), request_id)
        return RequestOutput(self, self.scheduler.submit(request, loop), text, ids, params, index)

    def generate(
        self,
        inputs: str | Sequence[int] | Sequence[str | Sequence[int]],
        sampling_params: SamplingParams | Mapping[str, Any] | Sequence[SamplingParams | Mapping[str, Any]] | None = None,
        **unknown: Any,
    ) -> RequestOutput | list[RequestOutput]:
        """Generate for one prompt (returns one output) or a list (returns a list). A prompt is a
        string, a list of token ids, or TensorRT-LLM's/vLLM's prompt dict (``{"prompt": text}``,
        ``{"prompt_token_ids": ids}``).

        All prompts join the live batch at once and run together. ``sampling_params``: one
        ``SamplingParams`` (or a dict of its fields) for every prompt, or one per prompt.
        With ``n > 1`` each output's ``outputs`` holds ``n`` samples (:mod:`.samples`).
        Bad arguments raise ``TypeError``/``ValueError`` naming them (:mod:`.validation`).
        """
        refuse_keywords("generate", unknown, "inputs (the prompts) and sampling_params")
        prompts, single = prompt_list(inputs)
        if not prompts:
            return []
        results = self._generate_all(prompts, sampling_params_list(sampling_params, len(prompts)),
                                     _names("prompt", "prompts", len(prompts), single))
        return results[0] if single else results

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Mapping[str, Any] | Sequence[SamplingParams | Mapping[str, Any]] | None = None,
        **unknown: Any,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: one conversation (a list of ``{"role", "content"}`` dicts) or a
        list of them, each rendered by the tokenizer's chat template with the generation prompt
        (:func:`~promptlookup.text.chat_ids`) and generated as ``generate`` of those token ids.
        ``content`` may be a list of text parts (concatenated; other part types are refused) or
        ``None`` on an assistant turn. Returns a list of outputs (one per conversation), as vLLM."""
        refuse_keywords("chat", unknown, "messages and sampling_params")
        conversations, single = chat_conversations(messages)
        if not has_chat_template(self.tokenizer):
            raise ParamValueError("chat(): this model's tokenizer has no chat template; format the prompt yourself "
                                  "and call generate()")
        prompts = [chat_ids(self.tokenizer, c) for c in conversations]
        return self._generate_all(prompts, sampling_params_list(sampling_params, len(prompts)),
                                  _names("messages", "messages", len(prompts), single))

    def _generate_all(self, prompts: list[str | list[int]], params: list[SamplingParams],
                      names: list[str]) -> list[RequestOutput]:
        """Every prompt's ``n`` samples run together; one finished output per prompt. ``names``:
        each prompt's name in errors (``prompts[2]``)."""
        runs = samples.expand(prompts, params)
        if self.trtllm is not None:
            done = self.trtllm.generate([self.encode(r.prompt) for r in runs], [r.params for r in runs],
                                        self.default_end_id, self.decode)
        else:
            outputs: list[RequestOutput] = []
            try:
                for r in runs:
                    outputs.append(self._submit(r.prompt, r.params, r.request_id, None, r.index, names[r.owner]))
            except BaseException:
                for o in outputs:
                    o.abort()
                raise
            done = [o.result() for o in outputs]
        return samples.gather(done, runs, params)

    def generate_async(
        self,
        inputs: str | Sequence[int],
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        streaming: bool = False,
        *,
        request_id: int = 0,
        index: int = 0,
        **unknown: Any,
    ) -> RequestOutput:
        """Submit one prompt and return at once. In async code, ``async for`` the result to
        stream (every update with ``streaming=True``, else only the final one) or
        ``await out.aresult()``; in sync code, iterate it or call ``result()``.

        ``request_id`` keys the sampling noise with the seed (same seed and request id: same
        sample; the server gives an unseeded request a fresh random one); ``index`` is the
        output's ``CompletionOutput.index`` (the choice number of ``n`` samples). One sequence
        per call: ``n > 1`` is refused (use ``generate``/``chat``)."""
        refuse_keywords("generate_async", unknown, "inputs (one prompt), sampling_params, streaming, request_id "
                        "and index")
        if self.trtllm is not None:
            raise UserError("LLM(backend='trtllm') offers generate() only; stream with TensorRT-LLM's own "
                            "LLM.generate_async, or use backend='torch'")
        prompts, single = prompt_list(inputs)
        if not single:
            raise ParamTypeError("generate_async() takes one prompt (a string or a list of token ids); use "
                                 "generate() for a list")
        params = sampling_params_list(sampling_params, 1)[0]
        if params.n > 1:
            raise ParamValueError(f"generate_async() streams one sequence, got n={params.n}; use generate() or "
                                  "chat() for several samples")
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if not isinstance(streaming, bool):
            raise ParamTypeError(f"streaming must be True or False, got {streaming!r}")
        check_int("request_id", request_id, 0)
        check_int("index", index, 0)
        out = self._submit(prompts[0], params, request_id, loop, index)
        if not streaming:
            return _FinalOnly(out)
        return out

    def shutdown(self) -> None:
        """Cancel what is running, stop the scheduler thread (idempotent) and save the
        dynamic n-gram cache, if one is configured."""
        if self.trtllm is not None:
            self.trtllm.shutdown()
            return
        self.scheduler.close()
        if self.drafter is not None:
            self.drafter.save()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _names(one: str, many: str, count: int, single: bool) -> list[str]:
    """How errors name each input: ``one`` alone, else ``many[i]``."""
    return [one] if single else [f"{many}[{i}]" for i in range(count)]


class _FinalOnly(RequestOutput):
    """A non-streaming ``generate_async`` result: iteration yields only the final output."""

    def __init__(self, inner: RequestOutput) -> None:
        self.__dict__.update(inner.__dict__)

    def __iter__(self) -> Iterator[RequestOutput]:
        for _ in super().__iter__():
            pass
        yield self._check()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        async for _ in super().__aiter__():
            pass
        yield self._check()
