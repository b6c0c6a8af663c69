#!/usr/bin/env python3
"""SmolLM2 in float32, bfloat16 and float16: step times, plain and prompt-lookup speed, and
whether prompt lookup stays token-identical to plain decoding in each dtype.

Step times: one forward step feeding ``q`` tokens after 512 cached ones, the best of
``--reps`` timings; the dtypes take turns within each repetition, so a busy machine slows
them alike. End to end: each prompt decoded plainly and with prompt lookup (full drafts).

The engine's weights are loaded once per dtype (the engine computes in its checkpoint's
dtype; this casts the fp32 engine's weights, as ``convert_checkpoint.py --dtype`` would).
For a prompt where the lookup run parts from the plain run, the first divergence is
reported with the plain run's top-2 logit gap there (``promptlookup.evaluation.divergence``,
from a second, recorded pair of runs that is not timed).

    python bench/bench_dtypes.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runtime import ROOT, SHARED, machine, setup  # noqa: E402  (configures threads before torch)
from bench.machine import machine_info  # noqa: E402  (ROOT on sys.path by bench_runtime)

import torch  # noqa: E402

from promptlookup.checkpoint.load import load_checkpoint  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402
from promptlookup.decoding import generate  # noqa: E402
from promptlookup.drafting.base import DraftConfig  # noqa: E402
from promptlookup.evaluation.divergence import first_divergence, record_run  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime.device import synchronize  # noqa: E402
from promptlookup.runtime.kv_cache import SequenceBlocks  # noqa: E402
from promptlookup.runtime.torch_runner import TorchRunner  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")
STEP_TOKENS = (1, 2, 4, 11, 17, 33)
CONTEXT = 512


def step_times_ms(runners: dict[str, TorchRunner], reps: int) -> dict[str, dict[int, float]]:
    """Best time (ms) of a forward step feeding ``q`` tokens after ``CONTEXT`` cached ones,
    per dtype and ``q``; the dtypes alternate inside each repetition."""
    seqs = {}
    for name, r in runners.items():
        seqs[name] = SequenceBlocks()
        r.blocks.ensure_capacity(seqs[name], CONTEXT + max(STEP_TOKENS))
        r.forward([[0] * CONTEXT], [CONTEXT], [seqs[name].blocks], [1])
    best = {name: {q: float("inf") for q in STEP_TOKENS} for name in runners}
    for _ in range(reps):
        for q in STEP_TOKENS:
            for name, r in runners.items():
                dev = r.model.device
                synchronize(dev)
                start = time.perf_counter()
                r.forward([[0] * q], [CONTEXT + q], [seqs[name].blocks], [q])
                synchronize(dev)
                best[name][q] = min(best[name][q], (time.perf_counter() - start) * 1e3)
    for name, r in runners.items():
        r.blocks.release(seqs[name], [])
    return best


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_dtypes.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="the SmolLM2 engine")
    p.add_argument("--num_code", type=int, default=4, help="code-edit prompts")
    p.add_argument("--num_summary", type=int, default=0, help="summary prompts (when --dataset exists)")
    p.add_argument("--max_new_tokens", type=int, default=120, help="new tokens per prompt")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated dtypes to run")
    p.add_argument("--reps", type=int, default=7, help="timings per step size (the best counts)")
    p.add_argument("--device", default="cpu", help="cpu (the numbers in docs/benchmarks.md), cuda or cuda:N")
    p.add_argument("--dataset", default=str(SHARED), help="CNN/DailyMail JSONL for the summary prompts")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/dtypes.json"), help="where results are written")
    add_num_threads_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.num_threads, cfg, tok, device, fp32_model, encoded = setup(args)
    end_id = tok.eos_token_id
    draft = DraftConfig(prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n)
    names = args.dtypes.split(",")
    models = {name: fp32_model if name == "float32" else load_checkpoint(args.engine_dir, dtype=name).to(device)
              for name in names}

    def runner(name: str) -> TorchRunner:
        return TorchRunner(models[name], cfg.limits, tokens_per_block=cfg.tokens_per_block,
                           max_tokens_in_paged_kv_cache=8192)

    steps = step_times_ms({name: runner(name) for name in names}, args.reps)
    results = {}
    for name in names:
        warm = encoded[0][1][:64]  # first-call allocations and thread pools, not timed
        for d in (None, draft):
            generate(runner(name), [warm], max_new_tokens=8, end_id=end_id, draft=d)
        times = {"plain": 0.0, "lookup": 0.0}
        tokens = {"plain": 0, "lookup": 0}
        identical, divergences = 0, []
        for idx, (_, ids) in enumerate(encoded):
            outs = {}
            # A fresh runner per run: in half precision a prefix cached by another prompt's
            # pass rounds differently, so block reuse across prompts would change outputs too.
            for method, d in (("plain", None), ("lookup", draft)):
                r = runner(name)
                t = time.perf_counter()
                outs[method] = generate(r, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id, draft=d)[0]
                times[method] += time.perf_counter() - t
                tokens[method] += len(outs[method].output_ids)
            if outs["plain"].output_ids == outs["lookup"].output_ids:
                identical += 1
            else:
                c = first_divergence(
                    record_run(runner(name), ids, max_new_tokens=args.max_new_tokens, end_id=end_id),
                    record_run(runner(name), ids, max_new_tokens=args.max_new_tokens, end_id=end_id, draft=draft))
                divergences.append({"prompt": idx, "position": c.position, "gap_ulps": c.gap_ulps,
                                    "max_pair_error_ulps": c.max_pair_error_ulps})
            print(f"{name} prompt {idx}: plain {outs['plain'].generated_tokens} tokens, "
                  f"lookup accepted {outs['lookup'].accepted}/{outs['lookup'].drafted}", flush=True)
        results[name] = {
            "step_ms": steps[name],
            "plain_tokens_per_s": tokens["plain"] / times["plain"],
            "lookup_tokens_per_s": tokens["lookup"] / times["lookup"],
            "speedup": times["plain"] / times["lookup"],
            "identical": identical,
            "prompts": len(encoded),
            "divergences": divergences,
        }
    print(f"\nmachine: {machine(device)}; SmolLM2-135M, greedy, max_new_tokens={args.max_new_tokens}, "
          f"[k,n]=[{args.k},{args.n}], {args.num_threads} CPU thread(s)")
    print(f"step time (ms) after {CONTEXT} cached tokens, by tokens fed:")
    print(f"{'dtype':9} " + " ".join(f"{q:>7}" for q in STEP_TOKENS))
    for name in names:
        print(f"{name:9} " + " ".join(f"{steps[name][q]:7.1f}" for q in STEP_TOKENS))
    print(f"{'dtype':9} {'plain tok/s':>11} {'lookup tok/s':>12} {'speedup':>8} {'identical':>10}  divergences")
    for name, s in results.items():
        divs = "; ".join(f"prompt {d['prompt']} at {d['position']}, gap {d['gap_ulps']:.2f} ulps"
                         for d in s["divergences"] if d["position"] is not None)
        print(f"{name:9} {s['plain_tokens_per_s']:11.1f} {s['lookup_tokens_per_s']:12.1f} {s['speedup']:8.2f} "
              f"{s['identical']:>4}/{s['prompts']:<5}  {divs or '-'}")
    atomic_write_json(Path(args.output_json), {**machine_info(args.num_threads, device),
                                               "machine": machine(device), "num_threads": args.num_threads,
                                               "max_new_tokens": args.max_new_tokens, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
