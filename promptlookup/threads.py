"""CPU threads for PyTorch (``--num_threads``) and OpenMP's wait policy.

Why a default other than PyTorch's: PyTorch runs each operator on all physical cores
(fork-join). Decoding one token of a small model is hundreds of short parallel regions;
when any of the threads is descheduled because other processes want the CPU, every
region waits a scheduler time slice for it. On a shared machine this turned 12-14 tok/s
(one thread) into 0.6-1.3 tok/s (the default), back to back.

:func:`default_num_threads`: ``OMP_NUM_THREADS`` when the user set it; otherwise half the
CPUs this process may run on (``os.sched_getaffinity``, which honours ``taskset`` and
container CPU sets), but two where there are two or three, and at most
:data:`MAX_DEFAULT_THREADS`. Half leaves room for other load; beyond a few threads, models
of this size gain little per token. Two on a 2-core machine: there a decoding step is bound
by memory reads, and two threads read twice what one does (docs/benchmarks.md, "One thread
or two"): 1.91x the plain and 1.85x the V2 speed on a quiet machine, 0.91-0.93x with
another process keeping one core busy (the step's layers are one parallel region whose
barrier stops spinning where other processes hold the cores: ``kernels/step_ops.c``). The
choice depends only on the machine, never on its momentary load, so two runs on one
machine use the same count (CPU results can depend on the thread count).

:func:`prefer_passive_wait`: OpenMP threads that finish early spin ("active" waiting) by
default, burning CPU that other threads and processes need; ``OMP_WAIT_POLICY=PASSIVE``
makes them sleep. It only takes effect if set before the OpenMP runtime loads (before
``import torch``); the entry points call it first. A value the user set is kept.
"""
from __future__ import annotations

import os

from .errors import UserError

MAX_DEFAULT_THREADS = 4


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _env_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def default_num_threads() -> int:
    """The thread count used when ``--num_threads`` is not given (see the module docstring)."""
    env = _env_threads()
    if env is not None:
        return env
    cpus = available_cpus()
    return max(1, min(MAX_DEFAULT_THREADS, max(min(cpus, 2), cpus // 2)))


_POLICY_SET_HERE = False  # prefer_passive_wait() added OMP_WAIT_POLICY (the user had none)


def prefer_passive_wait() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy (call before importing torch)."""
    global _POLICY_SET_HERE
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        _POLICY_SET_HERE = True


def users_environment() -> dict[str, str]:
    """``os.environ`` without the ``OMP_WAIT_POLICY`` :func:`prefer_passive_wait` added: the
    environment for another tool run as a subprocess (a benchmark's peer), which must run with
    its own defaults (llama.cpp's OpenMP threads, made to sleep between its many parallel
    regions, decode at half their speed)."""
    env = dict(os.environ)
    if _POLICY_SET_HERE:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def resolve_num_threads(num_threads: int | None, flag: str = "--num_threads") -> int:
    """``num_threads``, or :func:`default_num_threads` for None; anything but a positive
    integer is a one-line :class:`UserError` naming ``flag``."""
    n = default_num_threads() if num_threads is None else num_threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"{flag} must be a positive integer, got {num_threads!r}")
    return n


def configure_threads(num_threads: int | None, flag: str = "--num_threads") -> int:
    """Make PyTorch use ``num_threads`` intra-op threads (None: the default); return the count.

    Call it early, before the first tensor operation. Cost: one ``torch.set_num_threads``.
    """
    n = resolve_num_threads(num_threads, flag)
    import torch

    torch.set_num_threads(n)
    return n
