#!/usr/bin/env python3
"""One full batch through the LLM API, plain vs prompt lookup (cost policy, full budget).

All ``--num_prompts`` code-edit prompts join the batch at once (no HTTP, no waiting
requests), ``--rounds`` times (later rounds see a warm public pool); prints tokens/s,
batch steps and drafted/accepted tokens per configuration, and the step-cost table.

    python bench/bench_batch_budget.py --engine_dir artifacts/smollm2/engine
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_header, machine_info  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from promptlookup.cli.args import ArgumentParser  # one-line errors, no abbreviations

    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", required=True)
    p.add_argument("--num_prompts", type=int, default=8)
    p.add_argument("--max_tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)

    from promptlookup.api import LLM, KvCacheConfig, NGramDecodingConfig, SamplingParams
    from promptlookup.evaluation.grounded_prompts import code_edit_prompts

    prompts = code_edit_prompts(args.num_prompts)
    kv = KvCacheConfig(enable_block_reuse=False)
    spec = NGramDecodingConfig(max_draft_len=10, max_matching_ngram_size=2)
    llms = {"plain": LLM(args.engine_dir, kv_cache_config=kv),
            "cost": LLM(args.engine_dir, speculative_config=spec, kv_cache_config=kv, draft_length_policy="cost"),
            "full": LLM(args.engine_dir, speculative_config=spec, kv_cache_config=kv, draft_length_policy="full")}
    import torch

    # torch's thread count (the LLM API sets none here) and the runner's device (a GPU where one is visible)
    print(machine_header(machine_info(torch.get_num_threads(), llms["plain"].runner.model.device)), flush=True)
    print("step costs", [round(c, 2) for c in llms["cost"].scheduler.step_costs[1:]])
    reference = None
    try:
        for rnd in range(args.rounds):
            for name, llm in llms.items():
                st = llm.scheduler.stats
                before = (st.batch_steps, st.drafted, st.accepted)
                start = time.perf_counter()
                outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens))
                wall = time.perf_counter() - start
                ids = [o.outputs[0].token_ids for o in outs]
                reference = reference or ids
                n = sum(map(len, ids))
                print(f"round {rnd} {name:5s}: {n / wall:.1f} tok/s, {st.batch_steps - before[0]} steps, "
                      f"accepted {st.accepted - before[2]}/{st.drafted - before[1]}, "
                      f"same output as plain: {ids == reference}", flush=True)
    finally:
        for llm in llms.values():
            llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
