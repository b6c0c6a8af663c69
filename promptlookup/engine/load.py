"""Load a built engine directory into the runner of the backend it was built for."""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Sequence

from ..checkpoint.config import quant_spec_of
from ..defaults import BACKENDS, DEFAULT_BACKEND, DEFAULT_COMPILE_MODE, DEFAULT_CPU_WEIGHT_COPIES
from ..errors import UserError
from ..runtime.base import Runner
from ..runtime.device import resolve_device
from ..runtime.options import KvCacheConfig, RuntimeConfig, require_fraction, with_options
from .config import EngineConfig, read_engine_config

if TYPE_CHECKING:
    from ..runtime.torch_runner import TorchRunner

__all__ = ["load_runner", "torch_runner_for", "check_backend", "check_trtllm_only_flags", "BACKENDS", "KvCacheConfig",
           "RuntimeConfig", "with_options"]


def load_runner(
    engine_dir: str | os.PathLike[str],
    runtime: RuntimeConfig | None = None,
    kv_cache: KvCacheConfig | None = None,
    *,
    device_ids: Sequence[int] | None = None,
    backend: str = DEFAULT_BACKEND,
    enable_chunked_context: bool = False,
    hf_model_dir: str | os.PathLike[str] | None = None,
    **options: object,
) -> Runner:
    """Load the engine in ``engine_dir`` on the backend it was built for.

    ``runtime`` (:class:`~promptlookup.runtime.options.RuntimeConfig`) and ``kv_cache``
    (:class:`~promptlookup.runtime.options.KvCacheConfig`) come whole from the CLI and the
    LLM API; ``options`` may set single fields of them by ``run.py``'s names
    (:func:`with_options`: ``device``, ``cuda_graph_mode``, ``cpu_weight_copies``,
    ``compile_mode``, ``kv_cache_enable_block_reuse``, ``max_tokens_in_paged_kv_cache``,
    ``kv_cache_free_gpu_memory_fraction``).

    ``runtime.device`` places a PyTorch engine (``None``/``"auto"``: the GPU when one is
    visible, else the CPU; or ``cpu``, ``cuda``, ``cuda:N``). It computes in the
    checkpoint's dtype (float32, float16 or bfloat16); a dtype this PyTorch cannot run on
    the device is a one-line :class:`UserError` naming the fix. TensorRT-LLM engines run on
    the GPUs of ``device_ids`` and refuse any other device. ``runtime.cuda_graph_mode``
    (PyTorch engines on a GPU; ``None``: on there) replays captured CUDA graphs for decoding
    steps.

    ``kv_cache.max_tokens`` and ``kv_cache.free_gpu_memory_fraction`` size the KV cache of
    either backend (a PyTorch engine: :func:`~promptlookup.runtime.kv_cache.pool_blocks`,
    on the memory free once its weights are loaded); ``enable_chunked_context`` exists on
    TensorRT-LLM only (both of its paths get it) and is refused for a PyTorch engine.

    ``hf_model_dir`` is used by the TensorRT-LLM backend's single-call (v2) workflow only,
    whose LLM API loads a Hugging Face checkpoint.

    ``runtime.num_threads`` (``--num_threads``; ``None``: PyTorch's count as it is) is
    applied first, for either backend.

    ``runtime.cpu_weight_copies`` (``--cpu_weight_copies``, PyTorch engines on a CPU): 1
    holds the weights once; 2 also keeps row-major copies for faster plain decoding steps.

    ``runtime.compile_mode`` (``--torch_compile``, PyTorch engines): ``inductor`` runs
    decoding steps through ``torch.compile`` (:mod:`promptlookup.runtime.compiled`; the
    projections are then held row-major, once, for ``F.linear``); ``off`` runs them eagerly
    and ignores any compiled artifacts. With ``inductor``, artifacts the engine holds for
    this device type and this torch (``build.sh --torch_compile inductor``,
    :mod:`.compile_cache`) are loaded and every step bucket is warmed up before this
    returns; without usable ones, one note goes to stderr and steps compile lazily. What
    was done: ``runner.describe()["compile"]``.

    ``backend`` (``--backend``): ``auto`` runs the engine on the backend it was built
    for; ``torch`` or ``trtllm`` insist on that backend and refuse an engine built for
    the other one (an engine is built for one backend and cannot switch).
    """
    runtime, kv_cache = with_options(runtime, kv_cache, **options)  # type: ignore[arg-type]
    runtime.apply_threads()  # before anything runs (compiled artifacts are specialised on it)
    cfg = read_engine_config(engine_dir)
    check_backend(backend, cfg.backend, engine_dir)
    if cfg.backend == "trtllm":
        if runtime.device not in (None, "auto"):
            raise UserError(f"--device {runtime.device} applies to PyTorch engines; a TensorRT-LLM engine runs on the "
                            f"GPUs of --prompt_lookup_config's device list (or all ranks); drop --device")
        if runtime.cpu_weight_copies != DEFAULT_CPU_WEIGHT_COPIES:
            raise UserError("--cpu_weight_copies applies to PyTorch engines on a CPU; drop it for a TensorRT-LLM engine")
        if runtime.compile_mode != DEFAULT_COMPILE_MODE:
            raise UserError("--torch_compile applies to PyTorch engines; drop it for a TensorRT-LLM engine")
        if runtime.cuda_graph_mode is not None:
            raise UserError("--cuda_graph_mode/--no-cuda_graph_mode apply to PyTorch engines here; "
                            "drop the flag for a TensorRT-LLM engine")
        if kv_cache.dtype != "auto":
            raise UserError(f"--kv_cache_dtype {kv_cache.dtype} applies to PyTorch engines; a TensorRT-LLM engine's KV "
                            "cache type is fixed when it is built; drop it")
        from ..runtime.trtllm import TrtllmRunner, trtllm_unavailable_reason
        from .trtllm_config import read_trtllm_engine_config

        reason = trtllm_unavailable_reason()
        if reason is not None:
            raise UserError(f"{engine_dir} is a TensorRT-LLM engine, but {reason}")
        return TrtllmRunner(
            read_trtllm_engine_config(engine_dir),
            device_ids=list(device_ids) if device_ids is not None else list(range(cfg.world_size)),
            kv_cache_enable_block_reuse=kv_cache.enable_block_reuse,
            max_tokens_in_paged_kv_cache=kv_cache.max_tokens,
            kv_cache_free_gpu_memory_fraction=kv_cache.free_gpu_memory_fraction,
            enable_chunked_context=enable_chunked_context,
            hf_model_dir=hf_model_dir,
        )
    check_trtllm_only_flags(cfg.backend, kv_cache.free_gpu_memory_fraction, enable_chunked_context)
    if hf_model_dir is not None:
        raise UserError("--hf_model_dir applies to TensorRT-LLM engines (the v2 workflow's LLM API loads that model); "
                        "a PyTorch engine holds its own weights: drop it")
    quant = quant_spec_of(cfg.pretrained)
    if runtime.cpu_weight_copies != DEFAULT_CPU_WEIGHT_COPIES:  # a second copy only the CPU's float projections keep
        unread = ("it runs on a GPU" if resolve_device(runtime.device).startswith("cuda") else
                  "--torch_compile inductor holds each projection once, row-major" if runtime.compile_mode == "inductor"
                  else f"this {quant.quant_algo} engine's int8/int4 projections are held once (their kernels read the "
                  "codes)" if quant is not None else None)
        if unread:
            raise UserError(f"--cpu_weight_copies {runtime.cpu_weight_copies} keeps a second copy of a CPU engine's "
                            f"float projections, but {unread}: drop it")
    if quant is not None and runtime.compile_mode == "inductor":
        raise UserError(f"--torch_compile inductor cannot trace the int8/int4 products of this {quant.quant_algo} "
                        f"engine; drop --torch_compile (quantized engines run eagerly)")
    if quant is not None and resolve_device(runtime.device).startswith("cuda"):
        from ..runtime import gpu_quant

        if not gpu_quant.available():
            raise UserError(f"this {quant.quant_algo} engine's int8/int4 products on a GPU need Triton, which is not "
                            f"installed: pip install triton (or run on the CPU with --device cpu)")
    if device_ids is not None and list(device_ids) not in ([], [0]):
        raise UserError(
            f"device list {list(device_ids)} needs the TensorRT-LLM backend; the PyTorch engine runs on one device, use [0]"
        )
    if kv_cache.enable_block_reuse and (cfg.build.get("plugin_config") or {}).get("use_paged_context_fmha") is False:
        print(f"note: {cfg.directory} was built with --use_paged_context_fmha disable, which KV block reuse needs: "
              "it runs without block reuse (rebuild with enable to reuse cached prefixes)", file=sys.stderr)
        kv_cache = dataclasses.replace(kv_cache, enable_block_reuse=False)
    runner = torch_runner_for(cfg, runtime, kv_cache)
    if runtime.compile_mode == "inductor":
        from .compile_cache import prepare_compiled

        runner.compile_setup = prepare_compiled(runner, cfg)
    return runner


def torch_runner_for(
    cfg: EngineConfig,
    runtime: RuntimeConfig | None = None,
    kv_cache: KvCacheConfig | None = None,
    **options: object,
) -> "TorchRunner":
    """The PyTorch engine ``cfg`` as a runner (the arguments as :func:`load_runner` takes them),
    without the compile caches' set-up: the build uses it to compile ahead of time. Nothing
    is compiled here. Cost: loading the weights onto the device."""
    from ..checkpoint.load import load_checkpoint_state
    from ..runtime.device import resolve_device
    from ..runtime.paged_llama import PagedLlama
    from ..runtime.torch_runner import TorchRunner

    from .step_costs import batch_costs_for, costs_for, route_note

    runtime, kv_cache = with_options(runtime, kv_cache, **options)  # type: ignore[arg-type]
    target = resolve_device(runtime.device)
    note = route_note(cfg.step_costs, target.split(":")[0])
    if note:
        print(f"note: {cfg.directory}: {note}", file=sys.stderr)
    # The engine computes in its checkpoint's dtype (as trtllm-build's engines do).
    config, state = load_checkpoint_state(cfg.directory, dtype="auto", device=target)  # owned by us alone
    return TorchRunner(
        # consumes the state dict
        PagedLlama(config, state, cpu_weight_copies=runtime.cpu_weight_copies,
                   dense_projections=runtime.compile_mode == "inductor"),
        cfg.limits,
        runtime,
        kv_cache,
        tokens_per_block=cfg.tokens_per_block,
        step_cost_table=costs_for(cfg.step_costs, target.split(":")[0]),
        batch_step_costs=batch_costs_for(cfg.step_costs, target.split(":")[0]),
    )



def check_trtllm_only_flags(built_for: str, kv_cache_free_gpu_memory_fraction: float | None,
                            enable_chunked_context: bool) -> None:
    """Refuse (one line) a fraction outside (0, 1], and ``--enable_chunked_context`` for an
    engine of another backend than TensorRT-LLM (the PyTorch engine runs whole prompts).
    Both backends honour the fraction."""
    if kv_cache_free_gpu_memory_fraction is not None:
        require_fraction("--kv_cache_free_gpu_memory_fraction", kv_cache_free_gpu_memory_fraction)
    if built_for != "trtllm" and enable_chunked_context:
        raise UserError("--enable_chunked_context applies to TensorRT-LLM engines; the PyTorch engine runs whole "
                        "prompts: drop it")


def check_backend(requested: str, built_for: str, engine_dir: str | os.PathLike[str]) -> None:
    """Refuse (one line) a ``--backend`` that the engine was not built for, or TensorRT-LLM
    where it is not installed."""
    if requested not in BACKENDS:
        raise UserError(f"--backend {requested!r} is not a backend; choose auto, torch or trtllm")
    if requested == "trtllm":  # the TensorRT-LLM engine itself is checked again when loaded
        from ..runtime.trtllm import trtllm_unavailable_reason

        reason = trtllm_unavailable_reason()
        if reason is not None:
            raise UserError(f"--backend trtllm: {reason}")
    if requested != "auto" and requested != built_for:
        names = {"torch": "a PyTorch", "trtllm": "a TensorRT-LLM"}
        raise UserError(f"--backend {requested}: {engine_dir} is {names.get(built_for, built_for)} engine; "
                        f"rebuild it with build.sh --backend {requested}, or pass --backend auto")


