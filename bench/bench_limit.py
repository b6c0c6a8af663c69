#!/usr/bin/env python3
"""How close plain decoding on the CPU comes to the memory-bandwidth limit of reading the weights.

A plain decoding step multiplies every weight matrix by one row, so it cannot be faster
than reading all the weights once from memory. In one run, for each thread count:

- ``bandwidth``: the best of ``--repeats`` fp32 matrix-vector products (``torch.mv``)
  over a ``--matrix_mib`` matrix, in GB/s (a read-bound kernel: 2 flops per 4 bytes);
- ``weight bytes``: what one plain step must read, from the engine's tensors: every
  projection, the norms and the LM head (for a tied model the LM head is the embedding
  table, which the engine stores once); the step's one embedding row is left out.
  The K/V read by attention at the measured context is shown beside it, not counted;
- ``limit``: weight bytes / bandwidth, in ms per step;
- ``plain``: the median time of ``--steps`` plain decoding steps of the engine at a
  ``--context``-token code-edit context (a :class:`DecodeBatch` step: layout, forward,
  greedy choice, commit), and ``rate / limit`` = limit / plain step (target >= 0.75);
  beside the wall times, the median process CPU time of a step (``cpu``: at one thread,
  the time spent computing, without the waits for a core on a busy machine);
- ``11-row / 1-row``: the median ratio of an 11-row verification step (1 + 10 drafted
  tokens, nothing committed) to the plain step right before it (target <= 2.5);
- ``prefill``: the median wall time of the context's own forward pass (``--prefill_rounds``
  of them, each in a fresh batch on a runner without block reuse, so none is served from
  the cache).

With ``--num_code N`` (default 3; 0 skips it), each thread count also generates
``--max_new_tokens`` tokens for N code-edit prompts, plainly and with prompt lookup V2
(``[k, n] = [10, 2]``, the cost-aware draft policy), the two alternating per prompt,
without block reuse (so every run pays its prompt): tok/s of each, prompt included.

With ``--against DIR [DIR ...]`` (other engines of the same model, e.g. its int8 and int4
builds), each thread count also times plain steps of those engines and of ``--engine_dir``
alternately in this one process, a step of each in turn (the order reversed every other
round), ``--steps`` of each, each at the same context. Ratios of engines run minutes apart
follow whatever else the host's memory serves meanwhile; steps taken side by side see the
same moment. Reported per engine: its median plain ms, and its speed over ``--engine_dir``
as the median of the per-round ratios (``--engine_dir``'s step / its step), wall and
process CPU time. ``--kv_cache_dtype`` sets the KV cache's element type of every engine of
the run; ``DIR@DTYPE`` that of one engine (so one engine can run beside itself with the
other cache type).

With ``--profile`` (at the first thread count) it also splits the plain and 11-row steps, in
process CPU ms: the decoder layers (on the CPU in float32, one C call:
``step_ops.layers``, products, attention and norms together), the LM head, and the rest
(layout, sampling, commit, Python); and it times the same steps with the layers run op by
op from Python (the model's ``layer_records`` cleared), which shows what the one call saves.

    python bench/bench_limit.py --threads 1 2 --output_json bench/results/limit.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser  # noqa: E402  (before torch: OpenMP policy)
from promptlookup.defaults import KV_CACHE_DTYPES  # noqa: E402
from promptlookup.errors import UserError  # noqa: E402

import torch  # noqa: E402

from promptlookup.runtime.options import KvCacheConfig  # noqa: E402

DRAFT_ROWS = 10  # the verification step feeds 1 + DRAFT_ROWS tokens


def cpu_header(threads: list[int]) -> dict[str, Any]:
    """:func:`bench.machine.machine_info` (CPU model, vector flags, CPUs, the thread counts measured)
    with the torch version; ``flags`` repeats ``cpu_flags`` (the key earlier results have)."""
    info = machine_info(list(threads))
    return {**info, "flags": info["cpu_flags"], "torch": torch.__version__}


def read_bandwidth(matrix_mib: int, repeats: int) -> float:
    """Best read bandwidth in GB/s of ``torch.mv`` over a ``matrix_mib`` fp32 matrix
    (the matrix dominates the bytes; the vectors are a rounding error)."""
    cols = 4096
    rows = matrix_mib * 2**20 // (4 * cols)
    a = torch.randn(rows, cols)
    x = torch.randn(cols)
    torch.mv(a, x)  # first touch, thread pool
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mv(a, x)
        best = min(best, time.perf_counter() - t)
    return a.numel() * a.element_size() / best / 1e9


def step_weight_bytes(engine_dir: str | Path) -> int:
    """Bytes a plain step reads from the weights: every tensor the engine stores except the
    input embedding table (one row of it is read), unless the engine stores no separate
    LM head, when the table is the LM head. From the file headers alone."""
    total, embedding, has_head = 0, 0, False
    for path in sorted(Path(engine_dir).glob("rank*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, v in header.items():
            if name == "__metadata__":
                continue
            n = v["data_offsets"][1] - v["data_offsets"][0]
            total += n
            if name.endswith("vocab_embedding.weight") or name.endswith("embed_tokens.weight"):
                embedding += n
            has_head = has_head or name.endswith("lm_head.weight")
    return total - embedding if has_head else total


def context_prompt(tokenizer: Any, tokens: int) -> list[int]:
    """A code-edit prompt (chat template) of ``tokens`` tokens: code-edit prompts joined
    until long enough, then cut (shorter only if all of them together are)."""
    from promptlookup.cli.inputs import encode_text
    from promptlookup.evaluation.grounded_prompts import code_edit_prompts

    count, ids = 1, []
    while True:
        texts = code_edit_prompts(count)
        ids = encode_text(tokenizer, "\n\n".join(texts), True)
        if len(ids) >= tokens or len(texts) < count:  # long enough, or no more prompts
            break
        count += 1
    return ids[:tokens]


def verify_only(batch: Any, tree: Any, sampling: Any) -> list[int]:
    """The forward pass of one verification step of sequence 0 and the target's choices
    (root, then every node), committing nothing: ``DecodeBatch.step_trees`` without its
    commit, so the bench can time the same step at the same context again and again."""
    return batch._select([0], [tree], sampling).tolist()


def step_times(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, process CPU) seconds of each function, called alternately ``rounds`` times (one
    after the other within a round, in reverse order every other round, so machine load and
    the caches each left behind hit all alike). At one thread the CPU time leaves out the
    time the thread waited for a core: steadier on a busy machine."""
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for r in range(rounds):
        for k, fn in (fns.items() if r % 2 == 0 else reversed(fns.items())):
            t, c = time.perf_counter(), time.process_time()
            fn()
            out[k].append((time.perf_counter() - t, time.process_time() - c))
    return out


def profile_steps(fns: dict[str, Callable[[], Any]], model: Any, steps: int) -> dict[str, dict[str, float]]:
    """Per step, median process CPU ms of: the decoder layers' one C call, the LM head, the
    rest of the step; and the whole step with the layers run op by op from Python."""
    from promptlookup.runtime.kernels import step_ops

    spent = {"layers": 0.0, "lm_head": 0.0}
    real_layers, real_head = step_ops.layers, model.lm_head

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            c = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - c
        return run

    out: dict[str, dict[str, float]] = {}
    step_ops.layers, model.lm_head = timed("layers", real_layers), timed("lm_head", real_head)
    try:
        for name, fn in fns.items():
            parts: dict[str, list[float]] = {"layers": [], "lm_head": [], "rest": []}
            for _ in range(steps):
                spent.update(layers=0.0, lm_head=0.0)
                c = time.process_time()
                fn()
                total = time.process_time() - c
                parts["layers"].append(spent["layers"])
                parts["lm_head"].append(spent["lm_head"])
                parts["rest"].append(total - spent["layers"] - spent["lm_head"])
            out[name] = {f"{k}_ms": statistics.median(v) * 1e3 for k, v in parts.items()}
    finally:
        step_ops.layers, model.lm_head = real_layers, real_head
    records, model.layer_records = model.layer_records, None
    try:
        for name, times in step_times(fns, steps).items():
            out[name]["op_by_op_ms"] = statistics.median(c for _, c in times) * 1e3
    finally:
        model.layer_records = records
    return out


def round_ratio(num: list[tuple[float, float]], den: list[tuple[float, float]], i: int = 0) -> float:
    """The median over rounds of ``num``'s time / ``den``'s time in the same round, from
    :func:`step_times` (``i``: 0 wall, 1 process CPU)."""
    return statistics.median(a[i] / b[i] for a, b in zip(num, den))


def paired_speeds(times: dict[str, list[tuple[float, float]]], base: str) -> dict[str, dict[str, float]]:
    """Per engine other than ``base``: its median plain ms (wall) and its speed over ``base``
    (:func:`round_ratio` of ``base``'s steps over its, wall and process CPU), from
    :func:`step_times` of the engines' steps side by side."""
    return {name: {"plain_ms": statistics.median(w for w, _ in t) * 1e3,
                   "speed_over_base": round_ratio(times[base], t),
                   "speed_over_base_cpu": round_ratio(times[base], t, 1)}
            for name, t in times.items() if name != base}


def runner_without_reuse(runner: Any) -> Any:
    """A runner sharing ``runner``'s weights, limits and KV cache type, without block reuse
    (every prompt paid)."""
    from dataclasses import replace

    from promptlookup.runtime.torch_runner import TorchRunner

    return TorchRunner(runner.model, runner.limits, tokens_per_block=runner.pool.block_size,
                       kv_cache=replace(runner.kv_cache, enable_block_reuse=False),
                       step_cost_table=runner.step_cost_table)


def engine_and_kv(spec: str, default_kv: str) -> tuple[str, str]:
    """``--against``'s ``DIR`` or ``DIR@DTYPE`` as (folder, KV cache dtype)."""
    folder, _, kv = spec.rpartition("@") if "@" in spec else (spec, "", default_kv)
    if kv not in KV_CACHE_DTYPES:
        raise UserError(f"--against {spec}: {kv!r} is not a KV cache dtype; choose {', '.join(KV_CACHE_DTYPES)}")
    return folder, kv


def prefill_ms(runner: Any, prompt: list[int], rounds: int) -> float:
    """Median wall ms of ``prompt``'s forward pass, each round in a fresh batch (no reuse)."""
    from promptlookup.runtime.base import SamplingConfig

    times = []
    for _ in range(rounds):
        batch = runner.open([prompt])
        t = time.perf_counter()
        batch.step([0], [[]], -1, SamplingConfig())
        times.append(time.perf_counter() - t)
        batch.close()
    return statistics.median(times) * 1e3


def generation_rates(runner: Any, prompts: list[list[int]], max_new_tokens: int, end_id: int) -> dict[str, float]:
    """tok/s of plain and V2 ``[10, 2]`` generation over ``prompts`` (alternating per prompt),
    on a runner without block reuse sharing ``runner``'s weights."""
    from promptlookup.decoding import generate
    from promptlookup.drafting.base import DraftConfig
    fresh = runner_without_reuse(runner)
    configs = {"plain": None, "v2": DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2)}
    seconds = dict.fromkeys(configs, 0.0)
    tokens = dict.fromkeys(configs, 0)
    outputs: dict[str, list[list[int]]] = {k: [] for k in configs}
    for ids in prompts:
        for name, draft in configs.items():
            t = time.perf_counter()
            out = generate(fresh, [ids], max_new_tokens=max_new_tokens, end_id=end_id, draft=draft, workflow="v2")[0]
            seconds[name] += time.perf_counter() - t
            tokens[name] += len(out.output_ids)
            outputs[name].append(out.output_ids)
    if outputs["plain"] != outputs["v2"]:
        raise AssertionError("V2 output differs from plain greedy decoding")
    return {f"{k}_tok_s": tokens[k] / seconds[k] for k in configs}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_limit.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="a float32 PyTorch engine")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to measure, in this order")
    p.add_argument("--context", type=int, default=753, help="tokens of code-edit context before the timed steps")
    p.add_argument("--steps", type=int, default=24, help="timed plain steps (and as many 11-row steps) per thread count")
    p.add_argument("--matrix_mib", type=int, default=512, help="size of the bandwidth probe's fp32 matrix, MiB")
    p.add_argument("--repeats", type=int, default=6, help="bandwidth probe: best of this many products")
    p.add_argument("--prefill_rounds", type=int, default=3, help="timed prefills of the context per thread count (0: skip)")
    p.add_argument("--num_code", type=int, default=3, help="code-edit prompts generated plainly and with V2 (0: skip)")
    p.add_argument("--max_new_tokens", type=int, default=96, help="new tokens per generated prompt")
    p.add_argument("--kv_cache_dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="the KV cache's element type for --engine_dir and, unless named, --against's engines")
    p.add_argument("--against", nargs="+", default=[], metavar="DIR[@DTYPE]",
                   help="other engines whose plain steps alternate with --engine_dir's in this process (their speed "
                        "over it); @DTYPE: that engine's KV cache dtype (an engine may appear twice)")
    p.add_argument("--profile", action="store_true", help="also split the steps at the first thread count (layers, LM head, rest; op by op)")
    p.add_argument("--output_json", default=None, help="write the results here as JSON (default: print only)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    at_least = {"--threads": (min(args.threads), 1), "--context": (args.context, 1), "--steps": (args.steps, 1),
                "--matrix_mib": (args.matrix_mib, 1), "--repeats": (args.repeats, 1),
                "--prefill_rounds": (args.prefill_rounds, 0), "--num_code": (args.num_code, 0),
                "--max_new_tokens": (args.max_new_tokens, 1)}
    for flag, (value, least) in at_least.items():
        if value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    against = [engine_and_kv(spec, args.kv_cache_dtype) for spec in args.against]  # before anything loads
    from promptlookup.engine.load import load_runner
    from promptlookup.fsutil import atomic_write_json
    from promptlookup.runtime import load_tokenizer
    from promptlookup.runtime.base import SamplingConfig
    from promptlookup.runtime.tree import DraftTree
    from promptlookup.threads import configure_threads

    header = cpu_header(args.threads)
    weight_bytes = step_weight_bytes(args.engine_dir)
    tokenizer = load_tokenizer(args.engine_dir)
    prompt = context_prompt(tokenizer, args.context)
    configure_threads(args.threads[0])
    runner = load_runner(args.engine_dir, device="cpu", kv_cache=KvCacheConfig(dtype=args.kv_cache_dtype))
    if runner.model.dtype != torch.float32:
        print(f"note: a {runner.model.dtype} engine; the probe reads fp32")
    cfg = runner.model.config
    kv_bytes = 2 * cfg.num_hidden_layers * runner.model.kv_size * runner.pool.dtype.itemsize * len(prompt)
    greedy = SamplingConfig()
    batch = runner.open([prompt])
    batch.step([0], [[]], -1, greedy)  # the prompt's forward pass
    draft = DraftTree.chain((prompt[100:] + prompt * DRAFT_ROWS)[:DRAFT_ROWS])  # a short --context repeats itself
    plain = lambda: batch.step([0], [[]], -1, greedy)  # noqa: E731  (end_id -1: never finishes)
    verify = lambda: verify_only(batch, draft, greedy)  # noqa: E731  (commits nothing)

    print(f"{machine_header(header)}; torch {header['torch']}")
    print(f"engine: {args.engine_dir}; weights read per plain step {weight_bytes / 1e6:.1f} MB "
          f"(+ {kv_bytes / 1e6:.1f} MB of {runner.pool.dtype} K/V at {len(prompt)} tokens, not counted)")
    other_batches: dict[str, Any] = {}
    for spec, (other_dir, kv) in zip(args.against, against):  # each at the same context, stepping on its own runner
        other = load_runner(other_dir, device="cpu", kv_cache=KvCacheConfig(dtype=kv))
        other_batches[spec] = other.open([prompt])
        other_batches[spec].step([0], [[]], -1, greedy)
        print(f"against: {spec}; weights read per plain step {step_weight_bytes(other_dir) / 1e6:.1f} MB; "
              f"{other.pool.dtype} K/V")
    others = {name: (lambda b=b: b.step([0], [[]], -1, greedy)) for name, b in other_batches.items()}
    no_reuse = runner_without_reuse(runner) if args.prefill_rounds else None
    results: dict[str, Any] = {"header": header, "engine_dir": str(args.engine_dir), "context": len(prompt),
                               "kv_cache_dtype": str(runner.pool.dtype).removeprefix("torch."),
                               "weight_bytes_per_step": weight_bytes, "kv_bytes_at_context": kv_bytes,
                               "by_threads": {}}
    gen_prompts = []
    if args.num_code:
        from promptlookup.cli.inputs import encode_text
        from promptlookup.evaluation.grounded_prompts import code_edit_prompts

        gen_prompts = [encode_text(tokenizer, t, True) for t in code_edit_prompts(args.num_code)]
    print(f"{'threads':>7} {'GB/s':>6} {'limit ms':>8} {'plain ms':>8} {'tok/s':>6} {'rate/limit':>10} "
          f"{'11-row ms':>9} {'11/1':>5} {'plain cpu':>8} {'11 cpu':>8}" + (f" {'prefill ms':>10}" if args.prefill_rounds else "") + (f" {'gen plain':>9} {'gen V2':>7}" if gen_prompts else ""))
    for n in args.threads:
        configure_threads(n)
        bandwidth = read_bandwidth(args.matrix_mib, args.repeats)
        limit_ms = weight_bytes / bandwidth / 1e6
        for _ in range(3):  # warm-up at this thread count
            plain()
            verify()
        times = step_times({"plain": plain, "verify": verify}, args.steps)
        med = {k: [statistics.median(x[i] for x in v) * 1e3 for i in (0, 1)] for k, v in times.items()}
        (plain_ms, plain_cpu_ms), (verify_ms, verify_cpu_ms) = med["plain"], med["verify"]
        ratio = round_ratio(times["verify"], times["plain"])
        row = {"bandwidth_gb_s": bandwidth, "limit_ms": limit_ms, "plain_ms": plain_ms, "plain_tok_s": 1e3 / plain_ms,
               "rate_over_limit": limit_ms / plain_ms, "verify11_ms": verify_ms, "verify11_over_plain": ratio,
               "plain_cpu_ms": plain_cpu_ms, "verify11_cpu_ms": verify_cpu_ms}
        line = (f"{n:>7} {bandwidth:6.1f} {limit_ms:8.1f} {plain_ms:8.1f} {1e3 / plain_ms:6.1f} "
                f"{limit_ms / plain_ms:10.2f} {verify_ms:9.1f} {ratio:5.2f} {plain_cpu_ms:8.1f} {verify_cpu_ms:8.1f}")
        if args.prefill_rounds:
            row["prefill_ms"] = prefill_ms(no_reuse, prompt, args.prefill_rounds)
            line += f" {row['prefill_ms']:10.1f}"
        if gen_prompts:
            row.update(generation_rates(runner, gen_prompts, args.max_new_tokens, tokenizer.eos_token_id))
            line += f" {row['plain_tok_s']:9.1f} {row['v2_tok_s']:7.1f}"
        results["by_threads"][str(n)] = row
        print(line, flush=True)
        if others:
            for fn in others.values():  # warm-up at this thread count
                fn()
            row["against"] = paired_speeds(step_times({"": plain, **others}, args.steps), "")  # "": no engine's name
            for name, r in row["against"].items():
                print(f"{'':>7} side by side: {name}: plain {r['plain_ms']:.1f} ms, speed over --engine_dir "
                      f"{r['speed_over_base']:.2f} (process CPU {r['speed_over_base_cpu']:.2f})", flush=True)
    print("targets: rate/limit >= 0.75, 11-row/1-row <= 2.5; medians of wall ms, and of process CPU ms (cpu)"
          + ("; gen: tok/s of whole generations (prompt included)" if gen_prompts else ""))
    if args.profile:
        configure_threads(args.threads[0])
        prof = profile_steps({"plain": plain, "verify11": verify}, runner.model, args.steps)
        results["profile"] = {"threads": args.threads[0], **prof}
        print(f"\nprofile ({args.threads[0]} thread(s), median process CPU ms per step):")
        print(f"{'step':>8} {'layers':>7} {'LM head':>7} {'rest':>6} {'op by op':>8}")
        for name, p in prof.items():
            print(f"{name:>8} {p['layers_ms']:7.1f} {p['lm_head_ms']:7.1f} {p['rest_ms']:6.1f} {p['op_by_op_ms']:8.1f}")
    batch.close()
    for other_batch in other_batches.values():
        other_batch.close()
    if args.output_json:
        atomic_write_json(args.output_json, results)
        print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
