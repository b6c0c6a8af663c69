"""Tiny weight-only quantized engines' models for tests: a tiny Llama converted with
``--use_weight_only`` and loaded back as the engine loads it (a :class:`PagedLlama` on int8/int4
weights), so greedy-identity tests can run on the quantized products unchanged."""
from __future__ import annotations

import tempfile
from pathlib import Path

from promptlookup.checkpoint.convert import convert_model
from promptlookup.checkpoint.load import load_checkpoint_state
from promptlookup.checkpoint.quant_spec import QuantSpec
from promptlookup.runtime.paged_llama import PagedLlama

# pytest ids -> the quantization: int8 per channel (W8A16), int4 in groups of 32 (W4A16_GPTQ),
# int4 per channel (W4A16), int8 in groups of 32 (W8A16_GPTQ); ``_lm``: with --quantize_lm_head
# (the embedding table and LM head too)
SPECS = {"int8": QuantSpec("int8"), "int4": QuantSpec("int4", 32), "int4ch": QuantSpec("int4"),
         "int8g": QuantSpec("int8", 32),
         "int8_lm": QuantSpec("int8", lm_head=True), "int4_lm": QuantSpec("int4", 32, lm_head=True)}


def product_atol(expected, inner: int) -> float:
    """The absolute tolerance of a float32 product of ``inner`` terms against ``expected`` (the
    product in float64, rounded): each kernel path sums in its own order (AVX2's int4 takes the
    offsets' term apart), so rounding grows with the terms, about as sqrt(inner) for random ones."""
    return 2e-6 * inner ** 0.5 * max(expected.abs().max().item(), 1.0)


def quantized_model(model, precision: str, tp_size: int = 1) -> PagedLlama:
    """``model`` (a HF Llama) converted with ``SPECS[precision]`` and loaded as an engine is."""
    with tempfile.TemporaryDirectory() as tmp:
        out = convert_model(model, None, Path(tmp) / "ckpt", dtype="float32", quant=SPECS[precision], tp_size=tp_size)
        config, state = load_checkpoint_state(out, dtype="auto")
    return PagedLlama(config, state)
