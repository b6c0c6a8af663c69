"""Weight-only int8/int4 products on a CUDA GPU (:mod:`promptlookup.runtime.gpu_quant`).

- Each layout (int8 per channel, int8 and int4 per group, int4 per channel) equals
  dequantize-then-multiply within float tolerance at 1 to 33 rows, in float32, bfloat16 and
  float16, on shapes that are no multiple of the tiles and where ``K`` is cut into slices.
- Every row is bitwise the row the same ``x`` row gives alone (row invariance).
- Quantized engines on the GPU, with CUDA graphs (the default there): prompt lookup (V1, V2)
  equals plain greedy decoding token for token, and no product dequantizes a matrix.

Skipped where no GPU is visible (CI). On a machine without one, ``TRITON_INTERPRET=1`` (with
Triton installed) runs the product tests on the CPU through Triton's interpreter, in float32
and float16 (the interpreter has no bfloat16).
"""
from __future__ import annotations

import pytest
import torch

from promptlookup.checkpoint.quantize import (quantize_int4_channel, quantize_int4_groups, quantize_int8,
                                              quantize_int8_groups)
from promptlookup.runtime import gpu_quant
from promptlookup.runtime.quant_linear import QuantLinear

if torch.cuda.is_available():
    DEVICE = "cuda"
elif gpu_quant.INTERPRET and gpu_quant.available():
    DEVICE = "cpu"
else:
    DEVICE = None
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE is None, reason="no CUDA device visible (nor TRITON_INTERPRET=1 with Triton)")]

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# (layout, out, in, group): out no multiple of the 32-wide tiles; in=1344 and 1536 are cut into
# slices on a GPU (and in=512 under the interpreter's 4 "multiprocessors"); in=1344 is no
# multiple of the tiles, so a slice's last steps lie past the row. int4 per channel on 576
# columns and int8 in groups of 192 or 96 look their scales up per weight (gpu_quant.LOOKUP_BLOCKS)
CASES = [("int8", 100, 192, None), ("int8", 96, 1536, None), ("int8g", 100, 256, 32), ("int8g", 72, 1536, 128),
         ("int8g", 40, 512, 256), ("int4", 72, 256, 32), ("int4", 100, 1536, 64), ("int4", 33, 384, 128),
         ("int4ch", 50, 576, None), ("int4ch", 40, 1024, None), ("int8", 40, 1344, None), ("int8g", 40, 1344, 32),
         ("int4", 40, 1344, 64), ("int8g", 40, 576, 192), ("int8g", 40, 384, 96)]
ROWS = [1, 2, 3, 4, 11, 16, 17, 33]


def layer(kind: str, out: int, in_: int, group: int | None, seed: int = 0) -> QuantLinear:
    """A random weight quantized as ``kind``, on the test device."""
    w = torch.randn(out, in_, generator=torch.Generator().manual_seed(seed))
    if kind == "int8":
        made = QuantLinear(*quantize_int8(w))
    elif kind == "int8g":
        made = QuantLinear(*quantize_int8_groups(w, group), group_size=group)
    elif kind == "int4":
        made = QuantLinear(*quantize_int4_groups(w, group), group_size=group)
    else:  # int4 per channel: one group of the whole row, offset -8 * scale (as the loader makes it)
        q, scale = quantize_int4_channel(w)
        made = QuantLinear(q, scale.view(-1, 1), -8.0 * scale.view(-1, 1), in_)
    return made.to(DEVICE)


def product(lin: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    return gpu_quant.linear(x, lin.qweight, lin.scale, lin.offset, lin.group_size)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind,out,in_,group", CASES, ids=lambda v: str(v))
def test_product_equals_dequantize_then_multiply(kind, out, in_, group, dtype):
    lin = layer(kind, out, in_, group)
    weight = lin.dequantize(dtype).double()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    gen = torch.Generator().manual_seed(1)
    for rows in ROWS:
        x = torch.randn(rows, in_, generator=gen).to(DEVICE, dtype)
        got = product(lin, x)
        assert got.dtype == dtype and got.shape == (rows, out)
        want = x.double() @ weight.T
        err = (got.double() - want).abs().max().item() / want.abs().max().item()
        assert err < tol, (rows, err)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind,out,in_,group", CASES, ids=lambda v: str(v))
def test_rows_are_bitwise_the_rows_alone(kind, out, in_, group, dtype):
    """Row invariance: what greedy identity between plain and speculative decoding rests on."""
    if DEVICE == "cpu":
        pytest.skip("under Triton's interpreter tl.dot is numpy's matmul, whose rows depend on the BLAS")
    lin = layer(kind, out, in_, group)
    x = torch.randn(33, in_, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    whole = product(lin, x)
    for rows in (1, 4, 11, 17):
        assert torch.equal(product(lin, x[:rows]), whole[:rows]), rows
    for i in range(33):
        assert torch.equal(product(lin, x[i:i + 1])[0], whole[i]), i
    batched = product(lin, x.view(3, 11, in_))  # leading dimensions are rows too
    assert torch.equal(batched.view(33, out), whole)


def test_bias_and_refusals():
    lin = layer("int8g", 64, 256, 32)
    x = torch.randn(3, 256).to(DEVICE)
    bias = torch.randn(64).to(DEVICE)
    if DEVICE == "cuda":  # QuantLinear takes CPU tensors to the C kernels
        with_bias = QuantLinear(lin.qweight, lin.scale, lin.offset, lin.group_size, bias)
        assert torch.equal(with_bias(x), product(lin, x) + bias)
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        product(lin, x.double())
    with pytest.raises(ValueError, match="x has 128 columns, the weight 256"):
        product(lin, x[:, :128])


def test_plan_depends_on_the_weight_alone():
    """The tiling never looks at the rows; K is sliced only where the output tiles are few."""
    wide = gpu_quant.plan(16384, 2048, 132)
    assert wide.slices == 1
    narrow = gpu_quant.plan(2048, 2048, 132)
    assert narrow.slices > 1 and narrow.k_slice % narrow.block_k == 0
    assert (narrow.slices - 1) * narrow.k_slice < 2048 <= narrow.slices * narrow.k_slice


# --- quantized engines on the GPU ----------------------------------------------------------

ENGINE_SPECS = ["int8", "int8g", "int4", "int4ch", "int4_lm"]


@pytest.fixture(scope="module")
def gpu_engines(tmp_path_factory):
    if DEVICE != "cuda":
        pytest.skip("engines run on a CUDA GPU (the interpreter runs only the products)")
    from tests.conftest import _build_engine
    from tests.quantized import SPECS
    from tests.tiny import tiny_llama

    model = tiny_llama(seed=3)
    root = tmp_path_factory.mktemp("gpu_quant_engines")
    return {name: _build_engine(model, None, root / name, max_seq_len=768, max_input_len=512, quant=SPECS[name])
            for name in ENGINE_SPECS}


@pytest.mark.parametrize("name", ENGINE_SPECS)
def test_quantized_engine_lookup_equals_plain_on_the_gpu(gpu_engines, name, monkeypatch):
    from promptlookup.decoding import generate
    from promptlookup.drafting.base import DraftConfig
    from promptlookup.engine.load import load_runner
    from tests.runtime.test_greedy_equivalence import END_ID, MAX_NEW, make_prompts

    def no_float_copy(self, dtype=torch.float32):  # noqa: ANN001, ANN202
        raise AssertionError("a GPU product dequantized its matrix")

    monkeypatch.setattr(QuantLinear, "dequantize", no_float_copy)
    runner = load_runner(gpu_engines[name], device="cuda")
    assert runner.graphs is not None  # CUDA graphs, the GPU's default
    prompts = make_prompts(4)
    plain = [r.output_ids for r in generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID)]
    for workflow in ("v1", "v2"):
        for draft in (DraftConfig(prompt_lookup_num_tokens=3, max_matching_ngram_size=2),
                      DraftConfig(prompt_lookup_num_tokens=10, max_matching_ngram_size=2),
                      DraftConfig(prompt_lookup_num_tokens=8, mode="longest")):
            got = generate(runner, prompts, max_new_tokens=MAX_NEW, end_id=END_ID, draft=draft, workflow=workflow)
            assert [r.output_ids for r in got] == plain, (workflow, draft)
            assert sum(r.accepted for r in got) > 0
    one = [generate(runner, [p], max_new_tokens=MAX_NEW, end_id=END_ID)[0].output_ids for p in prompts]
    assert one == plain  # batch size changes nothing
