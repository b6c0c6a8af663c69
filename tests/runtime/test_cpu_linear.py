"""CpuLinear computes nn.Linear's product for every row count, in row-major layout."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from promptlookup.runtime.cpu_linear import CpuLinear


@pytest.mark.parametrize("bias", [False, True])
def test_matches_nn_linear_for_every_row_count(bias):
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=bias).requires_grad_(False)
    proj = CpuLinear(layer)
    for rows in range(1, 41):
        x = torch.randn(rows, 64)
        y = proj(x)
        assert y.shape == (rows, 96)
        assert y.is_contiguous()  # downstream kernels need dense rows
        torch.testing.assert_close(y, layer(x), rtol=1e-5, atol=1e-5)


def test_column_major_input_is_accepted():
    layer = nn.Linear(32, 48, bias=False).requires_grad_(False)
    x = torch.randn(32, 5).t()  # a [5, 32] view with column-major strides
    torch.testing.assert_close(CpuLinear(layer)(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("onednn", ["as built", "missing", "refuses the weight"])
def test_every_route_matches_nn_linear_and_the_report_names_the_route(monkeypatch, onednn):
    """``kernel`` says whether oneDNN serves multi-row calls; one-row calls never use it."""
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
    proj = CpuLinear(layer)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    if onednn != "as built":
        assert proj.kernel == "mkl"
    for rows in (1, 2, 8, 33):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(proj(x), layer(x), rtol=1e-5, atol=1e-5)
    assert 1 not in calls  # one-row decode steps keep the weight-streaming route
    assert (8 in calls and 33 in calls) == (proj.kernel == "mkl+onednn")
