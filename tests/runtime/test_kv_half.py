"""A float16 K/V pool under a float32 engine (``KvCacheConfig.dtype="float16"``), in the C
step ops: K/V rounded as torch rounds them (to nearest even) on every instruction-set path,
and attention over the float16 pool bitwise attention over its float32 widening, on every
path, route (rows in units, one row split by a team) and thread count."""
from __future__ import annotations

import os

import pytest
import torch

from promptlookup.runtime import kernels
from promptlookup.runtime.kernels import step_ops

if not step_ops.available():
    if os.environ.get("PLD_REQUIRE_NATIVE") == "1":
        pytest.fail("the C step ops are not built; PLD_REQUIRE_NATIVE=1 requires them", pytrace=False)
    pytest.skip("the C step ops are not built (make native)", allow_module_level=True)


@pytest.fixture(autouse=True)
def widest_path():
    before = torch.get_num_threads()
    yield
    kernels.set_isa(None)
    torch.set_num_threads(before)


def levels() -> list[str]:
    return list(kernels.available_isas())


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int16)


def test_rounding_to_float16_is_torchs_on_every_path():
    """Round to nearest even at every scale: ties of normals and of subnormals, the largest
    half and the first value that overflows, zeros, infinities; tails of 1-20 elements."""
    g = torch.Generator().manual_seed(0)
    one_ulp = 2.0**-10
    edges = [0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e6, float("inf"), float("-inf"), 2.0**-24,
             2.0**-25, 3 * 2.0**-26, 2.5 * 2.0**-24, 3.5 * 2.0**-24, 2.0**-14, 2.0**-14 * (1 - 2.0**-12),
             1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + 3 * one_ulp / 2), 1e-30, -1e-40]
    randoms = torch.randn(4000, generator=g) * torch.logspace(-9, 6, 4000)
    patterns = torch.randint(-2**31, 2**31, (4000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor(edges), randoms, patterns[~patterns.isnan()]]).contiguous()
    want = bits(x.to(torch.float16))
    for level in levels():
        kernels.set_isa(level)
        assert torch.equal(bits(step_ops.store_half(x)), want), level
        for n in range(1, 21):
            assert torch.equal(bits(step_ops.store_half(x[:n].clone())), want[:n]), (level, n)
        nan = step_ops.store_half(torch.tensor([float("nan"), -float("nan")]))
        assert nan.isnan().all()


@pytest.mark.parametrize("level", levels())
def test_rotary_write_into_a_float16_pool_rounds_the_float32_values(level):
    kernels.set_isa(level)
    g = torch.Generator().manual_seed(2)
    heads, kvh, d, slots_n, rows = 6, 2, 64, 128, 5
    qkv = torch.randn(rows, (heads + 2 * kvh) * d, generator=g) * 30
    cos, sin = torch.randn(64, d, generator=g), torch.randn(64, d, generator=g)
    positions, slots = torch.tensor([3, 9, 10, 11, 40]), torch.tensor([100, 7, 8, 120, 31])
    k32, v32 = torch.zeros(kvh, slots_n, d), torch.zeros(kvh, slots_n, d)
    k16, v16 = torch.zeros(kvh, slots_n, d, dtype=torch.float16), torch.zeros(kvh, slots_n, d, dtype=torch.float16)
    q32 = step_ops.rotary_write(qkv, cos, sin, positions, slots, k32, v32, heads)
    q16 = step_ops.rotary_write(qkv, cos, sin, positions, slots, k16, v16, heads)
    assert torch.equal(q16, q32)  # Q stays float32
    assert torch.equal(bits(k16), bits(k32.to(torch.float16)))
    assert torch.equal(bits(v16), bits(v32.to(torch.float16)))


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 2, 64), (6, 3, 48), (4, 1, 32)])
def test_attention_over_a_float16_pool_is_attention_over_its_widening(heads, kv_heads, d):
    """Chains of rows through read slots with a mask, two sequences, and one row (split by a
    team of 2 or 3 where the work calls for one): bitwise the float32 pool's values that the
    float16 pool widens to, on every path and thread count. d = 64 runs the SIMD scores and
    values, 48 and 32 the generic ones inside each path."""
    g = torch.Generator().manual_seed(heads * d)
    pool, keys = 1100, 203
    k16 = (torch.randn(kv_heads, pool, d, generator=g) * 4).to(torch.float16)
    v16 = (torch.randn(kv_heads, pool, d, generator=g) * 4).to(torch.float16)
    k32, v32 = k16.float(), v16.float()
    q = torch.randn(6, heads, d, generator=g)
    read = torch.stack([torch.randperm(pool, generator=g)[:keys] for _ in range(2)])
    mask = torch.ones(2, 3, keys, dtype=torch.bool).tril_(diagonal=keys - 3)
    calls = [
        lambda k, v: step_ops.attention(q[:1].clone(), k, v, 1, keys, 0.125, read[:1].clone()),
        lambda k, v: step_ops.attention(q[:1].clone(), k, v, 1, 150, 0.125, start=40),
        lambda k, v: step_ops.attention(q, k, v, 2, keys, 0.125, read, mask=mask),
    ]
    for level in levels():
        kernels.set_isa(level)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for call in calls:
                assert torch.equal(call(k16, v16), call(k32, v32)), (level, threads)


def test_a_pool_of_another_type_is_refused():
    q = torch.randn(1, 2, 16)
    k = torch.zeros(1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 or float16"):
        step_ops.attention(q, k, k.clone(), 1, 4, 0.25)
    with pytest.raises(ValueError, match="float32 or float16"):
        step_ops.attention(q, torch.zeros(1, 8, 16, dtype=torch.float16), torch.zeros(1, 8, 16), 1, 4, 0.25)
