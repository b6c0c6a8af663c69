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
