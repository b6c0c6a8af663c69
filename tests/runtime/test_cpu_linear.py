"""CpuLinear computes nn.Linear's product for every row count, in row-major layout, and
keeps one copy of the weight; with the C kernels, few-row products are row-invariant."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from promptlookup.runtime import kernels
from promptlookup.runtime.cpu_linear import GEMV_MAX_ROWS, CpuLinear

needs_c = pytest.mark.skipif(kernels._C is None, reason="the C kernels are not built")


@pytest.fixture
def without_c_kernels(monkeypatch):
    """CpuLinear as where the C kernels are not built (the oneDNN/MKL routes)."""
    monkeypatch.setattr(kernels, "_C", None)


def _proj(layer: nn.Linear, **kw) -> CpuLinear:
    return CpuLinear(layer.weight, layer.bias, **kw)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_matches_nn_linear_for_every_row_count(bias, shared):
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=bias).requires_grad_(False)
    proj = _proj(layer, small_rows_weight=layer.weight if shared else None)
    for rows in range(1, 41):
        x = torch.randn(rows, 64)
        y = proj(x)
        assert y.shape == (rows, 96)
        assert y.is_contiguous()  # downstream kernels need dense rows
        torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-5)


def test_column_major_input_is_accepted():
    layer = nn.Linear(32, 48, bias=False).requires_grad_(False)
    x = torch.randn(32, 5).t()  # a [5, 32] view with column-major strides
    torch.testing.assert_close(_proj(layer)(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch build has no oneDNN")
def test_the_row_major_weight_is_not_kept(without_c_kernels):
    """With oneDNN the layer holds only the reordered copy: dropping the caller's tensor frees it."""
    weight = torch.randn(48, 32)
    proj = CpuLinear(weight)
    assert proj.kernel == "onednn" and proj.plain is None
    assert weight.untyped_storage().data_ptr() not in {
        t.untyped_storage().data_ptr() for t in (proj.packed,) if not t.is_mkldnn
    }
    assert proj.resident_bytes() >= weight.numel() * weight.element_size()


@pytest.mark.parametrize("onednn", ["as built", "missing", "refuses the weight"])
@pytest.mark.parametrize("shared", [False, True])
def test_every_route_matches_nn_linear_and_the_report_names_the_route(monkeypatch, without_c_kernels, onednn, shared):
    """Without the C kernels, oneDNN serves every row count (fewer than 4 rows padded to 4),
    except few rows when a shared row-major weight is given."""
    if onednn == "missing":
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    elif onednn == "refuses the weight":
        def refuse(*args, **kwargs):
            raise RuntimeError("unsupported weight")

        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    calls: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    torch.manual_seed(1)
    layer = nn.Linear(32, 40).requires_grad_(False)
    proj = _proj(layer, small_rows_weight=layer.weight if shared else None)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    expected = "mkl" if onednn != "as built" else ("mkl+onednn" if shared else "onednn")
    assert proj.kernel == expected
    for rows in (1, 2, 8, 33):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(proj(x), layer(x), rtol=1e-5, atol=1e-5)
    served = {"mkl": [], "mkl+onednn": [8, 33], "onednn": [4, 4, 8, 33]}[expected]  # 1-2 rows padded to 4
    assert calls == served


@needs_c
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("packed_copy", [False, True])
def test_the_c_kernel_holds_the_row_major_weight_once_and_rows_are_invariant(monkeypatch, shared, packed_copy):
    """Route ``gemv``: the row-major weight (the shared one when given, no copy) serves every
    row count; up to GEMV_MAX_ROWS rows give bitwise the values of one row at a time."""
    torch.manual_seed(2)
    layer = nn.Linear(64, 96, bias=False).requires_grad_(False)
    proj = _proj(layer, small_rows_weight=layer.weight if shared else None, packed_copy=packed_copy)
    assert proj.kernel == ("gemv+onednn" if packed_copy and proj.packed is not None else "gemv")
    held = proj.small_rows_weight if shared else proj.plain
    assert held.data_ptr() == layer.weight.data_ptr()  # the caller's tensor, not a copy
    assert (proj.plain is None) == shared
    x = torch.randn(GEMV_MAX_ROWS + 3, 64)
    one_at_a_time = torch.cat([proj(x[i:i + 1]) for i in range(x.shape[0])])
    for rows in (2, 11, 33, GEMV_MAX_ROWS):
        assert torch.equal(proj(x[:rows]), one_at_a_time[:rows])
    torch.testing.assert_close(proj(x), layer(x), rtol=1e-5, atol=1e-5)  # beyond: MKL or oneDNN
    with_bias = CpuLinear(layer.weight, torch.ones(96))
    torch.testing.assert_close(with_bias(x[:3]), layer(x[:3]) + 1, rtol=1e-5, atol=1e-5)
