"""Which torch device a model runs on: ``auto`` (a GPU when one is visible) or a named one."""
from __future__ import annotations

from ..errors import UserError


def resolve_device(device: str | None, flag: str = "--device") -> str:
    """The device to use for ``device`` (``None`` or ``"auto"``: ``cuda`` when available, else ``cpu``).

    Raises :class:`UserError` naming ``flag`` when the device is malformed, not a CPU or
    CUDA device, or not present on this machine.
    """
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"{flag} {device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if parsed.type not in ("cpu", "cuda"):
        raise UserError(f"{flag} {device!r} is not supported; use auto, cpu, cuda or cuda:N")
    if parsed.type == "cuda" and (not torch.cuda.is_available() or (parsed.index or 0) >= torch.cuda.device_count()):
        raise UserError(f"{flag} {device} is not available here; use cpu or auto")
    return device


def synchronize(device: "str | torch.device") -> None:
    """Wait for queued GPU work on ``device`` (a no-op on CPU), so wall-clock timings are real."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def to_device(host: "torch.Tensor", device: "str | torch.device") -> "torch.Tensor":
    """``host`` (a CPU tensor) on ``device`` without making the host wait for the device:
    on CUDA it is pinned and copied asynchronously (the copy is ordered on the current
    stream, before any kernel that reads it); on the CPU it is returned as is."""
    import torch

    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def slow_dtype_note(dtype: "torch.dtype", device: "str | torch.device") -> str | None:
    """A one-line note when a model in ``dtype`` will run on ``device`` without fast
    kernels, else ``None``: float16 on a CPU whose oneDNN has no float16 support (no
    AVX512-FP16 or AMX-FP16), where every projection falls back to a generic half-precision
    GEMM (SmolLM2-135M: a 33-token step takes 3.7x float32's time, docs/benchmarks.md)."""
    import torch

    if torch.device(device).type != "cpu" or dtype != torch.float16:
        return None
    try:
        fast = bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        fast = False
    if fast:
        return None
    return ("this CPU has no fast float16 kernels, so the float16 engine runs several times slower than bfloat16 "
            "or float32 would; for CPU runs convert the checkpoint with --dtype bfloat16 (or float32) and rebuild")
