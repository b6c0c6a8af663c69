"""The Hugging Face ``transformers`` baseline: plain ``generate`` and its prompt lookup.

:func:`hf_generate` runs one prompt at a time (HF's prompt-lookup candidate generator does
not batch, and one-at-a-time also keeps padding out of the comparison) and returns only
the new tokens of each prompt, ending with ``end_id`` when generation stopped on it, which
is the same convention as :class:`promptlookup.runtime.results.SequenceResult`.

It does no work besides ``model.generate`` per prompt, so wall-clock timing around a
call measures HF's decoding. :func:`count_forward_calls` counts target forward passes,
from which verification steps (and tokens per step) follow: with prompt lookup, each
forward pass verifies one draft and yields the accepted tokens plus one of its own.

:func:`load_hf_model` opens either a Hugging Face model directory or one of our
TensorRT-LLM-format checkpoint/engine directories (read back into a ``LlamaForCausalLM``).
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..errors import UserError
from ..runtime.base import SamplingConfig

_DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
           "bf16": "bfloat16", "bfloat16": "bfloat16"}
DATA_TYPES = ("auto", *sorted(_DTYPES))


def _sampling_kwargs(sampling: SamplingConfig | None) -> dict[str, Any]:
    if sampling is None or sampling.greedy:
        # Explicit Nones stop the model's own generation_config from injecting sampling knobs.
        return {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k or None,
        "top_p": sampling.top_p if sampling.top_p < 1.0 else None,
    }


def hf_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    end_id: int,
    prompt_lookup_num_tokens: int | None = None,
    max_matching_ngram_size: int | None = None,
    sampling: SamplingConfig | None = None,
    pad_id: int | None = None,
    on_output: Callable[[int, list[int]], None] | None = None,
) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` for each prompt; returns the new tokens only.

    With ``prompt_lookup_num_tokens`` set, HF's prompt-lookup decoding drafts that many
    tokens from n-grams of up to ``max_matching_ngram_size`` tokens (HF's default when
    None). ``sampling`` None or greedy gives greedy decoding; otherwise the torch RNG is
    seeded once with ``sampling.random_seed`` before the first prompt. ``on_output(i, ids)``
    is called after prompt ``i`` finishes (for progress reporting).
    """
    import torch

    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "eos_token_id": end_id,
        "pad_token_id": end_id if pad_id is None else pad_id,
        "num_beams": 1,
        **_sampling_kwargs(sampling),
    }
    if prompt_lookup_num_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        if max_matching_ngram_size is not None:
            kwargs["max_matching_ngram_size"] = max_matching_ngram_size
    if sampling is not None and not sampling.greedy:
        torch.manual_seed(sampling.random_seed)
    device = next(model.parameters()).device
    outputs: list[list[int]] = []
    with torch.inference_mode():
        for index, prompt in enumerate(prompts):
            input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
            sequences = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
            new = sequences[0, input_ids.shape[1]:].tolist()
            if end_id in new:  # never return anything after the end token
                new = new[: new.index(end_id) + 1]
            outputs.append(new)
            if on_output is not None:
                on_output(index, new)
    return outputs


@dataclass
class ForwardCounter:
    """Number of forward passes of a model observed inside :func:`count_forward_calls`."""

    calls: int = 0


@contextlib.contextmanager
def count_forward_calls(model: Any) -> Iterator[ForwardCounter]:
    """Count calls of ``model.forward`` (the target's verification steps) within the block."""
    counter = ForwardCounter()

    def hook(*_: Any) -> None:
        counter.calls += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield counter
    finally:
        handle.remove()


def is_converted_dir(directory: str | Path) -> bool:
    """True for a TensorRT-LLM-format checkpoint or engine dir (not a HF model dir)."""
    config = Path(directory) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and ("architecture" in data or "pretrained_config" in data)


def resolve_dtype(data_type: str, device: str) -> Any:
    """torch dtype for ``--data_type``; ``auto`` is float32 on CPU and float16 on CUDA."""
    import torch

    if data_type == "auto":
        return torch.float16 if device.startswith("cuda") else torch.float32
    if data_type not in _DTYPES:
        raise UserError(f"unknown --data_type {data_type!r}; choose one of {', '.join(DATA_TYPES)}")
    return getattr(torch, _DTYPES[data_type])


def check_device(device: str | None) -> str:
    """The HF model's device (``None``: a GPU when one is visible); :class:`UserError` if unusable."""
    from ..runtime.device import resolve_device

    return resolve_device(device, "--hf_device")


def check_hf_model_dir(directory: str) -> None:
    """Cheap up-front check that ``directory`` can hold a model (a config.json is there)."""
    if not Path(directory).is_dir():
        raise UserError(f"--hf_model_dir {directory} does not exist; point it at a Hugging Face model or a converted checkpoint")
    if not (Path(directory) / "config.json").is_file():
        raise UserError(f"--hf_model_dir {directory} has no config.json; point it at a Hugging Face model or a converted checkpoint")


def load_hf_model(directory: str, *, data_type: str = "auto", device: str | None = None) -> Any:
    """Load the HF baseline model from ``directory`` in eval mode on ``device``."""
    path = Path(directory)
    check_hf_model_dir(directory)
    device = check_device(device)
    dtype = resolve_dtype(data_type, device)
    if is_converted_dir(path):
        try:
            from ..checkpoint.load import load_checkpoint
        except ImportError:
            raise UserError(
                f"{directory} is a converted checkpoint but this install cannot read one back "
                "(promptlookup.checkpoint.load is missing); pass --hf_model_dir with the original Hugging Face model"
            ) from None
        model = load_checkpoint(str(path))
    else:
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load a Hugging Face model from {directory}: {' '.join(str(exc).split())[:200]}") from None
    return model.to(device=device, dtype=dtype).eval()
