"""Cost of RequestDrafter.candidates() per step (multi-candidate prompt lookup).

For each context length and drafter (C classes by default), a request is warmed up with
the first L tokens of the stream of ``bench_drafting.py``, then ``--steps`` steps of
*propose, candidates(G), extend by ``--extend`` tokens* are timed; ``candidates()`` is
timed on its own as well, and the same steps with ``max_candidates=1`` (today's chain)
give the baseline. Also reported: how many candidates came back per step and how many
tree nodes :func:`merge_candidates` made of them (vs. the chain draft's length).

    python bench/bench_candidates.py --lengths 8192 --steps 2000       # quick (seconds)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_drafting import stdlib_stream, synthetic_stream  # noqa: E402
from bench.machine import machine_header, machine_info  # noqa: E402

from promptlookup.drafting import DraftConfig, make_drafter  # noqa: E402
from promptlookup.drafting.tree import merge_candidates  # noqa: E402


def time_steps(config: DraftConfig, stream: list[int], length: int, steps: int, extend: int, g: int,
               implementation: str) -> dict:
    req = make_drafter(config, implementation=implementation).new_request(stream[:length], max_seq_len=10**9)
    req.propose()
    clock = time.perf_counter_ns
    step_ns, cand_ns, counts, nodes, chain = [], [], [], [], []
    pos = length
    for _ in range(steps):
        t0 = clock()
        draft = req.propose()
        t1 = clock()
        cands = req.candidates(g) if g > 1 else [draft] if draft else []
        t2 = clock()
        req.extend(stream[pos:pos + extend])
        t3 = clock()
        pos += extend
        step_ns.append(t3 - t0 - (t2 - t1) if g == 1 else t3 - t0)
        cand_ns.append(t2 - t1)
        counts.append(len(cands))
        nodes.append(len(merge_candidates(cands)[0]))
        chain.append(len(draft))
    return {
        "us_per_step_median": statistics.median(step_ns) / 1e3,
        "candidates_us_median": statistics.median(cand_ns) / 1e3,
        "candidates_us_mean": sum(cand_ns) / len(cand_ns) / 1e3,
        "mean_candidates": sum(counts) / steps,
        "mean_tree_nodes": sum(nodes) / steps,
        "mean_chain_tokens": sum(chain) / steps,
    }


def main(argv: list[str] | None = None) -> int:
    from promptlookup.cli.args import ArgumentParser  # one-line errors, no abbreviations

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="8192", help="context lengths, comma separated")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--extend", type=int, default=3, help="tokens appended after each proposal")
    p.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    p.add_argument("--n", type=int, default=2, help="max_matching_ngram_size")
    p.add_argument("--g", type=int, default=4, help="candidates per step (max_candidates)")
    p.add_argument("--implementation", default="c", choices=("c", "python", "auto"))
    p.add_argument("--synthetic", action="store_true", help="use the synthetic stream even if the tokenizer exists")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    need = max(lengths) + args.steps * args.extend + 1
    stream = None if args.synthetic else stdlib_stream(need)
    source = "Python stdlib source, SmolLM2 tokenizer"
    if stream is None:
        stream, source = synthetic_stream(need), "synthetic (Zipf tokens with copied spans)"
    print(f"{machine_header(machine_info(1))} (the drafters are single-threaded)")
    print(f"stream: {source}; k={args.k}, n={args.n}, G={args.g}, +{args.extend} tokens per step, "
          f"{args.implementation} classes")
    header = (f"{'context':>8}  {'drafter':<22} {'G':>2} {'step us':>8} {'cand us':>8} {'cand mean':>9} "
              f"{'#cands':>6} {'nodes':>6} {'chain':>6}")
    print(header)
    print("-" * len(header))
    modes = {
        "pool (TRT-LLM defaults)": dict(max_matching_ngram_size=args.n),
        "pool (newest)": dict(max_matching_ngram_size=args.n, is_use_oldest=False),
        "longest": dict(mode="longest"),
    }
    for length in lengths:
        for name, extra in modes.items():
            for g in (1, args.g):
                cfg = DraftConfig(prompt_lookup_num_tokens=args.k, max_candidates=g, **extra)
                r = time_steps(cfg, stream, length, args.steps, args.extend, g, args.implementation)
                print(f"{length:>8}  {name:<22} {g:>2} {r['us_per_step_median']:>8.2f} "
                      f"{r['candidates_us_median']:>8.2f} {r['candidates_us_mean']:>9.2f} "
                      f"{r['mean_candidates']:>6.2f} {r['mean_tree_nodes']:>6.2f} {r['mean_chain_tokens']:>6.2f}")
    print("step us: median of propose + candidates (G > 1) + extend; cand us: candidates() alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
