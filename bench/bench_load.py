#!/usr/bin/env python3
"""serve.py under a real load generator (NVIDIA's aiperf): prompt lookup against plain decoding.

The bench installs aiperf (PyPI ``aiperf``, pinned by ``--loadgen_spec``) into its own
virtualenv under ``~/.cache/promptlookup/loadgen/aiperf`` (never into the project's
environment); when that fails it prints one line and writes a ``"status": "skipped"`` JSON,
exit 0. Then, for each round (``--rounds``), it starts two fresh ``serve.py`` processes on
127.0.0.1 (free ports): ``plain`` (no drafts) and ``lookup`` (``--prompt_lookup_config``),
and for every endpoint (chat, completions) and concurrency (1, 4, 8, 16) runs
``aiperf profile`` against each of them in turn, the order alternating from one cell and
round to the next. The two servers of a round receive identical requests in identical
order, so their n-gram pools and prefix caches see the same traffic; fresh servers each
round make the rounds repeat one another.

Requests: greedy (temperature 0), streaming, ``--max_tokens`` each, input-grounded prompts
(a standard-library function to rewrite, or a CNN/DailyMail article to summarise), every
request of a server's lifetime its own prompt; the completions endpoint gets them in the
model's chat template unless ``--completions_prompt raw``. A cell sends ``max(--min_requests,
--requests_per_client x concurrency)`` requests.

Reported per (endpoint, concurrency, mode, round): output tokens/s over the cell's duration,
TTFT and inter-token latency (mean and median, from aiperf, token counts from the server's
usage), failed requests and the draft acceptance (from ``/metrics``); then per (endpoint,
concurrency) the ratio lookup/plain of output tokens/s in each round, with its median and
range, against the targets (>= 1.5 at concurrency 1; never below plain beyond noise).
Checked: every request answered, and each prompt's greedy text identical from both servers
(aiperf's ``--export-outputs-json``); the exit code is 1 otherwise.

Cost: about ``rounds x 2 x cells`` aiperf runs of a few seconds of start-up each plus the
requests themselves; two servers of ~1 GB resident each.

    python bench/bench_load.py --rounds 2 --output_json bench/results/load.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine_header, machine_info  # noqa: E402
from promptlookup.cli.args import ArgumentParser  # noqa: E402  (one-line errors, no abbreviations)
from promptlookup.errors import UserError  # noqa: E402

ENDPOINTS = ("chat", "completions")
MODES = ("plain", "lookup")
TARGET_AT_ONE = 1.5
MODEL_NAME = "bench"


def int_list(text: str) -> list[int]:
    """An argparse ``type``: ``"1,4,8"`` as positive integers, in the order given, no repeats."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct integers >= 1, got {text!r}")
    return values


def endpoint_list(text: str) -> list[str]:
    """An argparse ``type``: a comma-separated subset of chat, completions."""
    values = [v.strip() for v in text.split(",")]
    bad = [v for v in values if v not in ENDPOINTS]
    if bad or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct values among {', '.join(ENDPOINTS)}, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench_load.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", default=str(ROOT / "artifacts/smollm2/engine"), help="engine both servers load")
    p.add_argument("--tokenizer_dir", default=None, help="tokenizer aiperf loads (default: the engine directory)")
    p.add_argument("--endpoints", type=endpoint_list, default="chat,completions", help="OpenAI endpoints to drive")
    p.add_argument("--concurrency", type=int_list, default="1,4,8,16", help="concurrent requests aiperf keeps open")
    p.add_argument("--rounds", type=positive_int, default=3, help="rounds, each with two fresh servers")
    p.add_argument("--requests_per_client", type=positive_int, default=2,
                   help="a cell sends this many requests per concurrent client (at least --min_requests)")
    p.add_argument("--min_requests", type=positive_int, default=4, help="fewest requests in a cell")
    p.add_argument("--max_tokens", type=positive_int, default=48, help="max_tokens of every request (greedy)")
    p.add_argument("--prompt_lookup_config", default="[10,2]", help="the lookup server's prompt lookup")
    p.add_argument("--server_args", default="", help="extra serve.py flags for both servers, one shell-quoted string")
    p.add_argument("--completions_prompt", choices=["templated", "raw"], default="templated",
                   help="templated: the completions endpoint gets each prompt in the model's chat template (so it "
                        "answers the instruction, as chat does); raw: the bare text, which the model merely continues")
    p.add_argument("--prompts", choices=["code", "summary"], default="code",
                   help="code: rewrite a standard-library function; summary: CNN/DailyMail articles")
    p.add_argument("--dataset_path", default=str(ROOT.parent / "shared/data/cnn_dailymail/train_sample.jsonl"),
                   help="CNN/DailyMail JSONL for --prompts summary")
    p.add_argument("--num_threads", type=positive_int, default=None,
                   help="server threads (serve.py --num_threads where it has it, else OMP_NUM_THREADS; "
                        "default: the project's default count)")
    p.add_argument("--loadgen_dir", default=str(Path.home() / ".cache/promptlookup/loadgen"),
                   help="where the load generator's own virtualenv lives")
    p.add_argument("--loadgen_spec", default="aiperf==0.13.0", help="pip requirement of the load generator")
    p.add_argument("--run_timeout", type=positive_int, default=900, help="seconds one aiperf run may take")
    p.add_argument("--work_dir", default=None, help="keep server logs, prompt files and aiperf artifacts here "
                                                    "(default: a temporary folder, removed)")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/load.json"), help="where to write the results")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)  # (argparse passes string defaults through ``type`` too)
    from promptlookup.cli.args import parse_prompt_lookup_config

    parse_prompt_lookup_config(args.prompt_lookup_config)  # refused here, not by a server later
    try:
        args.server_args = shlex.split(args.server_args)
    except ValueError as exc:
        raise UserError(f"--server_args {args.server_args!r} is not a valid shell string ({exc})") from None
    if not re.fullmatch(r"aiperf(\s*[=<>!~].*)?", args.loadgen_spec.strip()):
        raise UserError(f"--loadgen_spec must name aiperf (e.g. aiperf==0.13.0), got {args.loadgen_spec!r}")
    return args


def cell_requests(concurrency: int, per_client: int, minimum: int) -> int:
    """Requests one (endpoint, concurrency) cell sends."""
    return max(minimum, per_client * concurrency)


# ---------------------------------------------------------------- prompts

def code_prompts(count: int) -> list[str]:
    """``count`` distinct code-edit prompts: each standard-library function with each rewrite
    task in turn (functions first, so the first len(functions) prompts share no source)."""
    from promptlookup.evaluation.grounded_prompts import CODE_TASKS, stdlib_functions

    funcs = stdlib_functions()
    if count > len(funcs) * len(CODE_TASKS):
        raise UserError(f"the bench needs {count} distinct prompts per server, only {len(funcs) * len(CODE_TASKS)} "
                        "code edits exist; lower --requests_per_client or --concurrency, or use --prompts summary")
    out = []
    for i in range(count):
        _name, src = funcs[i % len(funcs)]
        task = CODE_TASKS[(i + i // len(funcs)) % len(CODE_TASKS)]
        out.append(f"{task}\n\n```python\n{src}\n```")
    return out


def templated(prompts: list[str], tokenizer_dir: str) -> list[str]:
    """Each prompt as the text of one user turn in the tokenizer's chat template, ready for
    the assistant's answer (what the chat endpoint feeds the model)."""
    from promptlookup.runtime import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    if not getattr(tok, "chat_template", None):
        raise UserError(f"the tokenizer in {tokenizer_dir} has no chat template; pass --completions_prompt raw")
    return [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


def load_prompts(kind: str, count: int, dataset_path: str) -> list[str]:
    """``count`` distinct input-grounded prompts of the given kind."""
    if kind == "code":
        return code_prompts(count)
    from promptlookup.evaluation.grounded_prompts import summary_prompts

    if not Path(dataset_path).is_file():
        raise UserError(f"--dataset_path {dataset_path} does not exist; give the CNN/DailyMail JSONL or use "
                        "--prompts code")
    prompts = summary_prompts(dataset_path, count)
    if len(prompts) < count:
        raise UserError(f"{dataset_path} has {len(prompts)} articles, the bench needs {count} per server; "
                        "lower --requests_per_client or --concurrency")
    return prompts


# ---------------------------------------------------------------- the load generator

def loadgen_version(python: Path) -> str | None:
    """aiperf's installed version in the virtualenv of ``python``, or None."""
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_loadgen(root: Path, spec: str) -> tuple[Path | None, str]:
    """(aiperf executable, version) from its own virtualenv under ``root``, installing it when
    absent or not at the pinned version; (None, reason) when that fails. Cost: nothing when
    installed; otherwise a pip install (about 1 GB, a few minutes)."""
    venv = root / "aiperf"
    python, exe = venv / "bin/python", venv / "bin/aiperf"
    pinned = spec.split("==", 1)[1].strip() if "==" in spec else None
    have = loadgen_version(python)
    if have and exe.exists() and (pinned is None or have == pinned):
        return exe, have
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        print(f"installing {spec} into {venv} ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip().splitlines()
        return None, f"could not install {spec} into {venv}: {detail[-1] if detail else exc}"
    have = loadgen_version(python)
    if not have or not exe.exists():
        return None, f"{spec} installed into {venv} but {exe} does not run"
    return exe, have


def aiperf_command(exe: Path, url: str, endpoint: str, concurrency: int, requests: int, input_file: Path,
                   tokenizer: str, max_tokens: int, out_dir: Path) -> list[str]:
    """The ``aiperf profile`` command of one cell: streaming, greedy, the file's prompts in
    order (one request each), token counts from the server's usage."""
    return [str(exe), "profile", "--model", MODEL_NAME, "--url", url, "--endpoint-type", endpoint, "--streaming",
            "--concurrency", str(concurrency), "--request-count", str(requests),
            "--input-file", str(input_file), "--custom-dataset-type", "single_turn",
            "--dataset-sampling-strategy", "sequential", "--tokenizer", tokenizer,
            "--extra-inputs", f"max_tokens:{max_tokens}", "--extra-inputs", "temperature:0",
            "--use-server-token-count", "--output-artifact-dir", str(out_dir), "--ui-type", "none",
            "--workers-max", "1", "--record-processor-service-count", "1",
            "--no-server-metrics", "--no-gpu-telemetry", "--export-outputs-json"]


def parse_aiperf_export(data: dict[str, Any]) -> dict[str, Any]:
    """The figures the bench reports from aiperf's ``profile_export_aiperf.json``
    (times in ms, throughput in output tokens/s over the run's duration)."""
    def stat(key: str, name: str) -> float | None:
        value = data.get(key)
        return float(value[name]) if isinstance(value, dict) and value.get(name) is not None else None

    errors = stat("error_request_count", "avg")
    if errors is None:
        errors = sum(int(e.get("count", 1)) for e in data.get("error_summary") or [])
    return {
        "requests": int(stat("completed_request_count", "avg") or stat("request_count", "avg") or 0),
        "errors": int(errors), "error_messages": sorted({str((e.get("error_details") or {}).get("message", ""))[:200]
                                                         for e in data.get("error_summary") or []}),
        "output_tok_s": stat("output_token_throughput", "avg"),
        "ttft_ms_avg": stat("time_to_first_token", "avg"), "ttft_ms_p50": stat("time_to_first_token", "p50"),
        "itl_ms_avg": stat("inter_token_latency", "avg"), "itl_ms_p50": stat("inter_token_latency", "p50"),
        "latency_ms_avg": stat("request_latency", "avg"), "output_tokens": stat("total_output_tokens", "avg"),
        "duration_s": stat("benchmark_duration", "avg"), "aiperf_version": data.get("aiperf_version"),
        "effective_concurrency": stat("effective_concurrency", "avg"),
    }


def run_cell(exe: Path, url: str, endpoint: str, concurrency: int, prompts: list[str], tokenizer: str,
             max_tokens: int, out_dir: Path, timeout: int) -> dict[str, Any]:
    """One aiperf run; its parsed figures, or ``{"error": ...}`` when it produced none."""
    out_dir.mkdir(parents=True, exist_ok=True)
    input_file = out_dir / "prompts.jsonl"
    input_file.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts), encoding="utf-8")
    cmd = aiperf_command(exe, url, endpoint, concurrency, len(prompts), input_file, tokenizer, max_tokens, out_dir)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # aiperf's own environment only
    with open(out_dir / "aiperf.log", "w") as log:
        try:
            subprocess.run(cmd, cwd=out_dir, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"aiperf ran over --run_timeout {timeout} s"}
    export = out_dir / "profile_export_aiperf.json"
    if not export.is_file():
        return {"error": "aiperf wrote no results: " + aiperf_failure((out_dir / "aiperf.log").read_text(errors="replace"))}
    return parse_aiperf_export(json.loads(export.read_text()))


def read_outputs(inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, str]:
    """Prompt -> generated text, from aiperf's ``inputs.json`` (each session's request body)
    and ``outputs.json`` (each request's ``response_text``, keyed by its conversation)."""
    prompts = {}
    for session in inputs.get("data", []):
        body = (session.get("payloads") or [{}])[0]
        prompt = body["messages"][-1]["content"] if "messages" in body else body.get("prompt")
        prompts[session["session_id"]] = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return {prompts[o["conversation_id"]]: o.get("response_text") or ""
            for o in outputs.get("data", []) if o.get("conversation_id") in prompts}


def compare_outputs(plain: dict[str, str], lookup: dict[str, str]) -> tuple[int, int]:
    """(prompts both modes answered, how many of those answers are identical): greedy
    prompt lookup must reproduce plain decoding's text exactly."""
    both = [p for p in plain if p in lookup]
    return len(both), sum(plain[p] == lookup[p] for p in both)


def cell_outputs(out_dir: Path) -> dict[str, str]:
    """:func:`read_outputs` of one aiperf run's folder ({} when it wrote none)."""
    try:
        return read_outputs(json.loads((out_dir / "inputs.json").read_text()),
                            json.loads((out_dir / "outputs.json").read_text()))
    except (OSError, ValueError, KeyError):
        return {}


def aiperf_failure(log: str) -> str:
    """The first ERROR message of an aiperf log (its timestamp and source location cut), else
    its last non-blank line; at most 300 characters."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in lines:
        match = re.match(r"^[\d:.]+\s+ERROR\s+(.*?)(\s+\([\w./]+:\d+\))?$", line)
        if match:
            return match.group(1)[:300]
    return lines[-1][:300] if lines else "(empty log)"


# ---------------------------------------------------------------- the servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_supports(flag: str) -> bool:
    """Whether today's ``serve.py --help`` lists ``flag`` (another branch may add it)."""
    done = subprocess.run([sys.executable, str(ROOT / "serve.py"), "--help"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return flag in done.stdout


def metrics(url: str) -> dict[str, float]:
    """The server's Prometheus counters, ``name{labels}`` -> value ({} when it does not answer)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def post(url: str, path: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()


class Server:
    """One ``serve.py`` subprocess on 127.0.0.1; :meth:`stop` ends it (SIGINT, then SIGKILL)."""

    def __init__(self, args: argparse.Namespace, mode: str, log_path: Path, thread_flag: bool) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(ROOT / "serve.py"), "--engine_dir", args.engine_dir, "--port", str(self.port),
               "--served_model_name", MODEL_NAME, *args.server_args]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if thread_flag:
            cmd += ["--num_threads", str(args.num_threads)]
        else:
            env["OMP_NUM_THREADS"] = str(args.num_threads)
        if mode == "lookup":
            cmd += ["--prompt_lookup_config", args.prompt_lookup_config]
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until ``/health`` answers, then warm both endpoints with one short request each."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise UserError(f"serve.py exited with {self.proc.returncode}: {' '.join(tail)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise UserError(f"serve.py did not answer /health within {timeout:.0f} s") from None
                time.sleep(0.5)
        post(self.url, "/v1/completions", {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        post(self.url, "/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0,
                                                "messages": [{"role": "user", "content": "Hello"}]})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ---------------------------------------------------------------- results

def ratio_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (endpoint, concurrency): lookup/plain output tokens/s in each round where both
    modes completed, their median and range, and the verdicts against the targets.

    "below plain beyond noise": every round's ratio is under 1 and the median is under
    1 - s, where s is plain's own relative spread over the rounds ((max - min) / median of
    its tokens/s): a loss larger than the run-to-run noise of the baseline itself. With one
    round there is no noise estimate, and the verdict is None.
    """
    cells: dict[tuple[str, int], dict[int, dict[str, dict[str, Any]]]] = {}
    for r in runs:
        if r.get("output_tok_s"):
            cells.setdefault((r["endpoint"], r["concurrency"]), {}).setdefault(r["round"], {})[r["mode"]] = r
    table = []
    for (endpoint, conc), rounds in cells.items():
        pairs = {rnd: m for rnd, m in sorted(rounds.items()) if set(m) == set(MODES)}
        if not pairs:
            continue
        ratios = [m["lookup"]["output_tok_s"] / m["plain"]["output_tok_s"] for m in pairs.values()]
        plain = [m["plain"]["output_tok_s"] for m in pairs.values()]
        lookup = [m["lookup"]["output_tok_s"] for m in pairs.values()]
        median = statistics.median(ratios)
        noise = (max(plain) - min(plain)) / statistics.median(plain) if len(pairs) > 1 else None
        row = {"endpoint": endpoint, "concurrency": conc, "rounds": list(pairs), "ratios": ratios,
               "ratio_median": median, "ratio_min": min(ratios), "ratio_max": max(ratios),
               "plain_tok_s_median": statistics.median(plain), "lookup_tok_s_median": statistics.median(lookup),
               "plain_spread": noise,
               "below_plain_beyond_noise": None if noise is None else max(ratios) < 1.0 and median < 1.0 - noise}
        if conc == 1:
            row["meets_1_5x"] = median >= TARGET_AT_ONE
        table.append(row)
    return sorted(table, key=lambda row: (ENDPOINTS.index(row["endpoint"]), row["concurrency"]))


def format_ratio_table(table: list[dict[str, Any]]) -> str:
    lines = [f"{'endpoint':<12s} {'conc':>4s} {'plain tok/s':>11s} {'lookup tok/s':>12s} {'ratio':>6s} "
             f"{'range':>11s}  per round / verdict"]
    for row in table:
        verdict = ""
        if "meets_1_5x" in row:
            verdict = "; >= 1.5x: " + ("met" if row["meets_1_5x"] else "NOT met")
        if row["below_plain_beyond_noise"]:
            verdict += "; BELOW plain beyond noise"
        elif row["below_plain_beyond_noise"] is None:
            verdict += "; (one round: no noise estimate)"
        rounds = " ".join(f"{x:.2f}" for x in row["ratios"])
        lines.append(f"{row['endpoint']:<12s} {row['concurrency']:4d} {row['plain_tok_s_median']:11.1f} "
                     f"{row['lookup_tok_s_median']:12.1f} {row['ratio_median']:6.2f} "
                     f"{row['ratio_min']:5.2f}-{row['ratio_max']:<5.2f}  {rounds}{verdict}")
    return "\n".join(lines)


def format_run(r: dict[str, Any]) -> str:
    head = f"round {r['round']} {r['endpoint']:<11s} c={r['concurrency']:<2d} {r['mode']:<6s}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"
    acc = "" if r.get("acceptance") is None else f", acceptance {100 * r['acceptance']:.0f}%"
    return (f"{head} {r['output_tok_s'] or 0:7.1f} tok/s  TTFT {ms(r['ttft_ms_avg'])}/{ms(r['ttft_ms_p50'])} ms  "
            f"ITL {r['itl_ms_avg'] or 0:.1f}/{r['itl_ms_p50'] or 0:.1f} ms (mean/p50)  "
            f"{r['requests']} requests, {r['errors']} failed{acc}")


def header(args: argparse.Namespace, thread_flag: bool, aiperf_version: str | None) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    import promptlookup

    return {
        **machine_info(args.num_threads),  # num_threads: the server's
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "threads_via": "serve.py --num_threads" if thread_flag else "OMP_NUM_THREADS (serve.py has no --num_threads)",
        "versions": {"python": platform.python_version(), "promptlookup": promptlookup.__version__,
                     "torch": version("torch"), "uvicorn": version("uvicorn"), "starlette": version("starlette"),
                     "aiperf": aiperf_version},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from promptlookup.fsutil import atomic_write_json
    from promptlookup.threads import default_num_threads

    args.num_threads = args.num_threads or default_num_threads()
    if not Path(args.engine_dir).exists():
        raise UserError(f"--engine_dir {args.engine_dir} does not exist; build it first (make build)")
    args.engine_dir = str(Path(args.engine_dir).resolve())  # the servers and aiperf run in other folders
    tokenizer = str(Path(args.tokenizer_dir or args.engine_dir).resolve())
    per_server = len(args.endpoints) * sum(cell_requests(c, args.requests_per_client, args.min_requests)
                                           for c in args.concurrency)
    prompts = load_prompts(args.prompts, per_server, args.dataset_path)
    thread_flag = serve_supports("--num_threads")
    exe, version = ensure_loadgen(Path(args.loadgen_dir).expanduser(), args.loadgen_spec)
    config = {k: v for k, v in vars(args).items()}
    if exe is None:
        print(f"bench_load: skipped: {version}", flush=True)
        atomic_write_json(args.output_json, {"status": "skipped", "reason": version,
                                              **header(args, thread_flag, None), "config": config})
        return 0
    texts_for = {"chat": prompts, "completions": prompts}
    if "completions" in args.endpoints and args.completions_prompt == "templated":
        texts_for["completions"] = templated(prompts, tokenizer)
    head = header(args, thread_flag, version)
    print(f"{machine_header(head)} (the server's, via {head['threads_via']}); {platform.machine()}; "
          f"load average {' '.join(f'{x:.1f}' for x in head['load_average'] or [])}; "
          + ", ".join(f"{k} {v}" for k, v in head["versions"].items()), flush=True)
    print(f"{per_server} prompts ({args.prompts}) per server, max_tokens {args.max_tokens}, lookup "
          f"{args.prompt_lookup_config}, rounds {args.rounds}", flush=True)
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []  # per cell: plain's and lookup's greedy texts compared
    with ExitStack() as stack:
        work = Path(args.work_dir) if args.work_dir else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        cell = 0
        for rnd in range(args.rounds):
            servers = {m: Server(args, m, work / f"server_r{rnd}_{m}.log", thread_flag) for m in MODES}
            try:
                for server in servers.values():
                    server.wait_ready()
                offset = 0
                for endpoint in args.endpoints:
                    for conc in args.concurrency:
                        n = cell_requests(conc, args.requests_per_client, args.min_requests)
                        chunk = texts_for[endpoint][offset:offset + n]  # both modes: the same, unseen by either
                        offset += n
                        order = MODES if cell % 2 == 0 else MODES[::-1]
                        cell += 1
                        answers = {}
                        for mode in order:
                            url = servers[mode].url
                            before = metrics(url)
                            out_dir = work / f"r{rnd}_{endpoint}_c{conc}_{mode}"
                            result = run_cell(exe, url, endpoint, conc, chunk, tokenizer, args.max_tokens, out_dir,
                                              args.run_timeout)
                            answers[mode] = cell_outputs(out_dir)
                            after = metrics(url)
                            drafted, accepted = (after.get(k, 0.0) - before.get(k, 0.0) for k in
                                                 ("promptlookup_draft_tokens_total",
                                                  "promptlookup_accepted_draft_tokens_total"))
                            result.update(endpoint=endpoint, concurrency=conc, mode=mode, round=rnd,
                                          acceptance=accepted / drafted if drafted else None)
                            runs.append(result)
                            print(format_run(result), flush=True)
                        compared, identical = compare_outputs(answers["plain"], answers["lookup"])
                        checks.append({"endpoint": endpoint, "concurrency": conc, "round": rnd,
                                       "compared": compared, "identical": identical})
                        if identical < compared:
                            print(f"  greedy outputs: {compared - identical} of {compared} differ between plain and "
                                  "lookup", flush=True)
                        atomic_write_json(args.output_json, {"status": "partial", **head, "config": config,
                                                              "runs": runs, "greedy_checks": checks})
            finally:
                for server in servers.values():
                    server.stop()
    table = ratio_table(runs)
    print("\nlookup/plain, output tokens/s (median over rounds, range, each round):")
    print(format_ratio_table(table))
    compared, identical = sum(c["compared"] for c in checks), sum(c["identical"] for c in checks)
    print(f"greedy outputs identical between plain and lookup: {identical} of {compared} requests")
    head["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    head["wall_s"] = time.monotonic() - started
    print(f"{head['wall_s']:.0f} s; load average at the end "
          f"{' '.join(f'{x:.1f}' for x in head['load_average_end'] or [])}")
    failed = sum(1 for r in runs if "error" in r) + sum(r.get("errors", 0) for r in runs) + compared - identical
    atomic_write_json(args.output_json, {"status": "ok", **head, "config": config, "runs": runs,
                                          "lookup_over_plain": table, "greedy_checks": checks,
                                          "targets": {"ratio_at_concurrency_1": TARGET_AT_ONE,
                                                      "never_below_plain_beyond_noise": True}})
    print(f"wrote {args.output_json}")
    return 1 if failed else 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
