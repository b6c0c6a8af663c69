"""What every bench states about the machine it ran on: the CPU's model name, which of the
vector flags that matter here it has (``/proc/cpuinfo`` on Linux; elsewhere the platform's
name and no flags), the thread count, and on a GPU run the GPU's name.

Every bench prints :func:`machine_header` of :func:`machine_info` in its header and puts
:func:`machine_info`'s keys in its JSON. Cost: one small file read per call (and one
``torch.cuda.get_device_name`` on a GPU run)."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any, Sequence

# The flags whose presence changes which code runs or how fast: AVX2+FMA and AVX-512 F/BW/VL
# pick the C kernels' paths (runtime/kernels); AVX-512 VBMI picks the int4 kernel's decode
# (gemv.c, use_vbmi); BF16, VNNI and AMX are what oneDNN/PyTorch use for bfloat16 and int8.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_bf16", "avx512_vnni",
             "amx_tile")


def cpu_model_and_flags(wanted: Sequence[str]) -> tuple[str, list[str]]:
    """The CPU's model name, and the flags of ``wanted`` it has, in ``wanted``'s order."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return model, [f for f in wanted if f in flags]


def gpu_name(device: Any = None) -> str | None:
    """The name of the CUDA GPU ``device`` (a string or ``torch.device``) names; None for any other device."""
    if device is None or not str(device).startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(torch.device(device))


def machine_info(num_threads: Any, device: Any = None) -> dict[str, Any]:
    """``{"cpu", "cpu_flags", "cpus", "num_threads", "gpu"}`` for a bench's JSON: the CPU's model,
    which of :data:`CPU_FLAGS` it has, its logical CPUs, the thread count the bench ran with (an
    int, a list of counts, or a string where the bench does not set one, e.g. a server's default),
    and the GPU's name on a GPU run (else None). Needs no torch on a CPU run."""
    model, flags = cpu_model_and_flags(CPU_FLAGS)
    return {"cpu": model, "cpu_flags": flags, "cpus": os.cpu_count(), "num_threads": num_threads,
            "gpu": gpu_name(device)}


def machine_header(info: dict[str, Any]) -> str:
    """One line of :func:`machine_info`: ``CPU: MODEL (N logical CPUs); flags: avx2 fma (no avx512f ...);
    threads: T[; GPU: NAME]``."""
    have = list(info["cpu_flags"])
    missing = [f for f in CPU_FLAGS if f not in have]
    flags = " ".join(have) or "none"
    if missing:
        flags += f" (no {' '.join(missing)})"
    threads = info["num_threads"]
    if isinstance(threads, (list, tuple)):
        threads = ", ".join(map(str, threads))
    line = f"CPU: {info['cpu']} ({info['cpus']} logical CPUs); flags: {flags}; threads: {threads}"
    if info.get("gpu"):
        line += f"; GPU: {info['gpu']}"
    return line
