#!/usr/bin/env python3
"""llama.cpp side by side: its plain decoding and llama-lookup against our plain and V2 prompt lookup.

What it measures, in one run on one machine, with the same prompts, the same thread
count and greedy decoding for everyone:

- ``llama.cpp plain``: ``llama-completion`` on the bundled GGUF (SmolLM2-135M-Instruct,
  Q4_1), and, with ``--llamacpp_f32`` (default on), on an F32 copy of it that
  ``llama-quantize --allow-requantize`` writes once (the same dequantized weights our
  fp32 engine holds);
- ``llama.cpp lookup``: ``llama-lookup`` (its n-gram cache drafter, n-grams of 1 to 4
  tokens, drafts of up to ``k`` tokens) on the same GGUF files;
- ``ours plain`` and ``ours V2``: this project's runtime on each engine given
  (``--engine_dir``, repeatable, or ``--engines fp32=DIR,int8=DIR``; default: the fp32
  engine ``artifacts/smollm2/engine``), plain greedy decoding and V2 prompt lookup with
  ``--prompt_lookup_config`` (``[k, n]``, default ``[10,2]``; the engine's default
  cost-aware draft length policy), KV block reuse off, so every call prefills afresh as a
  new llama.cpp process does.

Prompts: ``--num_prompts`` code edits built from Python standard-library functions by
:mod:`promptlookup.evaluation.grounded_prompts` (input-grounded: the answer copies the
input), wrapped in the model's chat template by our tokenizer. llama.cpp gets that
templated text with ``-p`` (``--no-escape``, special tokens parsed), so both see the
same tokens: ``llama-tokenize`` checks that the ids are equal, and the prompt token count
llama.cpp reports is recorded too.

Timing. Decode speed counts the generation only, without the prefill: tokens after the
first divided by the time after the first token was available. llama.cpp plain: the
``eval time = T ms / R runs`` line (R one-token forward passes after the prompt's),
``R / T``; prefill: its ``prompt eval time``. llama-lookup: its ``decoded N tokens in T
seconds`` line, ``(N - 1) / T`` (the first of the N comes from the prefill's logits);
prefill: ``encoded ... in T seconds``. Ours: ``promptlookup.decoding.generate`` with a
step callback, the time from the first step event (prefill plus first token) to the end,
over tokens after the first. Each round runs every prompt through every peer (peer order
reversed in odd rounds); a round's decode speed is its tokens over its seconds summed over
the prompts, and the table shows the median over ``--rounds``.

Identity. Ours V2 must equal ours plain token for token (a difference makes the run exit
1, after the JSON is written). llama.cpp lookup is compared with llama.cpp plain on the
same GGUF, and every row with our fp32 plain output, as text over the common length
(llama-lookup overshoots ``-n`` by up to a draft; a run ending on the end token is
shorter): Q4_1 weights and llama.cpp's quantized activations are expected to part from
fp32, so those are reported, not required.

Getting llama.cpp: the ``llama-cpp-python`` source package vendors it. Unless
``--llamacpp_dir`` names a build, ``pip download --no-deps --no-binary :all:
llama-cpp-python==VERSION`` fetches it into ``~/.cache/promptlookup/llama.cpp/downloads``,
it is unpacked into ``~/.cache/promptlookup/llama.cpp/VERSION/`` and CMake builds the CPU
targets ``llama-completion``, ``llama-lookup``, ``llama-tokenize`` and ``llama-quantize``
there (``nice -n 19``, ``--build_jobs`` jobs; log in ``build.log``). Later runs reuse the
binaries. Without cmake, a C++ compiler or the network, one line says so and the llama.cpp
rows are skipped; ours still run. Nothing of llama.cpp enters this repository.

    python bench/bench_llamacpp.py --num_threads 1
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.machine import machine_header, machine_info  # noqa: E402
# promptlookup.cli.args sets the OpenMP wait policy, which must come before torch is imported.
from promptlookup.cli.args import ArgumentParser, parse_prompt_lookup_config  # noqa: E402
from promptlookup.errors import UserError  # noqa: E402
from promptlookup.threads import users_environment  # noqa: E402

LLAMACPP_PACKAGE = "llama-cpp-python"
DEFAULT_LLAMACPP_VERSION = "0.3.36"
DEFAULT_CACHE = Path.home() / ".cache" / "promptlookup" / "llama.cpp"
PLAIN_BIN, LOOKUP_BIN = "llama-completion", "llama-lookup"
TOKENIZE_BIN, QUANTIZE_BIN = "llama-tokenize", "llama-quantize"
TARGETS = (PLAIN_BIN, LOOKUP_BIN, TOKENIZE_BIN, QUANTIZE_BIN)
REQUIRED = (PLAIN_BIN, LOOKUP_BIN, TOKENIZE_BIN)
ENGINE = ROOT / "artifacts" / "smollm2" / "engine"


# ----------------------------------------------------------------------------- llama.cpp's output


@dataclass
class PlainTimings:
    """``llama-completion``'s context timings: the prompt (``prompt eval time``) and the
    one-token forward passes after it (``eval time``, ``runs``)."""

    prompt_ms: float
    prompt_tokens: int
    eval_ms: float
    eval_runs: int


@dataclass
class LookupTimings:
    """``llama-lookup``'s summary: prompt tokens encoded, tokens decoded (``n_predict``,
    the first included) and the seconds of each phase, drafted and accepted tokens."""

    encoded_tokens: int
    encode_s: float
    decoded_tokens: int
    decode_s: float
    drafted: int
    accepted: int


_PROMPT_EVAL = re.compile(r"prompt eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*tokens")
_EVAL = re.compile(r":\s+eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*runs")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def _last(pattern: re.Pattern[str], text: str, what: str) -> tuple[str, ...]:
    found = pattern.findall(text)
    if not found:
        raise ValueError(f"llama.cpp printed no {what} line")
    last = found[-1]
    return last if isinstance(last, tuple) else (last,)


def parse_plain_timings(log: str) -> PlainTimings:
    """The last ``prompt eval time`` and ``eval time`` lines of a llama.cpp log (stderr).
    A ValueError when either is missing."""
    p_ms, p_tokens = _last(_PROMPT_EVAL, log, "'prompt eval time'")
    e_ms, e_runs = _last(_EVAL, log, "'eval time'")
    return PlainTimings(float(p_ms), int(p_tokens), float(e_ms), int(e_runs))


def parse_lookup_timings(log: str) -> LookupTimings:
    """``llama-lookup``'s ``encoded``/``decoded`` lines and its ``n_drafted``/``n_accept``
    counts. A ValueError when any is missing."""
    enc_n, enc_s = _last(_ENCODED, log, "'encoded ... tokens in'")
    dec_n, dec_s = _last(_DECODED, log, "'decoded ... tokens in'")
    (drafted,) = _last(_DRAFTED, log, "n_drafted")
    (accepted,) = _last(_ACCEPTED, log, "n_accept")
    return LookupTimings(int(enc_n), float(enc_s), int(dec_n), float(dec_s), int(drafted), int(accepted))


def parse_token_ids(stdout: str) -> list[int]:
    """The ids ``llama-tokenize --ids`` prints (``[1, 2, 3]``)."""
    match = re.search(r"\[([\d,\s]*)\]", stdout)
    if match is None:
        raise ValueError("llama-tokenize printed no [ids] list")
    return [int(t) for t in match.group(1).replace(",", " ").split()]


def plain_output_text(stdout: str) -> str:
    """``llama-completion --no-display-prompt``'s generated text: what it prints less the two
    newlines it ends with and the `` [end of text]`` line it adds when the model ended the
    answer."""
    text = stdout[:-2] if stdout.endswith("\n\n") else stdout
    marker = " [end of text]\n"
    return text[:-len(marker)] if text.endswith(marker) else text


def lookup_output_text(stdout: str, prompt_text: str, end_text: str) -> str:
    """``llama-lookup``'s generated text: it prints two newlines, the prompt's pieces, the
    generated pieces (the end token's text included) and newlines. What follows the prompt,
    cut at the end token's text, with the trailing newlines it adds (4) removed."""
    start = stdout.find(prompt_text)
    text = stdout[start + len(prompt_text):] if start >= 0 else stdout
    if text.endswith("\n\n\n\n"):
        text = text[:-4]
    if end_text and end_text in text:
        text = text[:text.index(end_text)]
    return text


def agree_over_common_length(a: str, b: str) -> bool:
    """Whether two outputs are equal over the shorter one's length (a run can stop on the
    end token, and llama-lookup generates up to a draft beyond ``-n``)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


# ----------------------------------------------------------------------------- getting llama.cpp


@dataclass
class LlamaCpp:
    """A llama.cpp build: its binaries folder and where it came from."""

    bin_dir: Path
    version: str  # llama-cpp-python's version, or the folder's name
    commit: str  # llama.cpp's commit from llama-cpp-python's changelog, "unknown" otherwise
    source_dir: Path | None = None

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def has(self, name: str) -> bool:
        return self.binary(name).is_file() and os.access(self.binary(name), os.X_OK)


def _bin_dir(folder: Path) -> Path:
    for candidate in (folder / "build" / "bin", folder / "bin", folder):
        if (candidate / PLAIN_BIN).is_file():
            return candidate
    return folder / "build" / "bin"


def _source_dir(folder: Path) -> Path | None:
    for candidate in sorted(folder.glob(f"{LLAMACPP_PACKAGE.replace('-', '_')}-*/vendor/llama.cpp")) + [folder]:
        if (candidate / "CMakeLists.txt").is_file() and (candidate / "examples" / "lookup").is_dir():
            return candidate
    return None


def _commit(folder: Path) -> str:
    """llama.cpp's commit as llama-cpp-python's changelog names it (the newest entry)."""
    for log in sorted(folder.glob(f"{LLAMACPP_PACKAGE.replace('-', '_')}-*/CHANGELOG.md")):
        match = re.search(r"llama\.cpp@([0-9a-f]{7,40})", log.read_text(encoding="utf-8", errors="replace"))
        if match:
            return match.group(1)
    return "unknown"


def _describe(folder: Path) -> LlamaCpp:
    return LlamaCpp(_bin_dir(folder), folder.name, _commit(folder), _source_dir(folder))


def _missing_tools() -> list[str]:
    missing = [t for t in ("cmake",) if shutil.which(t) is None]
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler")
    return missing


def _download(version: str, cache: Path) -> Path:
    """The llama-cpp-python source package of ``version``, downloaded by pip (cached)."""
    downloads = cache / "downloads"
    found = sorted(downloads.glob(f"{LLAMACPP_PACKAGE.replace('-', '_')}-{version}.tar.gz"))
    if found:
        return found[0]
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"{LLAMACPP_PACKAGE}=={version}", "-d", str(downloads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(downloads.glob(f"{LLAMACPP_PACKAGE.replace('-', '_')}-{version}.tar.gz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"pip download {LLAMACPP_PACKAGE}=={version} failed (no network?): {last}")
    return found[0]


def _build(folder: Path, source: Path, targets: tuple[str, ...], jobs: int) -> None:
    """CMake's CPU build of ``targets`` in ``folder/build`` at the lowest priority."""
    build = folder / "build"
    log = folder / "build.log"
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    configure = [*nice, "cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"]
    compile_ = [*nice, "cmake", "--build", str(build), "-j", str(jobs), "--target", *targets]
    print(f"building llama.cpp ({', '.join(targets)}) in {build} with {jobs} job(s); log: {log}", flush=True)
    t = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        for cmd in (configure, compile_):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"the llama.cpp build failed ({' '.join(cmd[len(nice):][:3])} ...); see {log}")
    print(f"built llama.cpp in {time.perf_counter() - t:.0f} s", flush=True)


def get_llamacpp(llamacpp_dir: str | None, version: str, cache: Path, jobs: int) -> LlamaCpp | None:
    """A usable llama.cpp build, reused when its binaries exist, else downloaded and built.
    None (after one line saying why) when that cannot be done here."""
    folder = Path(llamacpp_dir).expanduser() if llamacpp_dir else cache / version
    found = _describe(folder)
    if all(found.has(b) for b in TARGETS):
        return found
    try:
        if found.source_dir is None:
            if llamacpp_dir and all(found.has(b) for b in REQUIRED):
                return found  # a build without sources: use what it has
            if _missing_tools():
                raise RuntimeError(f"{' and '.join(_missing_tools())} missing")
            archive = _download(version, cache)
            folder.mkdir(parents=True, exist_ok=True)
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")
            found = _describe(folder)
            if found.source_dir is None:
                raise RuntimeError(f"{archive.name} holds no llama.cpp sources with examples/lookup")
        elif _missing_tools():
            raise RuntimeError(f"{' and '.join(_missing_tools())} missing")
        _build(folder, found.source_dir, tuple(b for b in TARGETS if not found.has(b)), jobs)
        found = _describe(folder)
    except (OSError, RuntimeError, tarfile.TarError) as exc:
        if all(found.has(b) for b in REQUIRED):
            print(f"llama.cpp: {exc}; going on with the binaries there are", flush=True)
            return found
        print(f"llama.cpp skipped: {exc}", flush=True)
        return None
    missing = [b for b in REQUIRED if not found.has(b)]
    if missing:
        print(f"llama.cpp skipped: {', '.join(missing)} not built in {found.bin_dir}", flush=True)
        return None
    return found


# ----------------------------------------------------------------------------- one measurement


@dataclass
class Measurement:
    """One peer on one prompt: decode tokens (after the first) and their seconds, the
    prefill seconds, the tokens generated and the output (text; ours: ids too)."""

    decode_tokens: int
    decode_s: float
    prefill_s: float
    generated_tokens: int
    text: str
    ids: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a llama.cpp binary with the user's environment (not the OpenMP policy our scripts set)."""
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=users_environment())
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(cmd[0]).name} exited {done.returncode}: {tail}")
    return done


@dataclass
class LlamaRunner:
    """Runs llama.cpp's binaries on one GGUF with the bench's settings."""

    llama: LlamaCpp
    gguf: Path
    threads: int
    max_new_tokens: int
    context: int
    draft_max: int
    end_text: str
    draft_flag: str = "--spec-draft-n-max"

    def common(self, prompt_text: str) -> list[str]:
        return ["-m", str(self.gguf), "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.context),
                "-n", str(self.max_new_tokens), "--temp", "0", "--top-k", "1", "--seed", "0", "--no-escape",
                "-p", prompt_text]

    def plain(self, prompt_text: str) -> Measurement:
        done = _run([str(self.llama.binary(PLAIN_BIN)), *self.common(prompt_text), "-no-cnv", "--no-display-prompt"])
        t = parse_plain_timings(done.stderr)
        return Measurement(t.eval_runs, t.eval_ms / 1e3, t.prompt_ms / 1e3, t.eval_runs + 1,
                           plain_output_text(done.stdout), extra={"prompt_tokens": t.prompt_tokens})

    def lookup(self, prompt_text: str) -> Measurement:
        done = _run([str(self.llama.binary(LOOKUP_BIN)), *self.common(prompt_text), self.draft_flag,
                     str(self.draft_max)])
        t = parse_lookup_timings(done.stderr)
        return Measurement(t.decoded_tokens - 1, t.decode_s, t.encode_s, t.decoded_tokens,
                           lookup_output_text(done.stdout, prompt_text, self.end_text),
                           extra={"prompt_tokens": t.encoded_tokens, "drafted": t.drafted, "accepted": t.accepted})

    def tokenize(self, prompt_text: str) -> list[int]:
        done = _run([str(self.llama.binary(TOKENIZE_BIN)), "-m", str(self.gguf), "--ids", "--no-escape",
                     "-p", prompt_text])
        return parse_token_ids(done.stdout)


def lookup_draft_flag(llama: LlamaCpp) -> str:
    """llama-lookup's flag for the largest draft: ``--spec-draft-n-max`` in newer llama.cpp,
    ``--draft-max`` before it."""
    done = subprocess.run([str(llama.binary(LOOKUP_BIN)), "--help"], capture_output=True, text=True,
                          errors="replace")
    return "--spec-draft-n-max" if "--spec-draft-n-max" in done.stdout + done.stderr else "--draft-max"


def f32_gguf(llama: LlamaCpp, gguf: Path, cache: Path) -> Path | None:
    """An F32 copy of ``gguf`` (``llama-quantize --allow-requantize ... F32``), written once
    into ``cache/models``; None (one line) when llama-quantize is missing or fails."""
    out = cache / "models" / f"{gguf.stem}.F32.gguf"
    if out.is_file():
        return out
    if not llama.has(QUANTIZE_BIN):
        print("llama.cpp F32 rows skipped: llama-quantize not built", flush=True)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    try:
        _run([str(llama.binary(QUANTIZE_BIN)), "--allow-requantize", str(gguf), str(part), "F32"])
    except RuntimeError as exc:
        print(f"llama.cpp F32 rows skipped: {exc}", flush=True)
        return None
    part.replace(out)
    return out


def gguf_precision(path: Path) -> str:
    """The GGUF's weight type as its file name says (``...Q4_1.gguf`` -> ``Q4_1``)."""
    match = re.search(r"\.([A-Za-z0-9_]+)\.gguf$", path.name)
    return match.group(1).upper() if match else "gguf"


# ----------------------------------------------------------------------------- ours


def ours_measure(runner: Any, ids: list[int], max_new_tokens: int, end_id: int, draft: Any) -> Measurement:
    """Our greedy generation of one prompt, timed with the step callback: the prefill ends
    at the first step event (the first token), the decode phase runs from there to the end."""
    from promptlookup.decoding import generate

    first: list[float] = []

    def on_step(_event: Any) -> None:
        if not first:
            first.append(time.perf_counter())

    start = time.perf_counter()
    [res] = generate(runner, [ids], max_new_tokens=max_new_tokens, end_id=end_id, draft=draft, workflow="v2",
                     on_step=on_step)
    end = time.perf_counter()
    first_at = first[0] if first else end
    return Measurement(len(res.output_ids) - 1, end - first_at, first_at - start, len(res.output_ids), "",
                       ids=list(res.output_ids), extra={"steps": res.steps, "drafted": res.drafted,
                                                        "accepted": res.accepted})


# ----------------------------------------------------------------------------- the bench


@dataclass
class Peer:
    """One table row: ``tool`` (llama.cpp or ours), ``mode`` (plain, lookup, V2), the weights'
    ``precision`` and how it runs one prompt (by index)."""

    tool: str
    mode: str
    precision: str
    run: Callable[[int], Measurement]
    measurements: dict[int, list[Measurement]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.tool} {self.mode} {self.precision}"


def parse_engines(engine_dirs: list[str] | None, engines: str | None) -> list[tuple[str, Path]]:
    """``(precision label, engine dir)`` from ``--engines fp32=DIR,int8=DIR`` and repeated
    ``--engine_dir [LABEL=]DIR`` (a bare DIR is labelled from its config's dtype); default:
    the fp32 engine."""
    items = [e for e in (engines or "").split(",") if e.strip()] + list(engine_dirs or [])
    if not items:
        return [("fp32", ENGINE)]
    out = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = _dtype_label(Path(item)), item
        if not Path(path).is_dir():
            raise UserError(f"engine dir {path!r} ({label}) is no folder; build it with build.sh first")
        out.append((label.strip(), Path(path)))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise UserError(f"two engines share a precision label ({', '.join(labels)}); label them, e.g. int8=DIR")
    return out


def _dtype_label(engine: Path) -> str:
    import json

    try:
        cfg = json.loads((engine / "config.json").read_text())
        dtype = cfg.get("pretrained_config", {}).get("dtype", "")
    except (OSError, ValueError):
        dtype = ""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype or engine.name)


def parse_lookup_config(text: str) -> tuple[int, int]:
    """``[k, n]`` or TensorRT-LLM's ``[k, n, [devices]]``."""
    stripped = text.strip()
    if stripped.count(",") == 1 and "[" not in stripped[1:]:
        stripped = stripped.rstrip("]") + ",[0]]"
    k, n, _ = parse_prompt_lookup_config(stripped)
    return k, n


def cpu_header(threads: int) -> dict[str, Any]:
    """:func:`bench.machine.machine_info` (CPU model, vector flags, CPUs, the thread count of every
    peer) and the load at the start, for the table's header; ``cores``, ``avx_flags`` and ``threads``
    repeat ``cpus``, ``cpu_flags`` and ``num_threads`` (the keys earlier results have)."""
    info = machine_info(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {**info, "cores": info["cpus"], "avx_flags": info["cpu_flags"], "threads": threads,
            "load_1min_at_start": load}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="bench/bench_llamacpp.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine_dir", action="append", default=None,
                   help="an engine of ours, [LABEL=]DIR (LABEL: its precision, e.g. int8); repeatable "
                        "(default: fp32=artifacts/smollm2/engine when --engines is not given either)")
    p.add_argument("--engines", default=None, help="engines of ours as LABEL=DIR,LABEL=DIR, e.g. fp32=A,int8=B,int4=C")
    p.add_argument("--gguf", default=None,
                   help="the GGUF llama.cpp runs (default: the bundled SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--llamacpp_f32", action=argparse.BooleanOptionalAction, default=True,
                   help="also run llama.cpp on an F32 copy of the GGUF (llama-quantize, written once)")
    p.add_argument("--llamacpp_dir", default=None,
                   help="a llama.cpp build to reuse (its build/bin or bin holds the binaries); default: "
                        "~/.cache/promptlookup/llama.cpp/VERSION, downloaded and built when missing")
    p.add_argument("--llamacpp_version", default=DEFAULT_LLAMACPP_VERSION,
                   help="the llama-cpp-python source package that vendors llama.cpp")
    p.add_argument("--build_jobs", type=int, default=2, help="parallel compile jobs of the llama.cpp build")
    p.add_argument("--no_llamacpp", action="store_true", help="skip llama.cpp, run ours only")
    p.add_argument("--num_prompts", type=int, default=3, help="code-edit prompts")
    p.add_argument("--max_new_tokens", type=int, default=200, help="new tokens per prompt")
    p.add_argument("--prompt_lookup_config", default="[10,2]",
                   help="ours V2: [k, n]; llama-lookup drafts up to k tokens too")
    p.add_argument("--num_threads", type=int, default=1, help="threads of every peer (llama.cpp -t/-tb, torch)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over all prompts and peers; the table shows medians")
    p.add_argument("--output_json", default=str(ROOT / "bench/results/llamacpp.json"), help="where results are written")
    return p


def summarize(peer: Peer, rounds: int) -> dict[str, Any]:
    """Medians over rounds of the round's decode speed (tokens over seconds summed over the
    prompts) and of its mean prefill seconds per prompt."""
    speeds, prefills = [], []
    for r in range(rounds):
        ms = [peer.measurements[i][r] for i in sorted(peer.measurements) if len(peer.measurements[i]) > r]
        if not ms:
            continue
        speeds.append(sum(m.decode_tokens for m in ms) / max(sum(m.decode_s for m in ms), 1e-9))
        prefills.append(statistics.mean(m.prefill_s for m in ms))
    return {"decode_tok_s": statistics.median(speeds) if speeds else None,
            "decode_tok_s_rounds": speeds,
            "prefill_s": statistics.median(prefills) if prefills else None}


def prompts(tok: Any, count: int) -> tuple[list[str], list[list[int]]]:
    """``count`` code-edit prompts in the chat template: the text llama.cpp gets and the ids
    ours gets, checked to be the ids ``run.py --use_chat_template`` would feed the engine."""
    from promptlookup.cli.inputs import encode_text
    from promptlookup.evaluation.grounded_prompts import code_edit_prompts

    texts = code_edit_prompts(count)
    templated = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                         tokenize=False) for t in texts]
    ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in templated]
    for text, own in zip(texts, ids):
        if encode_text(tok, text, use_chat_template=True) != own:
            raise UserError("the chat template's token ids differ from those of its text; llama.cpp cannot be "
                            "given the same tokens")
    return templated, ids


def llamacpp_peers(args: Any, templated: list[str], prompt_ids: list[list[int]], k: int, context: int,
                   end_text: str) -> tuple[list[Peer], dict[str, Any], dict[str, Any]]:
    """llama.cpp's rows (plain and lookup on the GGUF, and on its F32 copy), what was used,
    and the tokenization check; no rows (one line said why) when llama.cpp is unavailable."""
    from promptlookup.checkpoint.bundled import smollm2_gguf_path

    gguf = Path(args.gguf) if args.gguf else smollm2_gguf_path()
    llama = get_llamacpp(args.llamacpp_dir, args.llamacpp_version, DEFAULT_CACHE, args.build_jobs)
    if llama is not None and not gguf.is_file():
        print(f"llama.cpp skipped: no GGUF at {gguf}", flush=True)
        llama = None
    if llama is None:
        return [], {"used": False}, {}
    info = {"used": True, "package": LLAMACPP_PACKAGE, "version": llama.version, "commit": llama.commit,
            "bin_dir": str(llama.bin_dir), "gguf": str(gguf)}
    ggufs = [gguf]
    if args.llamacpp_f32 and gguf_precision(gguf) != "F32":
        f32 = f32_gguf(llama, gguf, DEFAULT_CACHE)
        ggufs += [f32] if f32 else []
    flag = lookup_draft_flag(llama)
    runners = [LlamaRunner(llama, g, args.num_threads, args.max_new_tokens, context, k, end_text, flag) for g in ggufs]
    peers = []
    for lr in runners:
        precision = gguf_precision(lr.gguf)
        peers.append(Peer("llama.cpp", "plain", precision, lambda i, lr=lr: lr.plain(templated[i])))
        peers.append(Peer("llama.cpp", "lookup", precision, lambda i, lr=lr: lr.lookup(templated[i])))
    theirs = [runners[0].tokenize(t) for t in templated]
    tokenization = {"identical": theirs == prompt_ids, "ours": [len(i) for i in prompt_ids],
                    "llama_cpp": [len(i) for i in theirs]}
    if theirs != prompt_ids:
        print(f"WARNING: llama.cpp tokenizes the prompts differently ({tokenization['llama_cpp']} tokens vs ours "
              f"{tokenization['ours']})", flush=True)
    return peers, info, tokenization


def ours_peers(engines: list[tuple[str, Path]], prompt_ids: list[list[int]], max_new_tokens: int, end_id: int,
               k: int, n: int) -> list[Peer]:
    """Our plain and V2 rows for every engine: one runner per engine (KV block reuse off,
    so every call prefills afresh), warmed up untimed on a short prompt."""
    from promptlookup.drafting.base import DraftConfig
    from promptlookup.engine.load import load_runner

    pool = DraftConfig(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
    peers = []
    for label, engine_dir in engines:
        runner = load_runner(engine_dir, kv_cache_enable_block_reuse=False, device="cpu")
        for draft in (None, pool):  # first-call allocations and thread pools
            ours_measure(runner, prompt_ids[0][:64], 8, end_id, draft)
        peers.append(Peer("ours", "plain", label,
                          lambda i, r=runner: ours_measure(r, prompt_ids[i], max_new_tokens, end_id, None)))
        peers.append(Peer("ours", f"V2 [{k},{n}]", label,
                          lambda i, r=runner: ours_measure(r, prompt_ids[i], max_new_tokens, end_id, pool)))
    return peers


def run_rounds(peers: list[Peer], prompt_ids: list[list[int]], rounds: int, decode: Callable[[list[int]], str]) -> None:
    """Every prompt through every peer, ``rounds`` times (peer order reversed in odd rounds)."""
    for r in range(rounds):
        order = peers if r % 2 == 0 else peers[::-1]
        for i, ids in enumerate(prompt_ids):
            line = []
            for peer in order:
                m = peer.run(i)
                if m.ids is not None:
                    m.text = decode(m.ids)
                peer.measurements.setdefault(i, []).append(m)
                line.append(f"{peer.name} {m.decode_tokens / max(m.decode_s, 1e-9):.1f}")
            print(f"round {r} prompt {i} ({len(ids)} tokens), decode tok/s: " + ", ".join(line), flush=True)


def compare(peers: list[Peer], rounds: int) -> list[dict[str, Any]]:
    """The table's rows: medians, ratios to llama.cpp plain (the given GGUF, and F32), and
    identity with the same tool's plain run at the same precision and with our first
    engine's plain run (ours: token ids; llama.cpp: text over the common length)."""
    summaries = {p.name: summarize(p, rounds) for p in peers}
    base = next((summaries[p.name]["decode_tok_s"] for p in peers if (p.tool, p.mode) == ("llama.cpp", "plain")), None)
    base_f32 = summaries.get("llama.cpp plain F32", {}).get("decode_tok_s")
    reference = next(p for p in peers if (p.tool, p.mode) == ("ours", "plain"))
    rows = []
    for peer in peers:
        own = next(p for p in peers if (p.tool, p.mode, p.precision) == (peer.tool, "plain", peer.precision))
        same_as_plain, same_as_ref = [], []
        for i in sorted(peer.measurements):
            for m, mo, mr in zip(peer.measurements[i], own.measurements[i], reference.measurements[i]):
                if peer.tool == "ours":
                    same_as_plain.append(m.ids == mo.ids)
                    common = min(len(m.ids), len(mr.ids))
                    same_as_ref.append(m.ids[:common] == mr.ids[:common])
                else:
                    same_as_plain.append(agree_over_common_length(m.text, mo.text))
                    same_as_ref.append(agree_over_common_length(m.text, mr.text))
        s = summaries[peer.name]
        speed = s["decode_tok_s"]
        rows.append({
            "tool": peer.tool, "mode": peer.mode, "precision": peer.precision, **s,
            "ratio_to_llamacpp_plain": speed / base if speed and base else None,
            "ratio_to_llamacpp_plain_f32": speed / base_f32 if speed and base_f32 else None,
            "identical_to_own_plain": f"{sum(same_as_plain)}/{len(same_as_plain)}",
            "all_identical_to_own_plain": all(same_as_plain),
            "agrees_with_ours_plain": f"{sum(same_as_ref)}/{len(same_as_ref)}",
            "ours_plain_reference": reference.precision,
            "generated_tokens": [[m.generated_tokens for m in peer.measurements[i]] for i in sorted(peer.measurements)],
            "runs": {str(i): [asdict(m) for m in ms] for i, ms in peer.measurements.items()},
        })
    return rows


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or a dash as wide."""
    width = int(re.match(r"\d*", spec).group() or 0)
    return format(value, spec) if value is not None else "-".rjust(width)


def print_table(rows: list[dict[str, Any]]) -> None:
    base = next((f"vs plain {r['precision']}" for r in rows if (r["tool"], r["mode"]) == ("llama.cpp", "plain")),
                "vs llama.cpp plain")
    ref = next((f"= ours {r['precision']}" for r in rows if (r["tool"], r["mode"]) == ("ours", "plain")), "= ours")
    print(f"\n{'tool':10} {'mode':12} {'precision':9} {'decode tok/s':>12} {base:>14} {'vs plain F32':>12} "
          f"{'prefill s':>9} {'= own plain':>11} {ref:>11}")
    for row in rows:
        print(f"{row['tool']:10} {row['mode']:12} {row['precision']:9} {fmt(row['decode_tok_s'], '12.1f')} "
              f"{fmt(row['ratio_to_llamacpp_plain'], '14.2f')} {fmt(row['ratio_to_llamacpp_plain_f32'], '12.2f')} "
              f"{fmt(row['prefill_s'], '9.2f')} {row['identical_to_own_plain']:>11} "
              f"{row['agrees_with_ours_plain']:>11}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("num_prompts", "max_new_tokens", "num_threads", "rounds", "build_jobs"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    k, n = parse_lookup_config(args.prompt_lookup_config)
    engines = parse_engines(args.engine_dir, args.engines)

    from promptlookup.threads import configure_threads

    configure_threads(args.num_threads)
    import torch

    from promptlookup.fsutil import atomic_write_json
    from promptlookup.runtime import load_tokenizer

    header = cpu_header(args.num_threads)
    header["omp_wait_policy"] = {"ours": os.environ.get("OMP_WAIT_POLICY"),
                                   "llama.cpp": users_environment().get("OMP_WAIT_POLICY")}
    if (header["omp_wait_policy"]["llama.cpp"] or "").strip().upper() == "ACTIVE" and not args.no_llamacpp:
        print("note: llama.cpp inherits OMP_WAIT_POLICY=ACTIVE from this environment; with as many threads as "
              "cores it then decodes about 3x slower (25-27 against 72-75 tok/s measured on 2 cores): unset it "
              "for llama.cpp's own speed")
    tok = load_tokenizer(engines[0][1])
    end_id, end_text = tok.eos_token_id, tok.eos_token or ""
    templated, prompt_ids = prompts(tok, args.num_prompts)
    context = max(len(ids) for ids in prompt_ids) + args.max_new_tokens + k + 64

    peers, llama_info, tokenization = ([], {"used": False}, {}) if args.no_llamacpp else \
        llamacpp_peers(args, templated, prompt_ids, k, context, end_text)
    peers += ours_peers(engines, prompt_ids, args.max_new_tokens, end_id, k, n)
    run_rounds(peers, prompt_ids, args.rounds,
               lambda ids: tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))
    rows = compare(peers, args.rounds)

    print(f"\nmachine: {machine_header(header)} (every peer's); OMP_WAIT_POLICY: ours "
          f"{header['omp_wait_policy']['ours'] or 'unset'}, llama.cpp {header['omp_wait_policy']['llama.cpp'] or 'unset'}; "
          f"1-minute load at start {fmt(header['load_1min_at_start'], '.1f')}")
    used = f"{LLAMACPP_PACKAGE} {llama_info['version']} (llama.cpp {llama_info['commit']})" if llama_info["used"] \
        else "skipped"
    print(f"llama.cpp: {used}; torch {torch.__version__}; {len(prompt_ids)} code-edit prompts, greedy, "
          f"max_new_tokens={args.max_new_tokens}, [k,n]=[{k},{n}], medians of {args.rounds} round(s)")
    if tokenization:
        print(f"prompt tokens: ours {tokenization['ours']}, llama.cpp {tokenization['llama_cpp']} "
              f"({'identical ids' if tokenization['identical'] else 'DIFFERENT ids'})")
    print_table(rows)
    atomic_write_json(args.output_json, {
        "machine": header, "torch": torch.__version__, "python": platform.python_version(), "llama_cpp": llama_info,
        "tokenization": tokenization, "args": vars(args), "prompt_lookup": [k, n],
        "engines": {label: str(path) for label, path in engines}, "prompt_tokens": [len(i) for i in prompt_ids],
        "rows": rows})
    print(f"wrote {args.output_json}")
    mismatched = [f"{r['mode']} {r['precision']}" for r in rows
                  if r["tool"] == "ours" and not r["all_identical_to_own_plain"]]
    if mismatched:
        print(f"MISMATCH: our {', '.join(mismatched)} output differs from our plain decoding", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    from promptlookup.errors import run_cli

    run_cli(main)
