#!/usr/bin/env python3
"""Load benchmark of serve.py: N concurrent clients, with and without prompt lookup.

For each mode (``plain``: no drafts; ``lookup``: ``[k, n]`` prompt lookup with the
batch-aware draft budget) and each N in ``--clients`` (default 1, 4, 16), the server is
started on 127.0.0.1 (a free port) and N client threads each send ``--requests``
streaming completions (input-grounded code-edit prompts, greedy; by default every request
its own prompt, the same ones for both modes), bounded by
``--time_limit`` seconds per configuration. Reported per configuration: throughput
(generated tokens / wall time), TTFT (time to the first streamed text) and TPOT (time
per output token after the first), mean and p50; plus the server's acceptance rate.

Checks: no request lost (each ends with a finish_reason, or is counted as lost), and every
output equals the same prompt's single-request run (greedy; computed first, alone).

    python bench/bench_serving.py --engine_dir artifacts/smollm2/engine --output_json outputs/serving.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_header, machine_info  # noqa: E402


def run_clients(url: str, prompts: list[str], n_clients: int, requests: int, max_tokens: int,
                time_limit: float, offset: int = 0) -> dict:
    """Client ``c``'s request ``r`` sends ``prompts[offset + c * requests + r]`` (cycling)."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=time_limit + 60)
    records: list[dict] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + time_limit

    def worker(c: int) -> None:
        for r in range(requests):
            if time.perf_counter() > deadline:
                return
            idx = (offset + c * requests + r) % len(prompts)
            start = time.perf_counter()
            first = None
            text, finish, tokens = [], None, 0
            try:
                for chunk in client.completions.create(model="m", prompt=prompts[idx], max_tokens=max_tokens,
                                                       temperature=0, stream=True,
                                                       stream_options={"include_usage": True}):
                    if chunk.choices:
                        if chunk.choices[0].text and first is None:
                            first = time.perf_counter()
                        text.append(chunk.choices[0].text)
                        finish = chunk.choices[0].finish_reason or finish
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                end = time.perf_counter()
                rec = {"prompt": idx, "text": "".join(text), "finish": finish, "tokens": tokens,
                       "ttft": (first or end) - start, "total": end - start}
            except Exception as exc:  # noqa: BLE001 - counted as lost
                rec = {"prompt": idx, "error": str(exc)}
            with lock:
                records.append(rec)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [r for r in records if "error" not in r and r["finish"]]
    tpot = [(r["total"] - r["ttft"]) / (r["tokens"] - 1) for r in done if r["tokens"] > 1]
    ttft = [r["ttft"] for r in done]
    return {
        "clients": n_clients, "requests": len(records), "completed": len(done), "lost": len(records) - len(done),
        "wall_s": wall, "tokens": sum(r["tokens"] for r in done),
        "throughput_tok_s": sum(r["tokens"] for r in done) / wall if wall else 0.0,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None, "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "tpot_mean_s": statistics.fmean(tpot) if tpot else None, "tpot_p50_s": statistics.median(tpot) if tpot else None,
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    from promptlookup.cli.args import ArgumentParser, add_num_threads_argument  # one-line errors, no abbreviations

    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", required=True)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds over every N; each round runs both modes back to back per N, alternating which goes first")
    p.add_argument("--prompt_lookup_config", default="[10,2,[0]]")
    p.add_argument("--draft_token_budget", type=int, default=None)
    p.add_argument("--draft_length_policy", choices=["cost", "full"], default="cost", help="as serve.py")
    p.add_argument("--time_limit", type=float, default=300.0, help="seconds per configuration")
    p.add_argument("--num_prompts", type=int, default=None,
                   help="distinct prompts (default: one per request of every round and N, so that no request "
                        "repeats another's prompt and the shared n-gram pool cannot draft from an earlier answer)")
    p.add_argument("--kv_cache_enable_block_reuse", action="store_true",
                   help="reuse KV blocks across requests (off by default: the reference runs would warm one "
                        "mode's cache and not the other's, making TTFT incomparable)")
    add_num_threads_argument(p)
    p.add_argument("--output_json", default=str(Path(__file__).resolve().parent / "results/serving.json"))
    args = p.parse_args(argv)

    from promptlookup.threads import configure_threads

    args.num_threads = configure_threads(args.num_threads)
    from promptlookup.api import LLM, KvCacheConfig, NGramDecodingConfig, SamplingParams
    from promptlookup.cli.args import parse_prompt_lookup_config
    from promptlookup.evaluation.grounded_prompts import code_edit_prompts
    from promptlookup.serving.openai_server import OpenAIServer
    from tests.serving.server_thread import ServerThread

    k, n, _ = parse_prompt_lookup_config(args.prompt_lookup_config)
    clients = [int(c) for c in args.clients.split(",")]
    per_round = sum(clients) * args.requests
    prompts = code_edit_prompts(args.num_prompts or args.rounds * per_round)
    kv = KvCacheConfig(enable_block_reuse=args.kv_cache_enable_block_reuse)
    modes = {"plain": None, "lookup": NGramDecodingConfig(max_draft_len=k, max_matching_ngram_size=n)}
    llms = {m: LLM(args.engine_dir, speculative_config=spec, kv_cache_config=kv,  # plain takes no draft settings
                   draft_token_budget=None if spec is None else args.draft_token_budget,
                   draft_length_policy=None if spec is None else args.draft_length_policy) for m, spec in modes.items()}
    info = machine_info(args.num_threads, llms["plain"].runner.model.device)  # the runner's device: a GPU if visible
    machine = f"{machine_header(info)}; {platform.machine()}"
    print(f"machine: {machine}", flush=True)
    results = {**info, "machine": machine, "num_threads": args.num_threads, "config": vars(args), "runs": []}
    servers: dict = {}
    try:
        # reference: each prompt alone, plain greedy
        singles = [llms["plain"].generate(q, SamplingParams(max_tokens=args.max_tokens)).outputs[0].text for q in prompts]
        servers = {m: ServerThread(OpenAIServer(llm, "m").app) for m, llm in llms.items()}
        for rnd in range(args.rounds):
            for j, nc in enumerate(clients):
                order = ["plain", "lookup"] if (rnd + j) % 2 == 0 else ["lookup", "plain"]
                for mode in order:
                    stats = llms[mode].scheduler.stats
                    before = (stats.drafted, stats.accepted)
                    offset = rnd * per_round + sum(clients[:j]) * args.requests  # both modes: the same prompts
                    run = run_clients(servers[mode].url, prompts, nc, args.requests, args.max_tokens, args.time_limit,
                                      offset)
                    drafted, accepted = stats.drafted - before[0], stats.accepted - before[1]
                    run.update(mode=mode, round=rnd, acceptance_rate=accepted / drafted if drafted else 0.0)
                    run["mismatches"] = sum(1 for r in run["records"] if "text" in r and r["text"] != singles[r["prompt"]])
                    results["runs"].append(run)
                    print(f"round {rnd} {mode:6s} N={nc:2d}: {run['completed']}/{run['requests']} done, lost {run['lost']}, "
                          f"mismatches {run['mismatches']}; {run['throughput_tok_s']:.1f} tok/s, "
                          f"TTFT p50 {run['ttft_p50_s']:.2f} s, TPOT p50 {1000 * (run['tpot_p50_s'] or 0):.1f} ms, "
                          f"acceptance {100 * run['acceptance_rate']:.0f}%", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        for llm in llms.values():
            llm.shutdown()
    print(f"\nmachine: {machine}; lookup {args.prompt_lookup_config}, --draft_length_policy {args.draft_length_policy}")
    print(f"{'N':>3s} {'round':>5s} {'plain tok/s':>12s} {'lookup tok/s':>13s} {'lookup/plain':>13s}")
    ratios = []
    for rnd in range(args.rounds):
        for nc in clients:
            pair = {r["mode"]: r for r in results["runs"] if r["round"] == rnd and r["clients"] == nc}
            ratio = pair["lookup"]["throughput_tok_s"] / pair["plain"]["throughput_tok_s"]
            ratios.append({"clients": nc, "round": rnd, "ratio": ratio})
            print(f"{nc:3d} {rnd:5d} {pair['plain']['throughput_tok_s']:12.1f} {pair['lookup']['throughput_tok_s']:13.1f} "
                  f"{ratio:13.2f}")
    results["lookup_over_plain"] = ratios
    from promptlookup.fsutil import atomic_write_json

    atomic_write_json(args.output_json, results)
    print(f"wrote {args.output_json}")
    bad = sum(r["lost"] + r["mismatches"] for r in results["runs"])
    return 1 if bad else 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
