"""CpuLinear computes nn.Linear's product for every row count, in row-major layout."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from promptlookup.runtime.cpu_linear import ONEDNN_MIN_ROWS, CpuLinear


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


def test_kernel_choice_is_reported():
    proj = CpuLinear(nn.Linear(16, 16, bias=False))
    expected = "mkl+onednn" if torch.backends.mkldnn.is_available() else "mkl"
    assert proj.kernel == expected
    assert ONEDNN_MIN_ROWS >= 2  # one-row steps keep the weight-streaming route
