#!/usr/bin/env python3
"""Token trees on SmolLM2: chain vs multi-candidate prompt lookup vs Lookahead, side by side.

Same run, same weights, greedy decoding, every method on its own runner, back to back on
each prompt (code edits on Python standard-library functions, and CNN/DailyMail summaries
when the shared sample is present):

- ``hf_plain``, ``hf_pld``: transformers ``generate()`` without and with
  ``prompt_lookup_num_tokens=k`` (the peer);
- ``plain``: our runtime without drafts;
- ``chain``: prompt lookup ``[k, n]``, one draft per step (V2);
- ``tree_G2``, ``tree_G4``: prompt lookup with 2 or 4 candidates per step, one prefix tree;
- ``la_W_N_G``: Lookahead decoding ``[W, N, G]`` alone;
- ``la_W_N_G+pl``: Lookahead together with prompt lookup ``[k, n]``.

Reported per method: tokens per second, the speedup over ``plain`` (mean of per-prompt
time ratios), tokens per step, accepted/drafted, tree tokens per step, and whether every
output equals ``plain``'s. All speculative methods use the cost-aware policy with the
engine's stored step-cost table (measured here, once, if the engine has none for this
device; the table used is written to the JSON).

    python bench/bench_trees.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench_runtime's set-up, also when loaded from elsewhere
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch)

from bench_runtime import SHARED, machine, setup  # noqa: E402
from bench.machine import machine_info  # noqa: E402

from promptlookup.decoding import generate  # noqa: E402
from promptlookup.decoding.lookahead import parse_lookahead_config  # noqa: E402
from promptlookup.drafting.base import DraftConfig  # noqa: E402
from promptlookup.engine.step_costs import costs_for, measure_step_costs  # noqa: E402
from promptlookup.evaluation.hf_baseline import hf_generate  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime.torch_runner import TorchRunner  # noqa: E402


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_trees.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="the SmolLM2 engine")
    p.add_argument("--num_code", type=int, default=4, help="code-edit prompts")
    p.add_argument("--num_summary", type=int, default=2, help="summary prompts (when --dataset exists)")
    p.add_argument("--max_new_tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--lookahead", default="[[3,3,3],[5,4,4]]", help='Lookahead configs "[[W,N,G],...]"')
    p.add_argument("--combined", default="[3,3,3]", help='the Lookahead config run together with prompt lookup')
    p.add_argument("--methods", default="", help="comma-separated subset of the methods (default: all)")
    p.add_argument("--policy", choices=["cost", "full"], default="cost", help="draft length policy for every method")
    add_num_threads_argument(p, None)
    p.add_argument("--device", default="auto", help="auto (the GPU when one is visible), cpu, cuda or cuda:N")
    p.add_argument("--dataset", default=str(SHARED), help="CNN/DailyMail JSONL for the summary prompts")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/trees.json"), help="where results are written")
    return p


def main(argv: list[str] | None = None) -> int:
    import ast

    args = build_parser().parse_args(argv)
    args.num_threads, cfg, tok, device, model, encoded = setup(args)
    end_id = tok.eos_token_id

    costs = costs_for(cfg.step_costs, device.split(":")[0])
    probe = TorchRunner(model, cfg.limits, tokens_per_block=cfg.tokens_per_block)
    source = "engine"
    if costs is None:
        costs, source = measure_step_costs(probe, cfg.limits.max_draft_len + 1), "measured by this run"
    del probe

    def runner() -> TorchRunner:
        return TorchRunner(model, cfg.limits, tokens_per_block=cfg.tokens_per_block, step_cost_table=costs)

    k, n = args.k, args.n
    chain = DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
    methods: dict[str, tuple] = {"plain": (None, None), "chain": (chain, None)}
    for g in (2, 4):
        methods[f"tree_G{g}"] = (DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n, max_candidates=g),
                                 None)
    for triple in ast.literal_eval(args.lookahead):
        la = parse_lookahead_config(str(list(triple)))
        methods["la_{}_{}_{}".format(*la.triple)] = (None, la)
    la = parse_lookahead_config(args.combined)
    methods["la_{}_{}_{}+pl".format(*la.triple)] = (DraftConfig(prompt_lookup_num_tokens=min(k, 6),
                                                                max_matching_ngram_size=n), la)
    if args.methods:
        keep = {m.strip() for m in args.methods.split(",")} | {"plain"}
        methods = {m: v for m, v in methods.items() if m in keep}
    names = ["hf_plain", "hf_pld", *methods]

    warm = encoded[0][1][:64]
    hf_generate(model, [warm], max_new_tokens=8, end_id=end_id)
    for d, la in methods.values():
        generate(runner(), [warm], max_new_tokens=8, end_id=end_id, draft=d, lookahead=la, workflow="v2")

    rows = []
    for idx, (kind, ids) in enumerate(encoded):
        row = {"prompt": idx, "kind": kind, "prompt_tokens": len(ids), "times": {}, "stats": {}}
        outs = {}
        t = time.perf_counter()
        outs["hf_plain"] = hf_generate(model, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id)[0]
        row["times"]["hf_plain"] = time.perf_counter() - t
        t = time.perf_counter()
        outs["hf_pld"] = hf_generate(model, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id,
                                     prompt_lookup_num_tokens=k, max_matching_ngram_size=n)[0]
        row["times"]["hf_pld"] = time.perf_counter() - t
        for name, (d, la) in methods.items():
            r = runner()
            t = time.perf_counter()
            res = generate(r, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id, draft=d, lookahead=la,
                           workflow="v2", draft_length_policy=args.policy)[0]
            row["times"][name] = time.perf_counter() - t
            outs[name] = res.output_ids
            row["stats"][name] = {"steps": res.steps, "drafted": res.drafted, "accepted": res.accepted,
                                  "tree_tokens": res.tree_tokens, "generated": res.generated_tokens,
                                  "accepted_by_source": res.accepted_by_source}
        row["generated_tokens"] = len(outs["plain"])
        row["identical"] = {m: outs[m] == outs["plain"] for m in names}
        rows.append(row)
        print(f"prompt {idx} ({kind}, {len(ids)} tokens -> {row['generated_tokens']}): "
              + ", ".join(f"{m} {row['times'][m]:.2f}s" for m in names), flush=True)

    def speedup(m: str, kind: str | None = None) -> float:
        sel = [r for r in rows if kind is None or r["kind"] == kind]
        return statistics.mean(r["times"]["plain"] / r["times"][m] for r in sel) if sel else float("nan")

    summary = {}
    print(f"\nmachine: {machine(device)}; SmolLM2-135M fp32, greedy, max_new_tokens={args.max_new_tokens}, "
          f"[k,n]=[{k},{n}], policy {args.policy}, step costs {source}, {args.num_threads} CPU thread(s)")
    print(f"{'method':14} {'tok/s':>7} {'speedup':>8} {'code':>6} {'summ.':>6} {'tok/step':>9} {'acc/drafted':>12} "
          f"{'tree/step':>10} {'identical':>10}")
    for m in names:
        t = sum(r["times"][m] for r in rows)
        gen = sum(r["generated_tokens"] for r in rows)
        st = [r["stats"].get(m) for r in rows]
        steps = sum(s["steps"] for s in st if s) or None
        drafted = sum(s["drafted"] for s in st if s)
        accepted = sum(s["accepted"] for s in st if s)
        tree = sum(s["tree_tokens"] for s in st if s)
        by_source: dict[str, int] = {}
        for s in st:
            for key, v in (s or {}).get("accepted_by_source", {}).items():
                by_source[key] = by_source.get(key, 0) + v
        summary[m] = {"tokens_per_s": gen / t, "speedup": speedup(m), "speedup_code": speedup(m, "code"),
                      "speedup_summary": speedup(m, "summary"),
                      "tokens_per_step": gen / steps if steps else None, "drafted": drafted, "accepted": accepted,
                      "tree_tokens_per_step": tree / steps if steps else None, "accepted_by_source": by_source,
                      "all_identical": all(r["identical"][m] for r in rows)}
        s = summary[m]
        tps = f"{s['tokens_per_step']:.2f}" if s["tokens_per_step"] else "-"
        tree_ps = f"{s['tree_tokens_per_step']:.1f}" if s["tree_tokens_per_step"] is not None else "-"
        acc = f"{accepted}/{drafted}" if steps else "-"
        print(f"{m:14} {s['tokens_per_s']:7.1f} {s['speedup']:8.2f} {s['speedup_code']:6.2f} "
              f"{s['speedup_summary']:6.2f} {tps:>9} {acc:>12} {tree_ps:>10} {str(s['all_identical']):>10}")
    atomic_write_json(args.output_json, {**machine_info(args.num_threads, device),
                                         "machine": machine(device), "device": device, "num_threads": args.num_threads,
                                         "step_costs": costs, "step_costs_source": source, "args": vars(args),
                                         "summary": summary, "prompts": rows})
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
