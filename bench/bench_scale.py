#!/usr/bin/env python3
"""Plain decoding speed at real model shapes against the weight-read limit, side by side with Hugging Face.

What it measures (issue 14), per shape and batch size, in one run on one device:

- ``hf``: transformers ``generate()`` (greedy, ``min_new_tokens == max_new_tokens``, so
  every run makes exactly ``--new_tokens`` tokens);
- ``ours``: our runtime's plain greedy decoding (``promptlookup.decoding.generate`` on a
  :class:`TorchRunner`, with CUDA graphs on a GPU, and ``--torch_compile inductor`` if asked);
- the **weight-read limit** of a decoding step: the bytes every step must read (all
  projection matrices, the norms and the LM head, plus ``B`` embedding rows) divided by
  the device's memory bandwidth, measured in the same run as the best of 20
  device-to-device copies of ``--copy_mib`` MiB (read plus write bytes counted). The
  figure of merit is ``limit_ms / ours_ms_per_token``; the KV cache the step also reads
  is recorded apart (``kv_read_bytes``, ``limit_with_kv_ms``), not counted in the limit;
- with ``--lookup_k`` > 0: our V2 prompt lookup (``[k, n]`` pool) against our plain
  decoding at the same batch. The models have random weights, so whatever a draft
  matches is chance: these rows feed every sequence a repetitive prompt (one random
  chunk of ``--chunk`` tokens repeated) and report tokens and accepted draft tokens per
  step; they say nothing about acceptance on real text;
- with ``--weight_only int8,int4g128,...``: our plain decoding on the same random weights with
  the decoder's projections quantized as ``convert_checkpoint.py --use_weight_only`` stores
  them (on a GPU the products run in :mod:`promptlookup.runtime.gpu_quant`), against our float
  run: time per token, the ratio, the resident weights, and the fraction of the weight-read
  limit counted with the quantized bytes (``weight_only_rows`` in the JSON). Needs
  ``--torch_compile off``, as quantized engines are not compiled.

The models are Llama configurations built in code (no download) with random weights
from ``--seed``, created directly on the device in the target dtype (no float32 copy on
the host first). Shapes: ``llama-3.2-1b`` (hidden 2048, 16 layers, 32 heads, 8 KV heads,
head_dim 64, MLP 8192, vocabulary 128256, tied, rope_theta 500000; Llama 3's rope
scaling is left out, which costs the same), ``llama-3.1-8b`` (hidden 4096, 32 layers, 32
heads, 8 KV heads, MLP 14336, vocabulary 128256, untied), ``smollm2`` (SmolLM2-135M's
shape) and ``tiny`` (4 layers, hidden 64: the CPU smoke test). Prompts are random token ids,
``--context`` of them per sequence; there is no end token, so lengths are fixed.

How it times. Each shape first runs Hugging Face (warm-up, then ``--reps`` timings at
every batch size), then frees that model and builds ours from the same tensors
(:class:`PagedLlama` consumes the state dict, so the weights are held once, plus one
layer's fused copy while it builds). Ours then captures its CUDA graphs and compiles its
buckets (``runner.graphs.warmup``, ``runner.compiled.warmup``) before anything is timed;
that set-up is reported apart (``setup``). The decode time per token is
``(t(N) - t(1)) / (N - 1)``, with ``t(n)`` the median over ``--reps`` of a generate call
making ``n`` new tokens (so the prefill and the first token cancel out); on a GPU each
call is bracketed by ``torch.cuda.synchronize()`` and timed with ``time.perf_counter()``.
Without block reuse (off here) every call prefills afresh. On a CPU only ratios are
reported (ours over HF, the fraction of the limit, lookup over plain): absolute times
there depend on the machine's load, so none is printed or written.

Exactness: in float32 ours must equal HF token for token (and V2 lookup must equal our
plain decoding); a mismatch is printed and makes the run exit 1, after the JSON is written.
In half precision the comparison is only recorded (``tokens_identical``): random weights
give near-uniform logits, and a one-ulp difference flips a near-tie.

Cost: one model per shape at a time on the device, and the KV pool sized to
``max(batch_sizes)`` sequences of ``context + new_tokens + lookup_k + 1`` tokens. With
``--torch_compile inductor`` every (batch, tokens) bucket is one compile (tens of seconds
for a real model), and lookup adds the draft-length buckets, so lookup is off by default
there (``--lookup_k`` default: 10 with ``--torch_compile off``, 0 with inductor).

On a GPU (the table of issue 14; no GPU figure has been measured yet)::

    python bench/bench_scale.py --device cuda --shapes smollm2,llama-3.2-1b,llama-3.1-8b \\
        --batch_sizes 1,8 --torch_compile inductor

and, for batch 8 V2 lookup over batch 8 plain, the same without ``--torch_compile inductor``.
The CPU smoke test: ``python bench/bench_scale.py --shapes tiny --device cpu --batch_sizes 1
--new_tokens 4 --context 16 --reps 1``.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runtime import ROOT, machine  # noqa: E402  (ROOT on sys.path, HF_HUB_OFFLINE, OpenMP policy before torch)
from bench.machine import machine_info  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from promptlookup.checkpoint.layout import Layout, hf_layer_name  # noqa: E402
from promptlookup.checkpoint.quant_spec import HF_QUANT_LINEARS, QuantSpec, check_spec  # noqa: E402
from promptlookup.checkpoint.quantize import quantize_weight  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402
from promptlookup.decoding import generate  # noqa: E402
from promptlookup.defaults import COMPILE_MODES, DEFAULT_COMPILE_MODE  # noqa: E402
from promptlookup.drafting.base import DraftConfig  # noqa: E402
from promptlookup.errors import UserError  # noqa: E402
from promptlookup.evaluation.sweep import parse_int_list  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime.base import EngineLimits  # noqa: E402
from promptlookup.runtime.device import resolve_device, synchronize  # noqa: E402
from promptlookup.runtime.paged_llama import PagedLlama  # noqa: E402
from promptlookup.runtime.results import SequenceResult  # noqa: E402
from promptlookup.runtime.torch_runner import TorchRunner  # noqa: E402
from promptlookup.threads import configure_threads  # noqa: E402

NO_END_ID = -1  # no token ends a sequence: every run makes exactly the tokens asked for
COPY_REPS = 20  # device-to-device copies behind the bandwidth figure (the best counts)
TOKENS_PER_BLOCK = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Targets of issue 14 (fraction of the weight-read limit, ours plain) and of lookup.
LIMIT_TARGETS = {"llama-3.2-1b": 0.60, "llama-3.1-8b": 0.75}
LOOKUP_TARGET = (8, 2.0)  # batch 8: V2 lookup at least 2x plain decoding

_LLAMA3 = dict(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
               max_position_embeddings=131072)
SHAPES: dict[str, dict[str, Any]] = {
    # initializer_range 0.08 (HF's default: 0.02) widens the tiny model's logits so that
    # greedy choices are far from ties, as tests/tiny.py does: the smoke test's token check.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=2048,
                 initializer_range=0.08),
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                    max_position_embeddings=8192),
    "llama-3.2-1b": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                         tie_word_embeddings=True),
    "llama-3.1-8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                         tie_word_embeddings=False),
}


def shape_config(name: str) -> LlamaConfig:
    """The Llama configuration of shape ``name`` (no end, start or padding token)."""
    return LlamaConfig(**SHAPES[name], hidden_act="silu", rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)


def random_model(config: LlamaConfig, device: str, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` with Hugging Face's random initialisation from ``seed``, its
    tensors allocated and initialised on ``device`` in ``dtype`` (no host copy first).
    Cost: the model's weights on the device, one pass of random fills."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def random_prompts(vocab: int, batch: int, context: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``context`` uniform random token ids."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, context), generator=gen).tolist()


def repetitive_prompts(vocab: int, batch: int, context: int, chunk: int, seed: int) -> list[list[int]]:
    """``batch`` prompts of ``context`` tokens, each one random ``chunk``-token piece repeated."""
    pieces = random_prompts(vocab, batch, min(chunk, context), seed + 1)
    return [(p * (context // len(p) + 1))[:context] for p in pieces]


def weight_read_bytes(config: LlamaConfig, batch: int, itemsize: int) -> int:
    """Bytes of weights one decoding step of ``batch`` sequences reads: every projection
    (Q/K/V, O, gate/up, down), every norm and the LM head once, plus ``batch`` rows of the
    embedding table (the lookup reads only those)."""
    h, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter + 2 * h
    elements = config.num_hidden_layers * per_layer + config.vocab_size * h + h + batch * h
    return elements * itemsize


def kv_read_bytes(config: LlamaConfig, attended: int, itemsize: int) -> int:
    """Bytes of K and V one decoding step reads when its sequences attend to ``attended``
    cached positions in all (summed over the batch)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * attended * itemsize


def copy_bandwidth(device: str, nbytes: int, reps: int = COPY_REPS) -> float:
    """Memory bandwidth of ``device`` in bytes/s: the best of ``reps`` copies of ``nbytes``
    into another buffer, counting the bytes read and written. Cost: ``2 * nbytes`` of memory."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch of the pages, not timed
    best = min(timed(lambda: dst.copy_(src), device)[0] for _ in range(reps))
    return 2 * src.nbytes / best


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Wall seconds of ``fn()`` between two device synchronisations, and its result."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


@dataclass
class Timing:
    """Medians over the repetitions: ``first_s`` a call making one token (prefill and first
    token), ``total_s`` one making ``new_tokens``; ``per_token_s`` the decode phase per token."""

    first_s: float
    total_s: float
    per_token_s: float


def decode_timing(run: Callable[[int], Any], new_tokens: int, reps: int, device: str) -> tuple[Timing, Any]:
    """Time ``run(1)`` and ``run(new_tokens)`` ``reps`` times each (alternating); return the
    medians and the last result of ``run(new_tokens)``. Cost: ``2 * reps`` calls."""
    firsts, totals, out = [], [], None
    for _ in range(reps):
        firsts.append(timed(lambda: run(1), device)[0])
        t, out = timed(lambda: run(new_tokens), device)
        totals.append(t)
    first, total = statistics.median(firsts), statistics.median(totals)
    return Timing(first, total, (total - first) / (new_tokens - 1)), out


def hf_run(model: LlamaForCausalLM, prompts: list[list[int]]) -> Callable[[int], list[list[int]]]:
    """``run(n)``: HF greedy ``generate`` of exactly ``n`` new tokens for the whole batch
    (the prompts share one length: no padding); returns the new tokens per sequence."""
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)

    def run(n: int) -> list[list[int]]:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 num_beams=1, pad_token_id=0, temperature=None, top_k=None, top_p=None)
        return out[:, ids.shape[1]:].tolist()

    return run


def ours_run(runner: TorchRunner, prompts: list[list[int]],
             draft: DraftConfig | None = None) -> Callable[[int], list[SequenceResult]]:
    """``run(n)``: our greedy decoding of exactly ``n`` new tokens per sequence (V2 prompt
    lookup when ``draft`` is given)."""
    return lambda n: generate(runner, prompts, max_new_tokens=n, end_id=NO_END_ID, draft=draft, workflow="v2")


def first_difference(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> list[int] | None:
    """``[sequence, position]`` of the first token where ``a`` and ``b`` differ, or None."""
    for s, (x, y) in enumerate(zip(a, b)):
        for p, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return [s, p]
        if len(x) != len(y):
            return [s, min(len(x), len(y))]
    return None


def build_runner(config: LlamaConfig, state: dict[str, torch.Tensor], limits: EngineLimits, compile_mode: str,
                 cuda_graph_mode: bool | None) -> TorchRunner:
    """Our runner over the weights in ``state`` (a Hugging Face state dict), consuming it:
    the parts are fused and dropped from the dict as :class:`PagedLlama` goes, so when the
    caller holds no other reference the weights stay held once (plus one layer's fused
    copy while it builds). The KV pool holds ``max_batch_size`` sequences of
    ``max_seq_len`` tokens in whole blocks; block reuse is off (every call prefills)."""
    paged = PagedLlama(config, state, dense_projections=compile_mode == "inductor")
    per_seq = -(-limits.max_seq_len // TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
    return TorchRunner(paged, limits, tokens_per_block=TOKENS_PER_BLOCK,
                       max_tokens_in_paged_kv_cache=limits.max_batch_size * per_seq,
                       kv_cache_enable_block_reuse=False, cuda_graph_mode=cuda_graph_mode, compile_mode=compile_mode)


WEIGHT_ONLY = {"int8": QuantSpec("int8"), "int8g128": QuantSpec("int8", 128), "int4g128": QuantSpec("int4", 128),
               "int4g32": QuantSpec("int4", 32)}


def quantize_state(state: dict[str, torch.Tensor], config: LlamaConfig, spec: QuantSpec) -> None:
    """Replace every decoder projection of ``state`` (a Hugging Face state dict) by its codes and
    scales as ``convert_checkpoint.py --use_weight_only`` stores them, on the weights' device
    (the LM head and the embedding stay in the float dtype, TensorRT-LLM's default)."""
    for i in range(config.num_hidden_layers):
        for suffix in HF_QUANT_LINEARS:
            name = hf_layer_name(i, suffix)
            for part, tensor in quantize_weight(spec, state.pop(name)).items():
                state[name.removesuffix("weight") + part] = tensor


def warm_up(runner: TorchRunner, max_batch: int, max_context: int, device: str) -> dict[str, float | int]:
    """Compile (``--torch_compile inductor``) and capture (CUDA graphs) every bucket a run
    of up to ``max_batch`` sequences and ``max_context`` tokens can need; returns the
    counts and the wall seconds of each."""
    out: dict[str, float | int] = {}
    if runner.compiled is not None:
        compiled = runner.compiled
        out["compile_s"], out["compiled_buckets"] = timed(lambda: compiled.warmup(max_batch, max_context), device)
    if runner.graphs is not None:
        out["capture_s"], out["captured_graphs"] = timed(lambda: runner.graphs.warmup(max_batch, max_context), device)
    return out


def free_memory(device: str) -> None:
    """Return freed tensors to the device and drop compiled graphs (between shapes)."""
    torch._dynamo.reset()
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


class Bench:
    """One run's settings and what it reports (absolute figures only on a GPU)."""

    def __init__(self, args: Any, device: str, dtype: torch.dtype, bandwidth: float) -> None:
        self.args, self.device, self.dtype, self.bandwidth = args, device, dtype, bandwidth
        self.on_gpu = torch.device(device).type == "cuda"
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.check = "required" if dtype == torch.float32 else "recorded"
        self.float_runs: dict[tuple[str, int], tuple[float, list[list[int]]]] = {}  # (shape, batch): s/token, tokens

    def absolute(self, value: float) -> float | None:
        """``value`` on a GPU; None on a CPU, where only ratios are reported."""
        return value if self.on_gpu else None

    def limits(self, config: LlamaConfig) -> EngineLimits:
        """Our runner's limits: ``max(batch_sizes)`` prompts of ``context`` tokens, room for
        ``new_tokens`` and a ``lookup_k``-token draft after them."""
        a = self.args
        return EngineLimits(max_batch_size=max(a.batch_sizes), max_input_len=a.context,
                            max_seq_len=a.context + a.new_tokens + a.lookup_k + 1, max_draft_len=a.lookup_k,
                            vocab_size=config.vocab_size)

    def plain_row(self, name: str, config: LlamaConfig, batch: int, hf: Timing, ours: Timing,
                  hf_tokens: list[list[int]], ours_tokens: list[list[int]]) -> dict[str, Any]:
        """The table row of ``name`` at ``batch``: HF and ours per token, the limit, the check."""
        a = self.args
        weights = weight_read_bytes(config, batch, self.itemsize)
        kv = kv_read_bytes(config, batch * (a.context + a.new_tokens // 2), self.itemsize)  # mid-decode
        limit = weights / self.bandwidth
        diff = first_difference(hf_tokens, ours_tokens)
        return {
            "shape": name, "batch": batch, "context": a.context, "new_tokens": a.new_tokens,
            "hf_ms_per_token": self.absolute(hf.per_token_s * 1e3),
            "ours_ms_per_token": self.absolute(ours.per_token_s * 1e3),
            "hf_prefill_ms": self.absolute(hf.first_s * 1e3), "ours_prefill_ms": self.absolute(ours.first_s * 1e3),
            "speedup_ours_over_hf": ratio(hf.per_token_s, ours.per_token_s),
            "weight_read_bytes": weights, "kv_read_bytes": kv,
            "limit_ms": self.absolute(limit * 1e3),
            "limit_with_kv_ms": self.absolute((weights + kv) / self.bandwidth * 1e3),
            "fraction_of_limit": ratio(limit, ours.per_token_s), "hf_fraction_of_limit": ratio(limit, hf.per_token_s),
            "tokens_identical": diff is None, "first_difference": diff, "token_check": self.check,
        }

    def lookup_row(self, name: str, batch: int, plain: Timing, v2: Timing, plain_out: list[SequenceResult],
                   v2_out: list[SequenceResult]) -> dict[str, Any]:
        """V2 lookup against plain decoding at ``batch`` on the repetitive prompts."""
        steps = sum(r.steps for r in v2_out)
        diff = first_difference([r.output_ids for r in plain_out], [r.output_ids for r in v2_out])
        return {
            "shape": name, "batch": batch, "k": self.args.lookup_k, "n": self.args.lookup_n,
            "plain_ms_per_token": self.absolute(plain.per_token_s * 1e3),
            "v2_ms_per_token": self.absolute(v2.per_token_s * 1e3),
            "speedup_v2_over_plain": ratio(plain.per_token_s, v2.per_token_s),
            "speedup_v2_over_plain_end_to_end": plain.total_s / v2.total_s,
            "tokens_per_step": sum(len(r.output_ids) for r in v2_out) / steps,
            "accepted_per_step": sum(r.accepted for r in v2_out) / steps,
            "tokens_identical": diff is None, "first_difference": diff, "token_check": self.check,
        }

    def measure_hf(self, model: LlamaForCausalLM,
                   prompts: list[list[int]]) -> dict[int, tuple[Timing, list[list[int]]]]:
        """HF's timing and tokens at every batch size (the first ``b`` prompts), after a warm-up."""
        a = self.args
        out = {}
        for b in a.batch_sizes:
            run = hf_run(model, prompts[:b])
            run(2)  # warm-up: lazy initialisation, kernels for these shapes
            out[b] = decode_timing(run, a.new_tokens, a.reps, self.device)
        return out

    def measure_ours(self, name: str, runner: TorchRunner, prompts: list[list[int]],
                     hf: dict[int, tuple[Timing, list[list[int]]]]) -> tuple[list[dict], list[dict]]:
        """Our plain rows against ``hf`` and (with ``--lookup_k``) V2 against plain, at every batch size."""
        a, dev, config = self.args, self.device, runner.model.config
        rows, lookup_rows = [], []
        repetitive = repetitive_prompts(config.vocab_size, len(prompts), a.context, a.chunk, a.seed)
        for b in a.batch_sizes:
            run = ours_run(runner, prompts[:b])
            run(2)  # warm-up: the eager prefill's kernels at this batch
            ours, out = decode_timing(run, a.new_tokens, a.reps, dev)
            rows.append(self.plain_row(name, config, b, hf[b][0], ours, hf[b][1], [r.output_ids for r in out]))
            self.float_runs[(name, b)] = (ours.per_token_s, [r.output_ids for r in out])
            if a.lookup_k:
                draft = DraftConfig(prompt_lookup_num_tokens=a.lookup_k, max_matching_ngram_size=a.lookup_n)
                plain, plain_out = decode_timing(ours_run(runner, repetitive[:b]), a.new_tokens, a.reps, dev)
                v2, v2_out = decode_timing(ours_run(runner, repetitive[:b], draft), a.new_tokens, a.reps, dev)
                lookup_rows.append(self.lookup_row(name, b, plain, v2, plain_out, v2_out))
        return rows, lookup_rows

    def measure_shape(self, name: str) -> tuple[list[dict], list[dict], list[dict], dict[str, Any]]:
        """Shape ``name``: HF at every batch size, then its model is dropped and ours built
        from its tensors, warmed up and measured. Returns the plain rows, the lookup rows and
        the set-up figures (seconds only on a GPU)."""
        a, dev = self.args, self.device
        config = shape_config(name)
        prompts = random_prompts(config.vocab_size, max(a.batch_sizes), a.context, a.seed)
        setup: dict[str, Any] = {}
        setup["hf_build_s"], model = timed(lambda: random_model(config, dev, self.dtype, a.seed), dev)
        hf = self.measure_hf(model, prompts)
        config, state = model.config, model.state_dict()
        del model  # the state dict now holds the only references to the weights
        limits = self.limits(config)
        setup["ours_build_s"], runner = timed(
            lambda: build_runner(config, state, limits, a.torch_compile, a.cuda_graph_mode), dev)
        del state
        setup.update(warm_up(runner, limits.max_batch_size, limits.max_seq_len, dev))
        rows, lookup_rows = self.measure_ours(name, runner, prompts, hf)
        del runner
        free_memory(dev)
        quant_rows: list[dict] = []
        for wo in a.weight_only:
            quant_rows.extend(self.measure_weight_only(name, wo, prompts, limits))
        return rows, lookup_rows, quant_rows, {k: self.absolute(v) if k.endswith("_s") else v for k, v in setup.items()}

    def measure_weight_only(self, name: str, wo: str, prompts: list[list[int]],
                            limits: EngineLimits) -> list[dict[str, Any]]:
        """Our plain decoding on the same random weights quantized as ``wo`` (codes and
        scales read by :mod:`promptlookup.runtime.gpu_quant` on a GPU), against our float run's
        rows at each batch size: time per token, the ratio, and the fraction of the
        weight-read limit counted with the quantized bytes. Tokens are recorded against the
        float run's (the weights differ, so they need not match)."""
        a, dev = self.args, self.device
        model = random_model(shape_config(name), dev, self.dtype, a.seed)
        config, state = model.config, model.state_dict()
        del model
        quantize_state(state, config, WEIGHT_ONLY[wo])
        runner = build_runner(config, state, limits, "off", a.cuda_graph_mode)
        del state
        warm_up(runner, limits.max_batch_size, limits.max_seq_len, dev)
        names = ("qkv", "o_proj", "gate_up", "down_proj")
        projections = [getattr(blk, n) for blk in runner.model.layers for n in names]
        codes = sum(pr.resident_bytes() for pr in projections)
        as_float = sum(pr.out_features * pr.qweight.shape[1] * (2 if pr.precision == "int4" else 1)
                       for pr in projections) * self.itemsize
        out = []
        for b in a.batch_sizes:
            run = ours_run(runner, prompts[:b])
            run(2)  # warm-up, as the float run
            t, res = decode_timing(run, a.new_tokens, a.reps, dev)
            float_s, float_tokens = self.float_runs[(name, b)]
            weights = weight_read_bytes(config, b, self.itemsize) - as_float + codes
            limit = weights / self.bandwidth
            out.append({
                "shape": name, "batch": b, "weight_only": wo, "context": a.context, "new_tokens": a.new_tokens,
                "ours_ms_per_token": self.absolute(t.per_token_s * 1e3),
                "speedup_over_float": ratio(float_s, t.per_token_s),
                "resident_weight_bytes": runner.model.resident_weight_bytes(), "weight_read_bytes": weights,
                "limit_ms": self.absolute(limit * 1e3), "fraction_of_limit": ratio(limit, t.per_token_s),
                "tokens_identical_to_float": first_difference([r.output_ids for r in res], float_tokens) is None,
            })
        del runner
        free_memory(dev)
        return out


def fmt(value: float | None, width: int, spec: str = ".3f") -> str:
    """``value`` right-aligned in ``width`` columns, ``-`` for a figure not reported."""
    return format("-" if value is None else format(value, spec), f">{width}")


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator`` of two times; None when either is not positive (a decode
    phase too short to time against the noise: raise ``--new_tokens``)."""
    return numerator / denominator if numerator > 0 and denominator > 0 else None


def print_tables(rows: list[dict], lookup_rows: list[dict]) -> None:
    """The plain table and, when run, the lookup table (``-``: absolute figure not reported)."""
    print(f"{'shape':13} {'batch':>5} {'HF ms/tok':>10} {'ours ms/tok':>11} {'ours/HF':>8} {'limit ms':>9} "
          f"{'of limit':>9} {'HF of limit':>11} {'identical':>10}")
    for r in rows:
        print(f"{r['shape']:13} {r['batch']:5d} {fmt(r['hf_ms_per_token'], 10)} {fmt(r['ours_ms_per_token'], 11)} "
              f"{fmt(r['speedup_ours_over_hf'], 8, '.2f')} {fmt(r['limit_ms'], 9)} "
              f"{fmt(r['fraction_of_limit'], 9, '.1%')} "
              f"{fmt(r['hf_fraction_of_limit'], 11, '.1%')} {str(r['tokens_identical']):>10}")
    if lookup_rows:
        print(f"\n{'shape':13} {'batch':>5} {'plain ms/tok':>12} {'V2 ms/tok':>10} {'V2/plain':>9} "
              f"{'tok/step':>9} {'acc/step':>9} {'identical':>10}   (repetitive random prompts)")
        for r in lookup_rows:
            print(f"{r['shape']:13} {r['batch']:5d} {fmt(r['plain_ms_per_token'], 12)} {fmt(r['v2_ms_per_token'], 10)} "
                  f"{fmt(r['speedup_v2_over_plain'], 9, '.2f')} {r['tokens_per_step']:9.2f} "
                  f"{r['accepted_per_step']:9.2f} {str(r['tokens_identical']):>10}")


def targets(rows: list[dict], lookup_rows: list[dict]) -> dict[str, float | None]:
    """Issue 14's targets against this run's figures (only those this run measured)."""
    out = {}
    for r in rows:
        if r["shape"] in LIMIT_TARGETS:
            out[f"{r['shape']} batch {r['batch']}: fraction of limit (>={LIMIT_TARGETS[r['shape']]:.2f})"] = \
                r["fraction_of_limit"]
    batch, goal = LOOKUP_TARGET
    for r in lookup_rows:
        if r["batch"] == batch:
            out[f"{r['shape']} batch {batch}: V2 over plain (>={goal:.1f}, repetitive random prompts)"] = \
                r["speedup_v2_over_plain"]
    return out


def parse_shapes(text: str) -> list[str]:
    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in names if s not in SHAPES]
    if bad or not names:
        raise UserError(f"--shapes takes a comma-separated subset of {', '.join(SHAPES)}, got {text!r}")
    return names


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_scale.py", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="smollm2,llama-3.2-1b,llama-3.1-8b",
                   help=f"comma-separated model shapes, of {', '.join(SHAPES)}")
    p.add_argument("--device", default="auto", help="auto (the GPU when one is visible), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights and KV cache; default: bfloat16 on a GPU, float32 on a CPU")
    p.add_argument("--batch_sizes", default="1,8", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=512, help="prompt tokens per sequence")
    p.add_argument("--new_tokens", type=int, default=128, help="tokens generated per sequence (at least 2)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per figure (the median counts)")
    p.add_argument("--torch_compile", choices=COMPILE_MODES, default=DEFAULT_COMPILE_MODE,
                   help="our runtime: inductor compiles each step bucket (torch.compile), off runs eagerly")
    p.add_argument("--cuda_graph_mode", action=argparse.BooleanOptionalAction, default=None,
                   help="our runtime on a GPU: replay CUDA graphs (default: on when on a GPU)")
    p.add_argument("--lookup_k", type=int, default=None,
                   help="V2 prompt lookup rows with drafts of up to k tokens, 0 for none; "
                        "default: 10 with --torch_compile off, 0 with inductor (each draft length is a compile)")
    p.add_argument("--lookup_n", type=int, default=2, help="max_matching_ngram_size of the lookup rows")
    p.add_argument("--chunk", type=int, default=64, help="lookup rows: tokens of the random piece each prompt repeats")
    p.add_argument("--copy_mib", type=int, default=None,
                   help="MiB copied to measure the bandwidth; default: 2048 on a GPU, 64 on a CPU")
    p.add_argument("--weight_only", default="",
                   help=f"comma-separated weight-only layouts also measured on the same weights, of "
                        f"{', '.join(WEIGHT_ONLY)} (with --torch_compile off; none by default)")
    p.add_argument("--seed", type=int, default=0, help="random weights and prompts")
    add_num_threads_argument(p)
    p.add_argument("--output_json", default=str(ROOT / "bench/results/scale.json"), help="where results are written")
    return p


def parse_args(argv: list[str] | None) -> Any:
    """Parsed and checked arguments, with the device-dependent defaults filled in."""
    args = build_parser().parse_args(argv)
    args.shapes = parse_shapes(args.shapes)
    args.batch_sizes = parse_int_list(args.batch_sizes, "--batch_sizes")
    for flag in ("context", "reps", "chunk", "lookup_n"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.new_tokens < 2:
        raise UserError(f"--new_tokens must be at least 2 (the decode phase is t(N) - t(1)), got {args.new_tokens}")
    args.weight_only = list(dict.fromkeys(w.strip() for w in args.weight_only.split(",") if w.strip()))
    if any(w not in WEIGHT_ONLY for w in args.weight_only):
        raise UserError(f"--weight_only takes a comma-separated subset of {', '.join(WEIGHT_ONLY)}, "
                        f"got {','.join(args.weight_only)!r}")
    for shape in args.shapes:  # a group size must divide the shape's widths (one line, before anything runs)
        layout = Layout.from_hf_config(shape_config(shape).to_dict())
        for w in args.weight_only:
            try:
                check_spec(WEIGHT_ONLY[w], layout)
            except UserError as e:
                raise UserError(f"--weight_only {w} on shape {shape}: {e}") from None
    if args.weight_only and args.torch_compile != "off":
        raise UserError("--weight_only compares with our float run without compiling (quantized engines run "
                        "eagerly): add --torch_compile off")
    if args.lookup_k is None:
        args.lookup_k = 10 if args.torch_compile == "off" else 0
    if args.lookup_k < 0:
        raise UserError(f"--lookup_k must be 0 (no lookup rows) or more, got {args.lookup_k}")
    args.device = resolve_device(args.device)
    on_gpu = torch.device(args.device).type == "cuda"
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    args.copy_mib = args.copy_mib or (2048 if on_gpu else 64)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.num_threads = configure_threads(args.num_threads)
    bench = Bench(args, args.device, DTYPES[args.dtype], copy_bandwidth(args.device, args.copy_mib << 20))
    free_memory(args.device)  # the copy buffers
    rows, lookup_rows, quant_rows, setup = [], [], [], {}
    for name in args.shapes:
        r, lr, qr, setup[name] = bench.measure_shape(name)
        rows += r
        lookup_rows += lr
        quant_rows += qr
        print(f"{name}: done", flush=True)
    host = machine(args.device)
    print(f"\nmachine: {host}; transformers {transformers.__version__}; {args.dtype}, random weights, greedy, "
          f"context {args.context}, {args.new_tokens} new tokens, median of {args.reps}, "
          f"--torch_compile {args.torch_compile}")
    if bench.on_gpu:
        print(f"copy bandwidth: {bench.bandwidth / 1e9:.0f} GB/s (best of {COPY_REPS} copies of {args.copy_mib} MiB, "
              "read + write); set-up (s): "
              + "; ".join(f"{n} " + ", ".join(f"{k} {v:.1f}" for k, v in s.items()) for n, s in setup.items()))
    else:
        print("CPU: ratios only (absolute times depend on the machine's load)")
    print_tables(rows, lookup_rows)
    if quant_rows:
        print(f"\n{'shape':13} {'batch':>5} {'weights':>9} {'ms/tok':>8} {'x float':>8} {'of limit':>9} "
              f"{'weights MiB':>12} {'same tokens':>12}   (weight-only, not compiled)")
        for r in quant_rows:
            print(f"{r['shape']:13} {r['batch']:5d} {r['weight_only']:>9} {fmt(r['ours_ms_per_token'], 8)} "
                  f"{fmt(r['speedup_over_float'], 8, '.2f')} {fmt(r['fraction_of_limit'], 9)} "
                  f"{r['resident_weight_bytes'] / 2**20:12.0f} {str(r['tokens_identical_to_float']):>12}")
    goals = targets(rows, lookup_rows)
    for k, v in goals.items():
        print(f"  {k}: {fmt(v, 0, '.2f')}")
    failed = [r for r in rows + lookup_rows if r["token_check"] == "required" and not r["tokens_identical"]]
    atomic_write_json(args.output_json, {
        **machine_info(args.num_threads, args.device),
        "machine": host, "device": args.device,
        "gpu": torch.cuda.get_device_name(args.device) if bench.on_gpu else None,
        "torch": torch.__version__, "transformers": transformers.__version__, "num_threads": args.num_threads,
        "dtype": args.dtype, "args": vars(args),
        "bandwidth": {"copy_bytes": args.copy_mib << 20, "bytes_per_s": bench.absolute(bench.bandwidth)},
        "setup": setup, "rows": rows, "lookup_rows": lookup_rows, "weight_only_rows": quant_rows, "targets": goals,
    })
    print(f"wrote {args.output_json}")
    for r in failed:
        print(f"MISMATCH ({args.dtype}): {r['shape']} batch {r['batch']} differs at [sequence, token] "
              f"{r['first_difference']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
