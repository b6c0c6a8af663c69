"""What every bench header states about the CPU: its model name and which of the vector
flags a bench cares about it has (``/proc/cpuinfo`` on Linux; elsewhere the platform's
name and no flags). Read once per call; cost: one small file read."""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Sequence


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
