"""Compile work done once, at engine build: PyTorch's portable compile caches kept in the engine.

``build.sh --torch_compile inductor`` loads the new engine on ``--device`` with
``compile_mode="inductor"`` (exactly as ``run.py`` loads it), compiles every padded step
bucket the engine's limits can need (:func:`warm_all`: the compiled forward's warm-up, or on
a GPU the CUDA graphs' warm-up, which captures the compiled step), and stores what
``torch.compiler.save_cache_artifacts()`` (PyTorch's "Mega-Cache") returns. A later
``load_runner(..., compile_mode="inductor")`` hands those bytes to
``torch.compiler.load_cache_artifacts`` before anything is compiled, which writes them into
the process's local inductor caches (``TORCHINDUCTOR_CACHE_DIR``), then warms every bucket
up at once; each warm-up is then a cache hit instead of a compile.

What is stored, under ``compiled/`` in the engine directory:

- ``inductor-<device type>.bin``: the Mega-Cache bytes (inductor's FX-graph cache entries,
  i.e. the generated kernel source and its Python wrapper, one per bucket, and
  AOTAutograd's entries), in PyTorch's own serialization, written to a temporary file and
  renamed. Portable: another machine of the same kind rebuilds the kernels from it.
- ``inductor-<device type>-kernels/``: the build's own inductor cache folder, the compiled
  kernels included (shared objects on the CPU, Triton binaries on a GPU). At load its files
  are copied, where missing, into the process's inductor cache; where the machine matches
  the build's (the cache keys include the CPU's instruction set and the compiler), a
  warm-up then loads the kernels instead of compiling them.

``config.json`` records both under ``"compiled"``::

    "compiled": {"<device type>": {"backend": "inductor", "torch": "2.13.0+cpu",
                                   "transformers": "...", "file": "compiled/inductor-cpu.bin",
                                   "sha256": "...", "bytes": 123456,
                                   "kernels": "compiled/inductor-cpu-kernels", "kernel_bytes": 4200000,
                                   "buckets": [[B, Q, K], ...],
                                   "compile_s": 61.2, "dtype": "float32", "threads": 1,
                                   "kv_blocks": 17, "source": "<sha256 of the step's code>",
                                   "device_name": "<GPU name, CUDA only>"}}

What invalidates it (the entry is then "stale": one note on stderr, and steps compile
lazily as without it): another torch or transformers version, another device type (each
type has its own entry; on a GPU, another GPU model), another dtype, another thread count
on the CPU (inductor's C++ kernels are specialised on it and its cache keys include it), another KV
pool size (``--max_tokens_in_paged_kv_cache``: the pool is a static-shape input of every
graph), another bucket set (the engine's limits, or a runtime that buckets differently),
and any change to the source of the modules that define the compiled step
(:data:`GRAPH_MODULES`). The checks are deliberately conservative: a false "stale" costs
lazy compiles (today's behaviour), a false "loaded" would compile every bucket up front.

Cost. At build: one compile per bucket (of one decoder layer, reused by every layer:
:mod:`promptlookup.runtime.compiled`), plus one more load of the weights. On disk: a few
MB a bucket. At load: reading and hashing the file, copying the kernel folder into the
local cache (once per machine), then per bucket a dynamo trace of one layer and a cache
lookup that loads the compiled kernels; where they do not fit the machine, the C++
compiler (or Triton) runs on the cached source instead. Measured in docs/benchmarks.md,
"Compiling at build".
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import UserError
from ..fsutil import atomic_write_bytes
from ..runtime import compiled as compiled_module
from ..runtime import batch_layout, cuda_graphs, kv_cache, paged_attention, paged_llama
from ..runtime.compiled import CompiledForward, inductor_unavailable_reason
from ..runtime.device import resolve_device
from ..runtime.torch_runner import TorchRunner
from .config import EngineConfig

BACKEND = "inductor"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
GRAPH_MODULES = (compiled_module, cuda_graphs, paged_attention, paged_llama, batch_layout, kv_cache)  # their source defines the compiled step
REBUILD = "rebuild the engine with build.sh --torch_compile inductor to compile ahead of time"


@dataclass(frozen=True)
class CompileSetup:
    """What ``load_runner(..., compile_mode="inductor")`` did before the first step.

    ``artifacts``: ``"loaded"`` (the engine's caches were loaded and every bucket warmed),
    ``"absent"`` (none for this device type) or ``"stale"`` (see the module docstring); in
    the last two cases nothing was warmed and steps compile lazily. ``cache_hits`` and
    ``cache_misses`` count inductor FX-graph cache lookups during the warm-up: with loaded
    artifacts every bucket should hit."""

    artifacts: str
    buckets_warmed: int = 0
    warmup_s: float = 0.0
    cache_hits: int = 0
    cache_misses: int = 0
    kernel_files_installed: int = 0  # compiled-kernel files copied from the engine into inductor's cache

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def artifact_file(device_type: str) -> str:
    """The artifacts' path relative to the engine directory."""
    return f"compiled/{BACKEND}-{device_type}.bin"


def kernel_dir(device_type: str) -> str:
    """The build's own inductor cache (compiled kernels included), relative to the engine directory."""
    return f"compiled/{BACKEND}-{device_type}-kernels"


@contextlib.contextmanager
def _inductor_cache_in(directory: Path) -> Iterator[None]:
    """Point inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) at ``directory`` for the
    block; inductor reads the variable whenever it touches its cache."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(directory)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def _install_kernels(source: Path) -> int:
    """Copy the engine's compiled kernels into this process's inductor cache, skipping files
    already there (the cache is keyed by content hashes, so a present file is the same file);
    each copy lands under a temporary name and is renamed. Returns the files copied. Cost:
    one read and write of the kernel folder (a few MB a bucket) the first time, then a walk."""
    if not source.is_dir():
        return 0
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    target = Path(cache_dir())
    copied = 0
    for path in source.rglob("*"):
        dest = target / path.relative_to(source)
        if path.is_dir() or dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        shutil.copy2(path, tmp)
        os.replace(tmp, dest)
        copied += 1
    return copied


def check_can_compile(device: str) -> str:
    """The resolved build device; a one-line :class:`UserError` when inductor cannot compile
    there (no C++ compiler, no Triton). Cheap: nothing is compiled."""
    target = resolve_device(device)
    reason = inductor_unavailable_reason(torch.device(target))
    if reason is not None:
        raise UserError(f"--torch_compile inductor: {reason}; build with --torch_compile off")
    return target


def warm_all(runner: TorchRunner) -> int:
    """Compile (or capture, under CUDA graphs) every bucket the runner's limits can need;
    returns how many were new. Cost: one compile, or cache hit, per bucket."""
    compiled, limits = _compiled(runner), runner.limits
    target = runner.graphs if runner.graphs is not None else compiled
    return target.warmup(limits.max_batch_size, limits.max_seq_len)


def _compiled(runner: TorchRunner) -> CompiledForward:
    if runner.compiled is None:
        raise ValueError("the runner was not loaded with compile_mode='inductor'")
    return runner.compiled


def _source_digest() -> str:
    """sha256 over the source files of :data:`GRAPH_MODULES` (a few files read)."""
    digest = hashlib.sha256()
    for module in GRAPH_MODULES:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _fingerprint(runner: TorchRunner) -> dict[str, Any]:
    """The values that must match between build and load for the caches to be used."""
    import transformers

    limits, device = runner.limits, runner.model.device
    buckets = _compiled(runner).buckets.all_up_to(limits.max_batch_size, limits.max_seq_len)
    found: dict[str, Any] = {
        "backend": BACKEND,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(runner.model.dtype).removeprefix("torch."),
        "kv_blocks": runner.pool.num_blocks,
        "buckets": [list(shape) for shape in buckets],
        "source": _source_digest(),
    }
    if device.type == "cpu":
        found["threads"] = torch.get_num_threads()
    else:
        found["device_name"] = torch.cuda.get_device_name(device)
    return found


def _fxgraph_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def compile_ahead(runner: TorchRunner, engine_dir: Path) -> dict[str, Any]:
    """Build side: warm every bucket up, save the compile caches under ``engine_dir`` and
    return the ``config.json`` entry ``{device type: {...}}`` (module docstring).

    ``runner`` must be loaded from ``engine_dir`` with ``compile_mode="inductor"`` and the
    defaults ``run.py`` uses (KV pool size, thread count), which the entry records.
    Cost: one compile per bucket, then one serialisation of the caches."""
    device_type = runner.model.device.type
    kernels = engine_dir / kernel_dir(device_type)
    with _inductor_cache_in(kernels):  # the compiled kernels themselves, kept with the engine
        start = time.perf_counter()
        warm_all(runner)
        compile_s = time.perf_counter() - start
        saved = torch.compiler.save_cache_artifacts()
    shutil.rmtree(kernels / "locks", ignore_errors=True)  # inductor's lock files, made just now
    if saved is None:
        raise UserError("--torch_compile inductor: torch.compile recorded no cache artifacts (is inductor's FX graph "
                        "cache off, TORCHINDUCTOR_FX_GRAPH_CACHE=0?); build with --torch_compile off or enable it")
    data = saved[0]
    relative = artifact_file(device_type)
    atomic_write_bytes(engine_dir / relative, data)
    entry = {**_fingerprint(runner), "file": relative, "sha256": hashlib.sha256(data).hexdigest(),
             "bytes": len(data), "kernels": kernel_dir(device_type),
             "kernel_bytes": sum(f.stat().st_size for f in kernels.rglob("*") if f.is_file()),
             "compile_s": round(compile_s, 3)}
    return {device_type: entry}


def _mismatch(stored: dict[str, Any], found: dict[str, Any]) -> tuple[str, str] | None:
    """``(why, fix)`` when ``stored`` (the config entry) does not fit this process (``found``)."""
    if "threads" in found and stored.get("threads") != found["threads"]:
        return (f"built with {stored.get('threads')} CPU thread(s), this run uses {found['threads']}",
                f"pass --num_threads {stored.get('threads')}, or rebuild the engine with build.sh --torch_compile "
                f"inductor --num_threads {found['threads']}")
    if stored.get("kv_blocks") != found["kv_blocks"]:
        return (f"built for the default KV cache of {stored.get('kv_blocks')} blocks, this run has {found['kv_blocks']}",
                "leave out --max_tokens_in_paged_kv_cache to use them")
    for key, name in (("backend", "backend"), ("torch", "torch"), ("transformers", "transformers"),
                      ("dtype", "dtype"), ("device_name", "GPU")):
        if key in found and stored.get(key) != found[key]:
            return f"built with {name} {stored.get(key)}, this run has {found[key]}", REBUILD
    if stored.get("buckets") != found["buckets"]:
        return "built for other step buckets than this runtime uses", REBUILD
    if stored.get("source") != found["source"]:
        return "the compiled step's code changed since the build", REBUILD
    return None


def _read_artifacts(cfg: EngineConfig, device_type: str, runner: TorchRunner) -> tuple[str, bytes | None, str]:
    """``("loaded", bytes, "")``, or ``("absent" | "stale", None, note)`` with the one-line note."""
    stored = (cfg.compiled or {}).get(device_type)
    if not isinstance(stored, dict):
        return "absent", None, f"no compiled artifacts for {device_type}; steps will compile lazily ({REBUILD})"
    mismatch = _mismatch(stored, _fingerprint(runner))
    if mismatch is not None:
        why, fix = mismatch
        return "stale", None, f"its compiled artifacts for {device_type} are stale ({why}); steps will compile lazily ({fix})"
    path = cfg.directory / str(stored.get("file", artifact_file(device_type)))
    try:
        data = path.read_bytes()
    except OSError:
        return "absent", None, f"its compiled artifacts {path.name} are missing; steps will compile lazily ({REBUILD})"
    if hashlib.sha256(data).hexdigest() != stored.get("sha256"):
        return ("stale", None,
                f"its compiled artifacts {path.name} do not match config.json; steps will compile lazily ({REBUILD})")
    return "loaded", data, ""


def prepare_compiled(runner: TorchRunner, cfg: EngineConfig) -> CompileSetup:
    """Load side (``load_runner(..., compile_mode="inductor")``): load the engine's caches and
    warm every bucket up before the first step; without usable caches, print one note on
    stderr and leave the buckets to compile lazily. Never fails for want of artifacts.
    Cost: see the module docstring."""
    device_type = runner.model.device.type
    status, data, note = _read_artifacts(cfg, device_type, runner)
    installed = 0
    if data is not None:  # the compiled kernels first: then a warm-up compiles nothing at all
        kernels = cfg.compiled[device_type].get("kernels")
        installed = _install_kernels(cfg.directory / str(kernels)) if kernels else 0
        if torch.compiler.load_cache_artifacts(data) is None:
            status, note = "stale", f"PyTorch could not read its compiled artifacts; steps will compile lazily ({REBUILD})"
    if status != "loaded":
        print(f"note: {cfg.directory}: {note}", file=sys.stderr)
        return CompileSetup(status)
    hits, misses = _fxgraph_counts()
    start = time.perf_counter()
    warmed = warm_all(runner)
    warmup_s = time.perf_counter() - start
    hits_after, misses_after = _fxgraph_counts()
    setup = CompileSetup("loaded", warmed, warmup_s, hits_after - hits, misses_after - misses, installed)
    if setup.cache_misses:
        print(f"note: {cfg.directory}: {setup.cache_misses} of {warmed} step buckets missed its compiled artifacts "
              f"and were compiled now ({REBUILD})", file=sys.stderr)
    return setup
