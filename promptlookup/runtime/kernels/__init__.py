"""Products ``y = x @ W.T`` for the few rows of a decode or verification step, on weights
held in fp32 or weight-only int8/int4 (activations stay fp32).

The contract every implementation here keeps (the C kernels and the reference below):

- ``x``: float32 ``[rows, in]``, contiguous; the result: float32 ``[rows, out]``, contiguous.
- int8 (per channel): ``qweight`` int8 ``[out, in]``, ``scale`` float32 ``[out]``;
  ``W[o, i] = qweight[o, i] * scale[o]``.
- int4 (per group of ``group_size`` input columns, ``in % group_size == 0``, ``group_size``
  even): ``qweight`` uint8 ``[out, in // 2]``, column ``2j`` in the low nibble and ``2j + 1``
  in the high nibble, codes 0..15; ``scale`` and ``offset`` float32 ``[out, in // group_size]``;
  ``W[o, i] = code[o, i] * scale[o, g] + offset[o, g]`` with ``g = i // group_size``
  (TensorRT-LLM's symmetric int4 is ``offset = -8 * scale``; GGUF's Q4_1 is its ``min``).
- int8 per group (``in % group_size == 0``): ``qweight`` int8 ``[out, in]``, ``scale`` and
  ``offset`` float32 ``[out, in // group_size]``; ``W[o, i] = qweight[o, i] * scale[o, g] +
  offset[o, g]`` (GGUF's ``Q8_0``, ``Q4_0`` and ``Q4_1`` blocks are all this with groups of 32).
- **Row invariance**: each output element is bitwise the same whatever the number of rows
  in the call and the row's place among them, so a one-row decoding step and a many-row
  verification step compute the same logits for the same prefix, and greedy speculative
  output equals plain greedy output on a quantized engine.

- fp32: ``w`` float32 ``[out, in]``, row-major (:func:`linear_fp32`).

Implementations: the C kernels of ``gemv.c`` (module ``_gemv``, built by ``make native``:
see :mod:`promptlookup.drafting.native.build`) with the instruction set chosen at run time
(``avx512``: avx512f/bw/vl; ``avx2``: AVX2+FMA; ``generic``: portable C), or, where the
module is not built, the PyTorch reference below (``"reference"``). The environment variable
``PLD_KERNEL_ISA=avx512|avx2|generic`` forces a narrower path; a path this CPU cannot run
(or an unknown name) is refused with a one-line :class:`~promptlookup.errors.UserError` on
first use. :func:`isa` names the path in use; :func:`set_isa` changes it (tests, benchmarks).

Threads: the C kernels split the outputs across ``torch.get_num_threads()`` OpenMP threads
(the libgomp torch loaded); the split never changes a result. Cost per call: one pass over
the weight plus ``rows * in * out`` multiply-adds, and a few microseconds of checks.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Callable

import torch

from ...checkpoint.quantize import dequantize_int4, dequantize_int8_groups  # the contract's formulas
from ...errors import UserError
from . import step_ops

ENV = "PLD_KERNEL_ISA"
ISAS = ("generic", "avx2", "avx512")  # the C paths, narrowest first (the C module's levels)


def _load() -> ModuleType | None:
    try:
        return importlib.import_module(f"{__name__}._gemv")
    except ImportError:
        return None


_C: ModuleType | None = _load()
_env_applied = False
if _C is not None:
    step_ops.set_product(_C.product)  # step_ops.layers() runs these products


def _native() -> ModuleType | None:
    """The C module with ``PLD_KERNEL_ISA`` applied (once), or ``None`` where it is not built."""
    global _env_applied
    if not _env_applied:
        wanted = os.environ.get(ENV, "").strip().lower()
        if wanted:
            set_isa(wanted)
        _env_applied = True
    return _C


def available_isas() -> tuple[str, ...]:
    """The C paths this CPU can run, narrowest first (empty where the module is not built)."""
    return () if _C is None else ISAS[: _C.best_isa() + 1]


def set_isa(name: str | None) -> None:
    """Run the products on path ``name`` (``None``: the widest this CPU has).

    Raises :class:`UserError` (one line) for an unknown name, a path this CPU cannot run, or
    when the C module is not built."""
    global _env_applied
    _env_applied = True  # an explicit choice overrides the environment
    if _C is None:
        raise UserError(f"{ENV}/set_isa: the C kernels are not built; run `make native` "
                        "(or `python -m promptlookup.drafting.native.build`)")
    if name is None:
        _C.set_isa(_C.best_isa())
        step_ops.set_level(_C.best_isa())
        return
    if name not in ISAS:
        raise UserError(f"{ENV}={name!r} is not a kernel path; use one of {', '.join(ISAS)}")
    if name not in available_isas():
        raise UserError(f"{ENV}={name}: this CPU cannot run that path (it runs {', '.join(available_isas())})")
    _C.set_isa(ISAS.index(name))
    step_ops.set_level(ISAS.index(name))  # same results on every path; the speed follows the choice


def isa() -> str:
    """The path the products run on: ``"avx512"``, ``"avx2"``, ``"generic"`` (the C kernels) or
    ``"reference"`` (PyTorch, where the C module is not built)."""
    c = _native()
    return "reference" if c is None else ISAS[c.get_isa()]


def _check(x: torch.Tensor, out: int, in_: int, *weights: tuple[torch.Tensor, torch.dtype, tuple[int, ...]]) -> None:
    """Refuse what the C code would misread: dtypes, shapes, devices and layouts of the contract."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != in_ or x.device.type != "cpu":
        raise ValueError(f"x must be float32 [rows, {in_}] on the CPU, got {x.dtype} {tuple(x.shape)} on {x.device}")
    for t, dtype, shape in weights:
        if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"expected a contiguous {dtype} {list(shape)} tensor on the CPU, got "
                             f"{t.dtype} {list(t.shape)} (contiguous: {t.is_contiguous()}) on {t.device}")


def _rows_reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` one row at a time (row-invariant). Each row is copied first: BLAS's matrix-vector
    product may round differently with the vector's alignment (MKL on AMD CPUs does), and a row
    of a many-row ``x`` sits at any offset, a fresh copy always at the allocator's 64 bytes."""
    return torch.stack([torch.mv(w, row.clone()) for row in x]) if x.shape[0] else x.new_zeros(0, w.shape[0])


_F32 = torch.float32


def linear_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for a float32 row-major ``w`` ``[out, in]`` (row-invariant)."""
    c = _C if _env_applied else _native()
    if (c is not None and x.dtype is _F32 and w.dtype is _F32 and x.is_cpu and w.is_cpu and x.dim() == 2
            and w.dim() == 2 and x.shape[1] == w.shape[1] and w.is_contiguous()):  # the checks, cheaply
        x = x.contiguous()
        y = torch.empty(x.shape[0], w.shape[0])
        if y.numel():
            c.fp32(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], w.shape[1], w.shape[0])
        return y
    out, in_ = w.shape
    _check(x, out, in_, (w, torch.float32, (out, in_)))
    return _rows_reference(w, x.contiguous())


def fp32_product(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`linear_fp32` bound to ``w``, which is checked once here: each call checks only
    ``x`` (dtype, device, width), for the ~120 products of a decoding step. The C path is
    the one in use when the product is called (:func:`set_isa` applies)."""
    c = _native()
    out, in_ = w.shape
    _check(torch.empty(0, in_), out, in_, (w, torch.float32, (out, in_)))
    if c is None:
        return lambda x: linear_fp32(x, w)
    run, w_ptr = c.fp32, w.data_ptr()

    def product(x: torch.Tensor) -> torch.Tensor:
        if x.dtype is not _F32 or not x.is_cpu or x.dim() != 2 or x.shape[1] != in_:
            return linear_fp32(x, w)  # the one-line refusal
        x = x.contiguous()
        y = torch.empty(x.shape[0], out)
        if y.numel():
            run(x.data_ptr(), w_ptr, y.data_ptr(), x.shape[0], in_, out)
        return y

    return product  # its closure holds w, whose address it reads


def linear_int8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (qweight * scale[:, None]).T`` (row-invariant; the reference: one row at a time)."""
    c = _native()
    out, in_ = qweight.shape
    _check(x, out, in_, (qweight, torch.int8, (out, in_)), (scale, torch.float32, (out,)))
    if c is None:
        return _rows_reference(qweight.float() * scale.view(-1, 1), x)
    x = x.contiguous()
    y = torch.empty(x.shape[0], out)
    if y.numel():
        c.int8(x.data_ptr(), qweight.data_ptr(), scale.data_ptr(), y.data_ptr(), x.shape[0], in_, out)
    return y


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """``x @ W.T`` for an int4 weight (row-invariant; the reference: dequantize, then one row at a time).
    The SIMD paths take 16 columns of one group per step, so a ``group_size`` that is not a
    multiple of 16 runs the generic C code (same results for every row count, slower)."""
    out, half = qweight.shape
    if group_size < 2 or group_size % 2 or (2 * half) % group_size:
        raise ValueError(f"group_size must be even and divide in ({2 * half}), got {group_size}")
    return _linear_groups(x, qweight, torch.uint8, 2 * half, scale, offset, group_size, "int4", dequantize_int4)


def linear_int8_groups(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                       group_size: int) -> torch.Tensor:
    """``x @ W.T`` for an int8 weight with per-group scales and offsets (row-invariant; the
    reference: dequantize, then one row at a time). As for int4, a ``group_size`` that is not
    a multiple of 16 runs the generic C code."""
    out, in_ = qweight.shape
    if group_size < 1 or in_ % group_size:
        raise ValueError(f"group_size must divide in ({in_}), got {group_size}")
    return _linear_groups(x, qweight, torch.int8, in_, scale, offset, group_size, "int8g", dequantize_int8_groups)


def _linear_groups(x: torch.Tensor, qweight: torch.Tensor, codes: torch.dtype, in_: int, scale: torch.Tensor,
                   offset: torch.Tensor, group_size: int, name: str,
                   dequantize: Callable[..., torch.Tensor]) -> torch.Tensor:
    """The per-group products' common part: the contract's checks, then the C function ``name``
    or, without the C module, the reference on the ``dequantize``d weight."""
    c = _native()
    out = qweight.shape[0]
    groups = (out, in_ // group_size)
    _check(x, out, in_, (qweight, codes, tuple(qweight.shape)), (scale, torch.float32, groups),
           (offset, torch.float32, groups))
    if c is None:
        return _rows_reference(dequantize(qweight, scale, offset, group_size), x)
    x = x.contiguous()
    y = torch.empty(x.shape[0], out)
    if y.numel():
        getattr(c, name)(x.data_ptr(), qweight.data_ptr(), scale.data_ptr(), offset.data_ptr(), y.data_ptr(),
                         x.shape[0], in_, out, group_size)
    return y


def read_bandwidth_probe(buffer: torch.Tensor) -> float:
    """Sum of a contiguous float32 ``buffer`` read on every thread (the benchmarks time it to
    measure the memory bandwidth the products are bound by); needs the C module."""
    c = _native()
    if c is None:
        raise UserError("the bandwidth probe needs the C kernels; run `make native`")
    if buffer.dtype != torch.float32 or not buffer.is_contiguous():
        raise ValueError("the probe reads a contiguous float32 tensor")
    return c.read(buffer.data_ptr(), buffer.numel() * 4)
