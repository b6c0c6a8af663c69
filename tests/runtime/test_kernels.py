"""The CPU products of runtime.kernels keep their contract on every instruction-set path this
machine can run: row invariance (bitwise), closeness to ``x @ W.T``, a thread count that
never changes a result, and one-line refusals of a path the CPU lacks."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from promptlookup.errors import UserError
from promptlookup.runtime import kernels
from promptlookup.runtime.cpu_linear import GEMV_MAX_ROWS
from tests.quantized import product_atol

PATHS = ("reference", *kernels.ISAS)
MAX_ROWS = GEMV_MAX_ROWS  # every row count a step runs through the kernels


@pytest.fixture(params=PATHS)
def path(request):
    """Run the test on one path; a C path this machine lacks is skipped (or, without the C
    module under PLD_REQUIRE_NATIVE=1, fails)."""
    name = request.param
    if name != "reference" and name not in kernels.available_isas():
        if kernels._C is None and os.environ.get("PLD_REQUIRE_NATIVE") == "1":
            pytest.fail("the C kernels are not built; PLD_REQUIRE_NATIVE=1 requires them")
        pytest.skip(f"this machine cannot run the {name} path (or the C kernels are not built)")
    before = kernels.isa()  # applies PLD_KERNEL_ISA while the C module is in place; restored after
    saved = kernels._C
    try:
        if name == "reference":
            kernels._C = None
        else:
            kernels.set_isa(name)
        assert kernels.isa() == name
        yield name
    finally:
        kernels._C = saved
        if saved is not None:
            kernels.set_isa(before)


def _int4(out: int, in_: int, group: int, g: torch.Generator):
    q = torch.randint(0, 256, (out, in_ // 2), dtype=torch.uint8, generator=g)
    scale = torch.rand(out, in_ // group, generator=g) * 0.1
    offset = -8 * scale + torch.randn(out, in_ // group, generator=g) * 0.01
    return q, scale, offset


# (out, in, int4 group): tails of every vector width, an output count no block size divides,
# int4 groups the SIMD steps take (multiples of 16) and ones they leave to the generic code
SHAPES = [(37, 134, 2), (130, 576, 32), (9, 40, 8), (21, 96, 48), (67, 256, 64)]


def _cases(out: int, in_: int, group: int, seed: int):
    """(name, product, dequantized fp32 weight) for each kernel."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, in_, generator=g)
    q8 = torch.randint(-127, 128, (out, in_), dtype=torch.int8, generator=g)
    s8 = torch.rand(out, generator=g) * 0.01
    q4, s4, o4 = _int4(out, in_, group, g)
    s8g = torch.rand(out, in_ // group, generator=g) * 0.01
    o8g = torch.randn(out, in_ // group, generator=g) * 0.01
    return [
        ("fp32", lambda x: kernels.linear_fp32(x, w), w),
        ("int8", lambda x: kernels.linear_int8(x, q8, s8), q8.float() * s8[:, None]),
        ("int4", lambda x: kernels.linear_int4(x, q4, s4, o4, group), kernels.dequantize_int4(q4, s4, o4, group)),
        ("int8g", lambda x: kernels.linear_int8_groups(x, q8, s8g, o8g, group),
         kernels.dequantize_int8_groups(q8, s8g, o8g, group)),
    ]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rows_are_bitwise_invariant_and_close_to_the_product(path, shape):
    out, in_, group = shape
    x = torch.randn(MAX_ROWS, in_, generator=torch.Generator().manual_seed(1))
    for name, product, weight in _cases(out, in_, group, seed=2):
        single = torch.cat([product(x[i:i + 1].clone()) for i in range(MAX_ROWS)])
        assert single.shape == (MAX_ROWS, out) and single.dtype == torch.float32
        for rows in range(1, MAX_ROWS + 1):
            y = product(x[:rows].clone())
            assert y.shape == (rows, out) and y.is_contiguous()
            assert torch.equal(y, single[:rows]), f"{path} {name}: {rows} rows differ from one row at a time"
        shifted = product(torch.cat([x[5:6], x[:5]]))  # a row's place among the rows changes nothing
        assert torch.equal(shifted[0], single[5]) and torch.equal(shifted[1:], single[:5])
        expected = (x.double() @ weight.double().T).float()
        torch.testing.assert_close(single, expected, rtol=1e-5, atol=product_atol(expected, in_),
                                   msg=lambda m: f"{path} {name}: {m}")


def test_thread_count_changes_no_result(path):
    out, in_, group = 1031, 576, 32  # large enough to be split across threads
    x = torch.randn(11, in_)
    saved = torch.get_num_threads()
    try:
        for name, product, _ in _cases(out, in_, group, seed=3):
            torch.set_num_threads(1)
            one = product(x)
            torch.set_num_threads(2)
            two = product(x)
            assert torch.equal(one, two), f"{path} {name}"
    finally:
        torch.set_num_threads(saved)


def test_zero_rows_and_strided_input(path):
    w = torch.randn(24, 32)
    assert kernels.linear_fp32(torch.zeros(0, 32), w).shape == (0, 24)
    x = torch.randn(32, 5).t()  # a [5, 32] view with column-major strides
    assert torch.equal(kernels.linear_fp32(x, w), kernels.linear_fp32(x.contiguous(), w))


def test_what_the_c_code_would_misread_is_refused():
    w = torch.randn(24, 32)
    with pytest.raises(ValueError, match="float32"):
        kernels.linear_fp32(torch.randn(2, 32, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="rows, 32"):
        kernels.linear_fp32(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.linear_fp32(torch.randn(2, 32), torch.randn(32, 24).t())
    with pytest.raises(ValueError, match="int8"):
        kernels.linear_int8(torch.randn(2, 32), w, torch.ones(24))
    q4, s4, o4 = _int4(24, 32, 16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="group_size"):
        kernels.linear_int4(torch.randn(2, 32), q4, s4, o4, 12)
    with pytest.raises(ValueError, match=r"\[24, 2\]"):
        kernels.linear_int4(torch.randn(2, 32), q4, s4[:, :1], o4, 16)
    q8 = torch.zeros(24, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="group_size"):
        kernels.linear_int8_groups(torch.randn(2, 32), q8, s4, o4, 12)
    with pytest.raises(ValueError, match=r"\[24, 2\]"):
        kernels.linear_int8_groups(torch.randn(2, 32), q8, s4, o4[:, :1], 16)
    with pytest.raises(ValueError, match="int8"):
        kernels.linear_int8_groups(torch.randn(2, 32), q8.view(torch.uint8), s4, o4, 16)


def test_unknown_or_unavailable_paths_are_refused_in_one_line(monkeypatch):
    if kernels._C is None:
        with pytest.raises(UserError, match="not built"):
            kernels.set_isa("generic")
        return
    before = kernels.isa()
    try:
        with pytest.raises(UserError, match="not a kernel path") as exc:
            kernels.set_isa("sse9")
        assert "\n" not in str(exc.value)
        monkeypatch.setattr(kernels._C, "best_isa", lambda: 0)  # a CPU with neither AVX2 nor AVX-512
        with pytest.raises(UserError, match="cannot run that path") as exc:
            kernels.set_isa("avx2")
        assert "\n" not in str(exc.value) and "generic" in str(exc.value)
        monkeypatch.undo()
        best = kernels.available_isas()[-1]
        if best != "avx512":  # the C module refuses too, whatever the wrapper says
            with pytest.raises(ValueError, match="cannot run"):
                kernels._C.set_isa(kernels.ISAS.index("avx512"))
    finally:
        kernels.set_isa(before)


@pytest.mark.parametrize("value, expected", [("generic", "generic"), ("avx2", "avx2"), ("bogus", None)])
def test_the_environment_variable_forces_a_path(value, expected):
    if kernels._C is None or (expected is not None and expected not in kernels.available_isas()):
        pytest.skip("the C kernels are not built, or this CPU lacks the path")
    code = "from promptlookup.runtime import kernels; print(kernels.isa())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, kernels.ENV: value})
    if expected is None:
        assert proc.returncode != 0 and "is not a kernel path" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected


def test_bandwidth_probe_sums_the_buffer():
    if kernels._C is None:
        pytest.skip("the C kernels are not built")
    buf = torch.ones(1 << 16)
    assert kernels.read_bandwidth_probe(buf) == float(1 << 16)


def test_avx512_int4_decodes_alike_with_and_without_vbmi(tmp_path):
    """gemv.c decodes AVX-512 int4 codes with vpmultishiftqb where the CPU has AVX512-VBMI
    and with vpshufb + vpsrlvd under PLD_KERNEL_NO_VBMI=1: bitwise the same outputs."""
    if kernels._C is None or "avx512" not in kernels.available_isas():
        pytest.skip("the C kernels are not built, or this CPU lacks AVX-512")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(MAX_ROWS, 640, generator=g)
    for group in (32, 128, 64):
        q4, s4, o4 = _int4(70, 640, group, g)
        torch.save((x, q4, s4, o4, group), tmp_path / f"case{group}.pt")
    code = ("import sys, torch; from promptlookup.runtime import kernels; kernels.set_isa('avx512'); "
            "[torch.save([kernels.linear_int4(c[0][:m], *c[1:]) for m in (1, 2, 5, 11, 33)], p + '.out') "
            "for p in sys.argv[1:] for c in [torch.load(p)]]")
    files = sorted(str(p) for p in tmp_path.glob("case*.pt"))
    outs = {}
    for vbmi in ("on", "off"):
        env = {k: v for k, v in os.environ.items() if k not in ("PLD_KERNEL_NO_VBMI", kernels.ENV)}
        if vbmi == "off":
            env["PLD_KERNEL_NO_VBMI"] = "1"
        proc = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        outs[vbmi] = [torch.load(f + ".out") for f in files]
    for on, off in zip(outs["on"], outs["off"]):
        assert all(torch.equal(a, b) for a, b in zip(on, off))
