"""Recording stand-ins for TensorRT-LLM's ModelRunnerCpp and LLM API (no GPU needed).

The fakes behave like the real objects where the adapter depends on it: a deterministic
greedy "target" (the next token is a function of the sequence) verifies external drafts
the way a draft_tokens_external engine does, and outputs have TensorRT-LLM's layout
(``output_ids`` [batch, beams, max_seq_len] holding input + output, padded with end_id).

Every fake entry point accepts exactly what TensorRT-LLM's accepts: calls are bound
against TensorRT-LLM 1.0's signatures (see :mod:`.signatures` for the sources and
commits), and against the installed TensorRT-LLM's where it is importable. An unknown
keyword raises ``TypeError``, so a misspelt argument cannot pass unnoticed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .signatures import (
    KV_CACHE_CONFIG,
    LLM_GENERATE_ASYNC,
    LLM_INIT,
    MODEL_RUNNER_FROM_DIR,
    MODEL_RUNNER_GENERATE,
    NGRAM_DECODING_CONFIG,
    LOOKAHEAD_DECODING_CONFIG,
    SAMPLING_PARAMS,
    Api,
    check_call,
)

Target = Callable[[Sequence[int]], int]


def cycle_target(vocab: int = 50, offset: int = 7) -> Target:
    """Next token depends only on the last token: text settles into cycles (lookup-friendly)."""
    return lambda seq: (seq[-1] * 3 + offset) % vocab + 1


def greedy(target: Target, prompt: Sequence[int], n: int, end_id: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = target(seq)
        out.append(t)
        seq.append(t)
        if t == end_id:
            break
    return out


def write_engine(
    path: Path,
    *,
    tp: int = 1,
    pp: int = 1,
    max_batch_size: int = 4,
    max_input_len: int = 64,
    max_seq_len: int = 128,
    max_draft_len: int = 10,
    vocab_size: int = 64,
    speculative_decoding_mode: Any = 2,
    use_paged_context_fmha: bool | None = True,
    ranks: int | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    build: dict[str, Any] = dict(
        max_batch_size=max_batch_size,
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        max_beam_width=1,
        max_draft_len=max_draft_len,
        speculative_decoding_mode=speculative_decoding_mode,
        plugin_config={} if use_paged_context_fmha is None else {"use_paged_context_fmha": use_paged_context_fmha},
    )
    config = {
        "version": "1.0.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "vocab_size": vocab_size,
            "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        },
        "build_config": build,
    }
    (path / "config.json").write_text(json.dumps(config))
    for r in range(tp * pp if ranks is None else ranks):
        (path / f"rank{r}.engine").write_bytes(b"")
    return path


class FakeModelRunnerCpp:
    """Records ``from_dir`` and ``generate`` calls; verifies drafts against ``target``."""

    target: Target = staticmethod(cycle_target())
    continue_after_end = False  # emulate garbage after end_id, to test the cut
    instances: list["FakeModelRunnerCpp"] = []

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.from_dir_kwargs = kwargs
        self.calls: list[dict[str, Any]] = []
        self.max_seq_len = json.loads((Path(kwargs["engine_dir"]) / "config.json").read_text())["build_config"][
            "max_seq_len"
        ]

    @classmethod
    def from_dir(cls, engine_dir: str, **kwargs: Any) -> "FakeModelRunnerCpp":
        check_call(MODEL_RUNNER_FROM_DIR, engine_dir, **kwargs)
        runner = cls(dict(kwargs, engine_dir=engine_dir))
        cls.instances.append(runner)
        return runner

    def _continue(self, seq: list[int], draft: list[int] | None, budget: int, end_id: int) -> list[int]:
        new: list[int] = []
        if draft is not None:  # one verification step: agreeing prefix, then the target's own
            for d in draft:
                if len(new) == budget or self.target(seq + new) != d:
                    break
                new.append(d)
                if d == end_id:
                    break
            if len(new) < budget and (not new or new[-1] != end_id):
                new.append(self.target(seq + new))
        else:  # plain decoding
            while len(new) < budget and (not new or new[-1] != end_id):
                new.append(self.target(seq + new))
        if self.continue_after_end and end_id in new:
            new += [5, 6, 7][: budget - len(new)]
        return new

    def generate(self, batch_input_ids: list[torch.Tensor], **kwargs: Any) -> dict[str, torch.Tensor]:
        check_call(MODEL_RUNNER_GENERATE, batch_input_ids, **kwargs)
        self.calls.append(dict(kwargs, batch_input_ids=batch_input_ids))
        end_id = kwargs["end_id"]
        drafts = kwargs.get("draft_tokens_list")
        rows, lengths = [], []
        for i, ids in enumerate(batch_input_ids):
            assert ids.dtype == torch.int32 and ids.dim() == 1
            seq = ids.tolist()
            new = self._continue(seq, None if drafts is None else list(drafts[i]), kwargs["max_new_tokens"], end_id)
            full = seq + new
            lengths.append([len(full)])
            rows.append([full + [end_id] * (self.max_seq_len - len(full))])
        return {
            "output_ids": torch.tensor(rows, dtype=torch.int32),
            "sequence_lengths": torch.tensor(lengths, dtype=torch.int32),
        }


class Recorder:
    """Stands in for a keyword-only config class: checks and keeps its keyword arguments."""

    api: Api

    def __init__(self, **kwargs: Any) -> None:
        check_call(self.api, **kwargs)
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kwargs})"


class FakeNGramDecodingConfig(Recorder):
    api = NGRAM_DECODING_CONFIG


class FakeLookaheadDecodingConfig(Recorder):
    api = LOOKAHEAD_DECODING_CONFIG


class FakeKvCacheConfig(Recorder):
    api = KV_CACHE_CONFIG


class FakeSamplingParams(Recorder):
    api = SAMPLING_PARAMS


@dataclass
class FakeSpecMetrics:
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0


@dataclass
class FakePerfMetrics:
    speculative_decoding: FakeSpecMetrics = field(default_factory=FakeSpecMetrics)


@dataclass
class FakeCompletion:
    token_ids: list[int]
    finish_reason: str | None = None
    request_perf_metrics: FakePerfMetrics | None = None


@dataclass
class FakeBareCompletion:
    """A completion output with no ``request_perf_metrics`` attribute at all."""

    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class FakeResponse:
    outputs: list[FakeCompletion]


class FakeLLM:
    """Streams each request in chunks of ``chunk_sizes`` (cycled), as NGram iterations would.

    A chunk of n tokens stands for n - 1 accepted draft tokens plus one of the target's
    own; the perf metrics report ``drafted_per_step`` draft tokens per step after the first.
    """

    target: Target = staticmethod(cycle_target())
    chunk_sizes: Sequence[int] = (1, 3, 1, 4, 2)
    drafted_per_step = 4
    omit_end_id = False  # TensorRT-LLM may leave end_id out of the returned ids
    # "reported": request_perf_metrics with speculative_decoding counts; "none": the
    # attribute is None; "no_spec": metrics without speculative_decoding; "absent": no attribute
    metrics = "reported"
    instances: list["FakeLLM"] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        check_call(LLM_INIT, model, **kwargs)
        self.kwargs = dict(kwargs, model=model)
        self.requests: list[tuple[list[int], Any, bool]] = []
        self.shut_down = False
        FakeLLM.instances.append(self)

    def shutdown(self) -> None:
        self.shut_down = True

    def generate_async(self, inputs: list[int], sampling_params: Any = None, streaming: bool = False, **kwargs: Any):
        check_call(LLM_GENERATE_ASYNC, inputs, sampling_params=sampling_params, streaming=streaming, **kwargs)
        self.requests.append((inputs, sampling_params, streaming))
        p = sampling_params.kwargs
        full = greedy(self.target, inputs, p["max_tokens"], p["end_id"])
        stopped = bool(full) and full[-1] == p["end_id"]
        shown = full[:-1] if stopped and self.omit_end_id else full
        responses, pos, step = [], 0, 0
        while pos < len(shown) or not responses:
            size = self.chunk_sizes[step % len(self.chunk_sizes)]
            pos = min(len(shown), pos + size)
            step += 1
            done = pos >= len(shown)
            finish = ("stop" if stopped else "length") if done else None
            completion: Any
            if self.metrics == "absent":
                completion = FakeBareCompletion(token_ids=list(shown[:pos]), finish_reason=finish)
            else:
                metrics: Any = None
                if self.metrics == "reported":
                    metrics = FakePerfMetrics(FakeSpecMetrics(total_draft_tokens=self.drafted_per_step * (step - 1)))
                elif self.metrics == "no_spec":
                    metrics = object()  # perf metrics without a speculative_decoding member
                completion = FakeCompletion(token_ids=list(shown[:pos]), finish_reason=finish, request_perf_metrics=metrics)
            responses.append(FakeResponse([completion]))
        return iter(responses)
