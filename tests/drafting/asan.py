"""``make test-asan``: the C modules' misuse tests under AddressSanitizer and UBSan.

Builds instrumented copies of the C modules into a temporary folder (``python -m
promptlookup.drafting.native.build --sanitize DIR``) and runs
``tests/drafting/test_native_misuse.py`` against them, with the compiler's ``libasan``
preloaded (an instrumented extension loaded by an uninstrumented Python needs that) and
``PYTHONMALLOC=malloc`` so that ASan sees Python's own allocations too. Leak detection is
off: the interpreter keeps memory alive until exit by design.

Prints one line and exits 0 when the sanitizers are unavailable here (no compiler, no
``libasan``, or an instrumented build that does not load). Run on demand, not by ``make
test``: the instrumented run is several times slower.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from promptlookup.drafting.native import build

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/drafting/test_native_misuse.py"]


def libasan(cc: list[str]) -> str | None:
    """The compiler's shared ``libasan``, or None (``-print-file-name`` echoes unknown names)."""
    for name in ("libasan.so", "libclang_rt.asan-x86_64.so", "libclang_rt.asan_osx_dynamic.dylib"):
        proc = subprocess.run([*cc, f"-print-file-name={name}"], capture_output=True, text=True)
        path = proc.stdout.strip()
        if proc.returncode == 0 and os.path.isabs(path) and os.path.isfile(path):
            return path
    return None


def main() -> int:
    chain = build.toolchain()
    if chain is None:
        print("skipped: no C toolchain that builds extensions here")
        return 0
    lib = libasan(chain[0])
    if lib is None:
        print(f"skipped: {' '.join(chain[0])} has no shared libasan")
        return 0
    with tempfile.TemporaryDirectory(prefix="pld-asan-") as out:
        made = subprocess.run([sys.executable, "-m", "promptlookup.drafting.native.build", "--sanitize", out],
                              cwd=ROOT, capture_output=True, text=True)
        if made.returncode != 0:
            print(f"skipped: the sanitizer build failed ({build.first_line(made.stderr or made.stdout)})")
            return 0
        preload = " ".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)
        env = dict(os.environ, LD_PRELOAD=preload, PYTHONMALLOC="malloc", PLD_NATIVE_DIR=out,
                   ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
                   PYTHONPATH=str(ROOT))
        probe = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"skipped: Python does not start with {lib} preloaded ({build.first_line(probe.stderr)})")
            return 0
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", *TESTS]  # reports reach fd 2
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
