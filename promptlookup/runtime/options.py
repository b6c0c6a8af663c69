"""The runtime's options as two config objects, passed whole from the CLI and the API to
``engine.load_runner`` (instead of loose keywords threaded through every layer):

- :class:`KvCacheConfig` (TensorRT-LLM's LLM API name): prefix block reuse, the paged
  KV budget, in tokens and/or as a fraction of the memory free after the weights load, and
  the cache's element type;
- :class:`RuntimeConfig`: where and how an engine computes (device, CUDA graphs,
  compiled steps, the CPU weight layout, CPU threads).

Defaults come from :mod:`promptlookup.defaults`. Each validates its types on
construction (one-line :class:`UserError`); values that depend on the machine or the
engine (a device that is absent, inductor on a quantized engine) are checked on load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from typing import TYPE_CHECKING

from ..defaults import (COMPILE_MODES, CPU_WEIGHT_COPIES, DEFAULT_COMPILE_MODE, DEFAULT_CPU_WEIGHT_COPIES,
                        DEFAULT_KV_CACHE_DTYPE, DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE, KV_CACHE_DTYPES)
from ..errors import UserError
from ..threads import configure_threads, resolve_num_threads

if TYPE_CHECKING:
    import torch


def require_int(name: str, value: object, minimum: int) -> None:
    """A one-line :class:`UserError` unless ``value`` is an integer (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_bool(name: str, value: object) -> None:
    """A one-line :class:`UserError` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise UserError(f"{name} must be True or False, got {value!r}")


def require_fraction(name: str, value: object) -> None:
    """A one-line :class:`UserError` unless ``value`` is a finite number (not a bool) in (0, 1]."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or not 0.0 < value <= 1.0):
        raise UserError(f"{name} must be a number in (0, 1], got {value!r}")


@dataclass(frozen=True)
class KvCacheConfig:
    """The paged KV cache: prefix block reuse across requests, and its size.

    ``max_tokens``: the pool's capacity in tokens. ``free_gpu_memory_fraction``
    (TensorRT-LLM's name and meaning; PyTorch engines on a GPU or a CPU): the pool takes
    that fraction of the device memory free once the weights are loaded
    (:func:`~.kv_cache.pool_blocks`); with ``max_tokens`` too, the smaller wins. Neither:
    2 x max_batch_size x max_seq_len tokens. The default is not TensorRT-LLM's 0.9: on a
    CPU that would commit most of the machine's RAM (the server commits its pool at
    start-up), and a token budget the engine's limits fit is enough for them.

    ``dtype`` (TensorRT-LLM's field, ``--kv_cache_dtype``): ``"auto"`` (the engine's dtype),
    ``"float32"``, ``"float16"`` or ``"bfloat16"``. K and V are rounded to it as written and
    widened back to the engine's dtype as read, so a row's attention reads the same values
    whichever step (plain, draft verification, tree) wrote them: greedy speculative output
    still equals plain greedy output on the same cache. Which routes take which types is
    checked on load (:meth:`kv_dtype_for`)."""

    enable_block_reuse: bool = DEFAULT_KV_CACHE_ENABLE_BLOCK_REUSE
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = None
    dtype: str = DEFAULT_KV_CACHE_DTYPE

    def __post_init__(self) -> None:
        require_bool("enable_block_reuse", self.enable_block_reuse)
        if self.dtype not in KV_CACHE_DTYPES:
            raise UserError(f"KV cache dtype {self.dtype!r} (--kv_cache_dtype) is not one this runtime stores; choose "
                            f"{', '.join(KV_CACHE_DTYPES)}")
        if self.max_tokens is not None:
            require_int("max_tokens", self.max_tokens, 1)
        if self.free_gpu_memory_fraction is not None:
            require_fraction("free_gpu_memory_fraction", self.free_gpu_memory_fraction)

    def kv_dtype_for(self, model_dtype: torch.dtype) -> torch.dtype:
        """The pool's element type for an engine computing in ``model_dtype``."""
        import torch

        return model_dtype if self.dtype == "auto" else getattr(torch, self.dtype)


@dataclass(frozen=True)
class RuntimeConfig:
    """How a PyTorch engine runs (``run.py``'s flags of the same meaning; TensorRT-LLM
    engines refuse anything but the defaults).

    ``device``: ``None``/``"auto"`` (the GPU when one is visible, else the CPU), ``cpu``,
    ``cuda`` or ``cuda:N``. ``cuda_graph_mode``: replay captured CUDA graphs for decoding
    steps (``None``: on when the engine is on a GPU). ``compile_mode``: ``off`` or
    ``inductor`` (:mod:`.compiled`). ``cpu_weight_copies``: 1 or 2 (:mod:`.cpu_linear`).
    ``num_threads``: PyTorch's CPU threads, set by ``load_runner`` before it loads
    (``--num_threads``; :mod:`promptlookup.threads`); ``None`` leaves PyTorch's count as it
    is (``run.py`` and ``serve.py`` resolve their flag's default into it).
    """

    device: str | None = None
    cuda_graph_mode: bool | None = None
    compile_mode: str = DEFAULT_COMPILE_MODE
    cpu_weight_copies: int = DEFAULT_CPU_WEIGHT_COPIES
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.device is not None and not isinstance(self.device, str):
            raise UserError(f"device must be a string such as cpu or cuda:0, got {self.device!r}")
        if self.cuda_graph_mode is not None:
            require_bool("cuda_graph_mode", self.cuda_graph_mode)
        if self.compile_mode not in COMPILE_MODES:
            raise UserError(f"--torch_compile {self.compile_mode!r} is not a mode; choose {' or '.join(COMPILE_MODES)}")
        if self.cpu_weight_copies not in CPU_WEIGHT_COPIES:
            raise UserError(f"cpu_weight_copies must be 1 or 2, got {self.cpu_weight_copies!r}")
        if self.num_threads is not None:
            resolve_num_threads(self.num_threads)

    def apply_threads(self) -> None:
        """Set PyTorch's CPU threads to ``num_threads`` (None: nothing). Cost: one
        ``torch.set_num_threads``; call it before anything runs."""
        if self.num_threads is not None:
            configure_threads(self.num_threads)

    @staticmethod
    def resolve(runtime_config: object, device: str | None) -> "RuntimeConfig":
        """The LLM API's runtime config: ``runtime_config`` whole, or ``device`` alone as its
        shorthand; anything else, or both, is a one-line :class:`UserError`."""
        if runtime_config is None:
            return RuntimeConfig(device=device)
        if not isinstance(runtime_config, RuntimeConfig):
            raise UserError(f"runtime_config must be a RuntimeConfig, got {type(runtime_config).__name__}")
        if device is not None:
            raise UserError("give device or runtime_config (whose device field it is), not both")
        return runtime_config


def with_options(
    runtime: RuntimeConfig | None,
    kv_cache: KvCacheConfig | None,
    *,
    device: str | None = None,
    cuda_graph_mode: bool | None = None,
    cpu_weight_copies: int | None = None,
    compile_mode: str | None = None,
    kv_cache_enable_block_reuse: bool | None = None,
    max_tokens_in_paged_kv_cache: int | None = None,
    kv_cache_free_gpu_memory_fraction: float | None = None,
) -> tuple[RuntimeConfig, KvCacheConfig]:
    """The two config objects, with any single option given as a keyword (``run.py``'s flag
    names; ``None``: the object's value) folded in: the one place loose options become
    configs, for callers that set one or two of them."""
    runtime, kv_cache = runtime or RuntimeConfig(), kv_cache or KvCacheConfig()
    loose = dict(device=device, cuda_graph_mode=cuda_graph_mode, cpu_weight_copies=cpu_weight_copies,
                 compile_mode=compile_mode)
    runtime = replace(runtime, **{k: v for k, v in loose.items() if v is not None})
    kv = dict(enable_block_reuse=kv_cache_enable_block_reuse, max_tokens=max_tokens_in_paged_kv_cache,
              free_gpu_memory_fraction=kv_cache_free_gpu_memory_fraction)
    return runtime, replace(kv_cache, **{k: v for k, v in kv.items() if v is not None})
