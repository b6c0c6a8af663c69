#!/usr/bin/env python3
"""Bounded soak of serve.py: is the server's memory flat after warm-up?

Starts ``serve.py`` (the SmolLM2 engine ``artifacts/smollm2/engine`` by default, prompt
lookup on, its KV pool committed at start-up) on 127.0.0.1 and a free port, then keeps
``--concurrency`` clients busy for ``--duration`` seconds with varied requests (drawn from
a seeded generator: code-edit prompts that repeat their input, random word lists that
bring new n-grams, chat turns; completions and chat, streamed and not, greedy and seeded
sampling, 16 to ``--max_tokens`` tokens). Every ``--sample_every`` seconds it samples the
server's resident set twice: ``VmRSS`` from ``/proc/<pid>/status``, and ``/metrics``
(resident, and the bytes of the weights, the KV pool and the public n-gram pool, with the
pool's patterns and evictions).

The n-gram pool's limit is set low (``--ngram_pool_max_patterns``, default 1,000) so that
a soak of minutes reaches it and evicts; the server default (1,000,000) is reached only
after hours of such load. Verdict: *flat* when the resident set at the end exceeds the one
at the end of warm-up (the first ``--warmup`` seconds) by at most ``--tolerance`` (a
fraction, default 0.03); the maximum after warm-up is reported too.

Prints a table of the samples and one JSON object (machine, CPU flags, threads, load,
samples, verdict); ``--output_json`` writes the JSON too. Not part of ``make test``.

    python bench/bench_soak.py --duration 180 --output_json bench/results/soak.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.fsutil import atomic_write_json  # noqa: E402

WORDS = ("alpha beta gamma delta river stone cloud paper light north south value index table "
         "green orange window market garden signal bridge number letter winter summer engine").split()


def machine(num_threads: int) -> dict:
    """:func:`bench.machine.machine_info` (CPU model, the vector flags that matter to the kernels,
    CPUs, ``num_threads``: the server's) with the platform and Python version."""
    return {**machine_info(num_threads), "machine": platform.machine(), "system": platform.system(),
            "python": platform.python_version()}


def make_request(rng: random.Random, most_tokens: int) -> tuple[str, dict, bool]:
    """(path, body, stream): one varied request of 16 to ``most_tokens`` tokens."""
    kind = rng.random()
    if kind < 0.4:  # input-grounded edit: the output repeats the prompt (prompt lookup's case)
        name = rng.choice(WORDS) + "_" + rng.choice(WORDS)
        args = ", ".join(rng.sample(WORDS, rng.randint(1, 4)))
        body = rng.choice(WORDS)
        prompt = (f"def {name}({args}):\n    result = {body}({args})\n    return result\n\n"
                  f"# The same function, renamed to {name}_v2:\ndef {name}_v2({args}):\n")
    elif kind < 0.7:  # random words: new n-grams for the pool
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
    else:
        prompt = None
    max_tokens = rng.randint(16, most_tokens)
    sampling = {"temperature": 0.0} if rng.random() < 0.7 else {"temperature": 0.8, "seed": rng.randrange(10**6)}
    stream = rng.random() < 0.5
    if prompt is None:
        topic = " ".join(rng.sample(WORDS, 3))
        messages = [{"role": "user", "content": f"Write a short list about {topic}, then repeat it."}]
        return "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "stream": stream,
                                        **sampling}, stream
    return "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "stream": stream, **sampling}, stream


def post(url: str, body: dict, stream: bool, timeout: float) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if stream:
            for line in r:
                if line.strip() == b"data: [DONE]":
                    break
        else:
            json.loads(r.read())


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape(base: str) -> dict:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(ROOT / "serve.py"), "--engine_dir", args.engine_dir, "--port", "0",
           "--prompt_lookup_config", args.prompt_lookup_config,
           "--ngram_pool_max_patterns", str(args.ngram_pool_max_patterns)]
    if args.num_threads is not None:
        cmd += ["--num_threads", str(args.num_threads)]
    if args.max_tokens_in_paged_kv_cache is not None:
        cmd += ["--max_tokens_in_paged_kv_cache", str(args.max_tokens_in_paged_kv_cache)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:  # until serve.py says where it serves, or exits
        seen.append(line.rstrip())
        m = re.search(r"on (http://[^\s]+)/v1", line)
        if m:
            out = proc.stdout
            threading.Thread(target=lambda: [None for _ in out], daemon=True).start()  # keep the pipe drained
            return proc, m.group(1)
    proc.kill()
    raise SystemExit(f"serve.py did not start: {seen[-1] if seen else 'no output'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"))
    p.add_argument("--prompt_lookup_config", default="[10,2,[0]]")
    p.add_argument("--ngram_pool_max_patterns", type=int, default=1_000)
    p.add_argument("--max_tokens_in_paged_kv_cache", type=int, default=None)
    p.add_argument("--num_threads", type=int, default=None, help="the server's threads (default: its own)")
    p.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (default: a third of the duration)")
    p.add_argument("--sample_every", type=float, default=3.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max_tokens", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=0.03, help="end vs warm-up RSS growth still called flat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_json", default=None)
    args = p.parse_args(argv)
    if args.duration <= 0 or args.sample_every <= 0 or args.concurrency < 1 or args.max_tokens < 16:
        p.error("--duration and --sample_every must be > 0, --concurrency >= 1, --max_tokens >= 16")
    warmup = args.duration / 3 if args.warmup is None else args.warmup
    from promptlookup.threads import default_num_threads

    host = machine(args.num_threads or default_num_threads())  # serve.py's own default when not given
    print(f"{machine_header(host)} (the server's); {host['machine']}, Python {host['python']}", flush=True)

    proc, base = start_server(args)
    done = {"requests": 0, "errors": 0}
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + args.duration

    def client(c: int) -> None:
        rng = random.Random(args.seed * 1000 + c)
        while time.perf_counter() < deadline:
            path, body, stream = make_request(rng, args.max_tokens)
            try:
                post(base + path, body, stream, timeout=300)
                ok = True
            except (urllib.error.URLError, OSError, ValueError):
                ok = False
            with lock:
                done["requests" if ok else "errors"] += 1

    samples: list[dict] = []
    try:
        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.concurrency)]
        for t in threads:
            t.start()
        while True:
            now = time.perf_counter()
            m = scrape(base)
            samples.append({
                "t": round(now - t0, 1), "rss_mib": rss_bytes(proc.pid) / 2**20,
                "metrics_resident_mib": m.get('promptlookup_memory_bytes{holder="resident"}', 0) / 2**20,
                "ngram_pool_mib": m.get('promptlookup_memory_bytes{holder="ngram_pool"}', 0) / 2**20,
                "patterns": int(m.get("promptlookup_ngram_pool_patterns", 0)),
                "evictions": int(m.get("promptlookup_ngram_pool_evictions_total", 0)),
                "requests": done["requests"], "generated_tokens": int(m.get("promptlookup_generated_tokens_total", 0)),
                "weights_mib": m.get('promptlookup_memory_bytes{holder="weights"}', 0) / 2**20,
                "kv_pool_mib": m.get('promptlookup_memory_bytes{holder="kv_pool"}', 0) / 2**20,
            })
            if now >= deadline:
                break
            time.sleep(max(0.0, min(args.sample_every, deadline - time.perf_counter())))
        for t in threads:
            t.join(timeout=300)
        final = scrape(base)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()

    after = [s for s in samples if s["t"] >= warmup] or samples[-1:]
    warm, end = after[0], samples[-1]
    growth = (end["rss_mib"] - warm["rss_mib"]) / warm["rss_mib"]
    print(f"{'t s':>7} {'VmRSS MiB':>10} {'/metrics MiB':>12} {'pool MiB':>9} {'patterns':>9} {'evicted':>9} "
          f"{'requests':>8} {'tokens':>7}")
    for s in samples:
        mark = " <- warm-up ends" if s is warm else ""
        print(f"{s['t']:7.1f} {s['rss_mib']:10.1f} {s['metrics_resident_mib']:12.1f} {s['ngram_pool_mib']:9.2f} "
              f"{s['patterns']:9d} {s['evictions']:9d} {s['requests']:8d} {s['generated_tokens']:7d}{mark}")
    result = {
        "bench": "soak", "machine": host, "server_threads": args.num_threads or "serve.py default",
        "engine_dir": args.engine_dir, "prompt_lookup_config": args.prompt_lookup_config,
        "ngram_pool_max_patterns": args.ngram_pool_max_patterns, "duration_s": args.duration, "warmup_s": warmup,
        "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "requests": done["requests"], "errors": done["errors"],
        "generated_tokens": int(final.get("promptlookup_generated_tokens_total", 0)),
        "acceptance_rate": final.get("promptlookup_acceptance_rate", 0.0),
        "weights_mib": end["weights_mib"], "kv_pool_mib": end["kv_pool_mib"],
        "rss_warm_mib": warm["rss_mib"], "rss_end_mib": end["rss_mib"],
        "rss_max_after_warmup_mib": max(s["rss_mib"] for s in after), "rss_growth": growth,
        "tolerance": args.tolerance, "flat": growth <= args.tolerance, "samples": samples,
    }
    print(f"RSS after warm-up {warm['rss_mib']:.1f} MiB, at the end {end['rss_mib']:.1f} MiB "
          f"({growth:+.2%}; max after warm-up {result['rss_max_after_warmup_mib']:.1f} MiB): "
          f"{'flat' if result['flat'] else 'GROWING'} (tolerance {args.tolerance:.0%})")
    print(json.dumps(result))
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.output_json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
