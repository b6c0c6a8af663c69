#!/usr/bin/env python3
"""End-to-end speed of prompt lookup on SmolLM2, side by side with Hugging Face.

Same run, same machine, same weights (the engine's, loaded once), greedy decoding:

- ``hf_plain``: transformers ``generate()``;
- ``hf_pld``: transformers ``generate(prompt_lookup_num_tokens=k)``;
- ``ours_plain``: our PyTorch runtime without drafts;
- ``ours_v2``: our single-call prompt lookup (TensorRT-LLM pool semantics, ``[k, n]``);
- ``ours_v2_longest``: the same with the longest-match drafter (k up to 32);
- ``ours_v1_reuse`` / ``ours_v1_noreuse``: the orchestrator loop with and without KV
  block reuse;
- with ``--quantized_engines NAME=DIR ...``: ``ours_plain_NAME`` and ``ours_v2_NAME``, our
  plain decoding and V2 on that engine (weight-only int8/int4 of the same model; Hugging
  Face keeps the float32 weights), checked against ``ours_plain_NAME`` (a quantized engine's
  output is its own, not float32's).

Every method gets its own runner (so no method profits from another's cached blocks);
the methods run back to back on each prompt. Prompts are input-grounded: code edits on
Python standard-library functions, and CNN/DailyMail summaries when the shared sample
is present. Every float32 output is checked to be token-identical to ``hf_plain``.

    python bench/bench_runtime.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (before torch: OpenMP policy)

import torch  # noqa: E402

from promptlookup.checkpoint.load import load_checkpoint  # noqa: E402
from promptlookup.cli.inputs import encode_text  # noqa: E402
from promptlookup.decoding import generate  # noqa: E402
from promptlookup.drafting.base import DraftConfig  # noqa: E402
from promptlookup.engine.config import read_engine_config  # noqa: E402
from promptlookup.engine.load import load_runner  # noqa: E402
from promptlookup.evaluation.grounded_prompts import code_edit_prompts, summary_prompts  # noqa: E402
from promptlookup.evaluation.hf_baseline import hf_generate  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402
from promptlookup.runtime import load_tokenizer  # noqa: E402
from promptlookup.runtime.device import resolve_device  # noqa: E402
from promptlookup.runtime.torch_runner import TorchRunner  # noqa: E402
from promptlookup.errors import UserError  # noqa: E402
from promptlookup.threads import configure_threads  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "cnn_dailymail" / "train_sample.jsonl"


def machine(device: str) -> str:
    """The header line of :func:`bench.machine.machine_header` (CPU, flags, torch's thread count,
    the GPU on ``device``), with the architecture, torch's version and OpenMP's wait policy."""
    head = machine_header(machine_info(torch.get_num_threads(), device))
    policy = f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    if torch.get_num_threads() > 1 and os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        policy += (" (HF runs in this process, so its operators' threads sleep between regions too: about half"
                   " its 2-thread speed here; OMP_WAIT_POLICY=ACTIVE compares with HF at its best)")
    return f"{head}; {platform.machine()}, torch {torch.__version__}, {policy}"


def setup(args) -> tuple:
    """Threads, engine config, tokenizer, device, the engine's model there, and the prompts
    (``(kind, token ids)``: ``--num_code`` code edits, ``--num_summary`` summaries when
    ``--dataset`` exists), as every SmolLM2 benchmark here needs them."""
    threads = configure_threads(args.num_threads)
    cfg = read_engine_config(args.engine_dir)
    tok = load_tokenizer(args.engine_dir)
    device = resolve_device(args.device)
    model = load_checkpoint(args.engine_dir).to(device)
    prompts = [("code", t) for t in code_edit_prompts(args.num_code)]
    if Path(args.dataset).is_file() and args.num_summary:
        prompts += [("summary", t) for t in summary_prompts(Path(args.dataset), args.num_summary)]
    encoded = [(kind, encode_text(tok, text, use_chat_template=True)) for kind, text in prompts]
    return threads, cfg, tok, device, model, encoded


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_runtime.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="the SmolLM2 engine")
    p.add_argument("--num_code", type=int, default=6, help="code-edit prompts")
    p.add_argument("--num_summary", type=int, default=3, help="summary prompts (when --dataset exists)")
    p.add_argument("--max_new_tokens", type=int, default=160, help="new tokens per prompt")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    add_num_threads_argument(p, None, "--threads")
    p.add_argument("--device", default="auto", help="auto (the GPU when one is visible), cpu, cuda or cuda:N")
    p.add_argument("--cuda_graph_mode", action=argparse.BooleanOptionalAction, default=None,
                   help="our runners on a GPU: replay CUDA graphs (default: on when on a GPU)")
    p.add_argument("--cpu_weight_copies", type=int, choices=(1, 2), default=1,
                   help="our runners on a CPU: 1 holds the weights once; 2 keeps row-major copies too (faster plain steps)")
    p.add_argument("--dataset", default=str(SHARED), help="CNN/DailyMail JSONL for the summary prompts")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/runtime.json"), help="where results are written")
    p.add_argument("--quantized_engines", nargs="*", default=[], metavar="NAME=DIR",
                   help="also run our plain decoding and V2 on these engines (e.g. int4=/tmp/engine_int4)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.num_threads, cfg, tok, device, model, encoded = setup(args)
    end_id = tok.eos_token_id

    def runner(reuse: bool) -> TorchRunner:
        return TorchRunner(model, cfg.limits, tokens_per_block=cfg.tokens_per_block, kv_cache_enable_block_reuse=reuse,
                           cuda_graph_mode=args.cuda_graph_mode, cpu_weight_copies=args.cpu_weight_copies)

    pool = DraftConfig(prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n)
    longest = DraftConfig(prompt_lookup_num_tokens=min(32, cfg.limits.max_draft_len), mode="longest")
    ours = {
        "ours_plain": (runner(True), None, "v2"),
        "ours_v2": (runner(True), pool, "v2"),
        "ours_v2_longest": (runner(True), longest, "v2"),
        "ours_v1_reuse": (runner(True), pool, "v1"),
        "ours_v1_noreuse": (runner(False), pool, "v1"),
    }
    own_plain = {}  # method -> the method whose output it must equal (default hf_plain)
    for spec in args.quantized_engines:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--quantized_engines {spec!r}: write NAME=DIR, e.g. int4=/tmp/engine_int4")
        q = load_runner(path, device=device)
        ours[f"ours_plain_{name}"] = (q, None, "v2")
        ours[f"ours_v2_{name}"] = (q, pool, "v2")
        own_plain[f"ours_plain_{name}"] = own_plain[f"ours_v2_{name}"] = f"ours_plain_{name}"
    methods = ["hf_plain", "hf_pld", *ours]

    # Warm-up (first-call allocations, thread pools) on a short prompt, not timed.
    warm = encoded[0][1][:64]
    hf_generate(model, [warm], max_new_tokens=8, end_id=end_id)
    for r, d, wf in ours.values():
        generate(r, [warm], max_new_tokens=8, end_id=end_id, draft=d, workflow=wf)
        if r.graphs is not None:  # capture every CUDA graph the run can need, as a server would at start-up
            r.graphs.warmup(1, max(len(ids) for _, ids in encoded) + args.max_new_tokens + 1)

    rows = []
    for idx, (kind, ids) in enumerate(encoded):
        row = {"prompt": idx, "kind": kind, "prompt_tokens": len(ids), "times": {}, "identical": {}}
        outputs = {}
        t = time.perf_counter()
        outputs["hf_plain"] = hf_generate(model, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id)[0]
        row["times"]["hf_plain"] = time.perf_counter() - t
        t = time.perf_counter()
        outputs["hf_pld"] = hf_generate(model, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id,
                                        prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n)[0]
        row["times"]["hf_pld"] = time.perf_counter() - t
        for name, (r, d, wf) in ours.items():
            t = time.perf_counter()
            res = generate(r, [ids], max_new_tokens=args.max_new_tokens, end_id=end_id, draft=d, workflow=wf)[0]
            row["times"][name] = time.perf_counter() - t
            outputs[name] = res.output_ids
            if d is not None:
                row.setdefault("acceptance", {})[name] = {"steps": res.steps, "drafted": res.drafted, "accepted": res.accepted}
        row["generated_tokens"] = {m: len(outputs[m]) for m in methods}
        row["identical"] = {m: outputs[m] == outputs[own_plain.get(m, "hf_plain")] for m in methods}
        rows.append(row)
        print(f"prompt {idx} ({kind}, {len(ids)} tokens -> {row['generated_tokens']['hf_plain']}): "
              + ", ".join(f"{m} {row['times'][m]:.2f}s" for m in methods), flush=True)

    def ratio(a: str, b: str, kind: str | None = None) -> float:
        sel = [r for r in rows if kind is None or r["kind"] == kind]
        per_token = lambda r, m: r["times"][m] / max(1, r["generated_tokens"][m])  # noqa: E731
        return statistics.mean(per_token(r, a) / per_token(r, b) for r in sel) if sel else float("nan")

    summary = {}
    print(f"\nmachine: {machine(device)}; SmolLM2-135M fp32, greedy, max_new_tokens={args.max_new_tokens}, "
          f"[k,n]=[{args.k},{args.n}], {args.num_threads} CPU thread(s), cpu_weight_copies={args.cpu_weight_copies}")
    print("(ratios: time per generated token, per prompt, averaged; a quantized engine's outputs can be of"
          " another length than float32's)")
    print(f"{'method':18} {'tok/s':>7} {'speedup vs ours_plain':>22} {'vs hf_plain':>12} {'identical':>10}")
    for m in methods:
        total_t = sum(r["times"][m] for r in rows)
        total_n = sum(r["generated_tokens"][m] for r in rows)
        summary[m] = {
            "tokens_per_s": total_n / total_t,
            "mean_speedup_vs_ours_plain": ratio("ours_plain", m),
            "mean_speedup_vs_hf_plain": ratio("hf_plain", m),
            "mean_speedup_vs_ours_plain_code": ratio("ours_plain", m, "code"),
            "mean_speedup_vs_ours_plain_summary": ratio("ours_plain", m, "summary"),
            "all_identical": all(r["identical"][m] for r in rows),
        }
        s = summary[m]
        print(f"{m:18} {s['tokens_per_s']:7.1f} {s['mean_speedup_vs_ours_plain']:22.2f} "
              f"{s['mean_speedup_vs_hf_plain']:12.2f} {str(s['all_identical']):>10}")
    targets = {
        "ours_plain_time_over_hf_plain (<=1.05)": ratio("ours_plain", "hf_plain"),
        "hf_pld_time_over_ours_v2 (>=1.3)": ratio("hf_pld", "ours_v2"),
        "hf_pld_time_over_ours_v2_longest (>=1.3)": ratio("hf_pld", "ours_v2_longest"),
        "ours_v1_reuse_time_over_ours_v2 (<=1.15)": ratio("ours_v1_reuse", "ours_v2"),
        "ours_v2_speedup_code (>=2.0)": ratio("ours_plain", "ours_v2", "code"),
        "ours_v2_longest_speedup_code (>=2.0)": ratio("ours_plain", "ours_v2_longest", "code"),
        "issue 21: ours_plain_time_over_hf_plain (<=0.6)": ratio("ours_plain", "hf_plain"),
        "issue 21: hf_pld_time_over_ours_v2 (>=1.5)": ratio("hf_pld", "ours_v2"),
    }
    for spec in args.quantized_engines:
        name = spec.partition("=")[0]
        targets[f"issue 21: ours_plain_{name}_time_over_hf_plain (<=0.6)"] = ratio(f"ours_plain_{name}", "hf_plain")
        targets[f"issue 21: hf_pld_time_over_ours_v2_{name} (>=1.5)"] = ratio("hf_pld", f"ours_v2_{name}")
    print("\ntargets (mean of per-prompt ratios of time per token):")
    for k, v in targets.items():
        print(f"  {k}: {v:.2f}")
    atomic_write_json(args.output_json, {**machine_info(args.num_threads, device),
                                         "machine": machine(device), "device": device, "num_threads": args.num_threads,
                                         "args": vars(args), "summary": summary,
                                         "targets": targets, "prompts": rows})
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
