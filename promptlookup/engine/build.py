"""Build an engine directory from a TensorRT-LLM checkpoint.

``backend="trtllm"`` runs the real ``trtllm-build``; ``backend="torch"`` writes the
PyTorch engine described in :mod:`promptlookup.engine.config`: the build limits plus the
checkpoint's weights (verified by loading them once) and tokenizer. ``auto`` picks
TensorRT-LLM when it and a suitable GPU are present, else PyTorch.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..fsutil import atomic_output_dir
from .config import COMPILED_KEY, ENGINE_FORMAT_VERSION, ENGINE_KIND, read_engine_config
from .load import BACKENDS

SPECULATIVE_MODES = ("draft_tokens_external", "lookahead_decoding")
# trtllm-build --gemm_plugin values (TensorRT-LLM 1.0 PluginConfig); the PyTorch backend records the choice only.
GEMM_PLUGINS = ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "added_tokens.json",
    "generation_config.json",
)


def resolve_backend(backend: str) -> str:
    from ..runtime.trtllm.env import trtllm_unavailable_reason

    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    reason = trtllm_unavailable_reason()
    if backend == "trtllm" and reason is not None:
        raise UserError(f"--backend trtllm: {reason}")
    if backend == "auto":
        return "trtllm" if reason is None else "torch"
    return backend


def check_build_flags(
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int | None,
    max_draft_len: int,
    speculative_decoding_mode: str | None,
    tokens_per_block: int,
) -> None:
    """Refuse build limits that are wrong whatever the checkpoint (``max_seq_len`` None: not
    given, so not checked): a one-line :class:`UserError` naming the flag, the value and the
    fix. Cheap, so build.sh calls it before reading anything."""
    seq_fix = "pass a --max_seq_len above --max_input_len, or leave it out for the default"
    checks = [
        (max_batch_size >= 1, f"--max_batch_size must be at least 1, got {max_batch_size}"),
        (max_input_len >= 1, f"--max_input_len must be at least 1, got {max_input_len}"),
        (max_draft_len >= 0, f"--max_draft_len must be 0 or more, got {max_draft_len}"),
        (tokens_per_block >= 1 and tokens_per_block & (tokens_per_block - 1) == 0,
         f"--tokens_per_block must be a power of two, got {tokens_per_block}"),
        (max_seq_len is None or max_seq_len >= 1, f"--max_seq_len must be at least 1, got {max_seq_len}; {seq_fix}"),
        (max_seq_len is None or max_seq_len > max_input_len,
         f"--max_seq_len {max_seq_len} must exceed --max_input_len {max_input_len}; pass a larger --max_seq_len "
         "or a smaller --max_input_len"),
        (max_draft_len == 0 or speculative_decoding_mode in SPECULATIVE_MODES,
         "--max_draft_len needs --speculative_decoding_mode draft_tokens_external (or lookahead_decoding)"),
        # trtllm-build accepts a mode without --max_draft_len and builds an engine that can verify no
        # draft (its examples always pass both); refused here, so that run.py's drafting flags work.
        (speculative_decoding_mode is None or max_draft_len >= 1,
         f"--speculative_decoding_mode {speculative_decoding_mode} needs --max_draft_len of at least 1 (got "
         f"{max_draft_len}), the most draft tokens a step verifies; pass e.g. --max_draft_len "
         + ("32 (run.py --lookahead_config [4,3,4] needs 16)" if speculative_decoding_mode == "lookahead_decoding"
            else "10 (at least the k of run.py --prompt_lookup_config [k,n])")),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def build_config(
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_draft_len: int,
    speculative_decoding_mode: str | None,
    use_paged_context_fmha: bool,
    gemm_plugin: str,
    tokens_per_block: int,
    max_position_embeddings: int,
) -> dict[str, Any]:
    """Validated build limits, named as in TensorRT-LLM's ``build_config``."""
    check_build_flags(max_batch_size=max_batch_size, max_input_len=max_input_len, max_seq_len=max_seq_len,
                      max_draft_len=max_draft_len, speculative_decoding_mode=speculative_decoding_mode,
                      tokens_per_block=tokens_per_block)
    if max_seq_len > max_position_embeddings:
        raise UserError(f"--max_seq_len {max_seq_len} exceeds the model's max_position_embeddings "
                        f"{max_position_embeddings}; pass --max_seq_len {max_position_embeddings} or less")
    return {
        "max_batch_size": max_batch_size,
        "max_input_len": max_input_len,
        "max_seq_len": max_seq_len,
        "max_draft_len": max_draft_len,
        "max_beam_width": 1,
        "speculative_decoding_mode": speculative_decoding_mode,
        "plugin_config": {
            "use_paged_context_fmha": use_paged_context_fmha,
            "gemm_plugin": gemm_plugin,
            "paged_kv_cache": True,
            "tokens_per_block": tokens_per_block,
        },
    }


def build_torch_engine(
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    build: dict[str, Any],
    *,
    step_costs_device: str | None = None,
    compile_device: str | None = None,
) -> Path:
    """Write a PyTorch engine directory (atomically) and return its path.

    ``step_costs_device`` (``cpu``, ``cuda``, ``auto``; ``None``: skip) measures the step-cost
    table on that device and stores it in ``config.json`` (:mod:`.step_costs`).
    ``compile_device`` (the same values; ``None``: skip) compiles every step bucket with
    inductor on that device and stores the compile caches in the engine
    (:mod:`.compile_cache`); both happen before the engine is renamed into place.
    """
    from ..checkpoint.config import quant_spec_of, read_checkpoint_config
    from ..checkpoint.load import load_checkpoint, load_checkpoint_state

    checkpoint_dir = Path(checkpoint_dir)
    pretrained = read_checkpoint_config(checkpoint_dir)
    quant = quant_spec_of(pretrained)
    if quant is not None and compile_device is not None:
        raise UserError(f"--torch_compile inductor cannot trace the int8/int4 products of a {quant.quant_algo} "
                        f"checkpoint; drop --torch_compile")
    # Proves the weights are complete and consistent; in the engine's dtype for the step costs.
    if quant is None:
        model = load_checkpoint(checkpoint_dir, dtype="auto")
    else:  # the step costs are those of the int8/int4 products the engine will run
        from ..runtime.device import resolve_device
        from ..runtime.paged_llama import PagedLlama

        device = resolve_device(step_costs_device or "cpu")
        model = PagedLlama(*load_checkpoint_state(checkpoint_dir, dtype="auto", device=device))
    step_costs = {}
    if step_costs_device is not None:
        step_costs = measure_for_engine(model, pretrained, build, step_costs_device)
    del model
    output_dir = Path(output_dir)
    with atomic_output_dir(output_dir, ENGINE_KIND, inputs=[("--checkpoint_dir", checkpoint_dir)]) as tmp:
        for src in sorted(checkpoint_dir.glob("rank*.safetensors")):
            shutil.copyfile(src, tmp / src.name)
        for name in TOKENIZER_FILES:
            if (checkpoint_dir / name).is_file():
                shutil.copyfile(checkpoint_dir / name, tmp / name)
        config = {
            "version": ENGINE_FORMAT_VERSION,
            "backend": "torch",
            "pretrained_config": pretrained,
            "build_config": build,
        }
        if step_costs:
            config["step_costs"] = step_costs
        _write_config(tmp, config)
        if compile_device is not None:  # loads the engine just written, as run.py will
            config[COMPILED_KEY] = compile_for_engine(tmp, compile_device)
            _write_config(tmp, config)
    return output_dir


def _write_config(engine_dir: Path, config: dict[str, Any]) -> None:
    (engine_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def compile_for_engine(engine_dir: Path, device: str) -> dict[str, Any]:
    """The ``"compiled"`` entry of the engine in ``engine_dir`` (config.json written, no entry
    yet), after compiling every step bucket on ``device`` and writing the caches there.
    Loads the engine with run.py's defaults so that the compiled shapes are run.py's.
    Cost: one load of the weights and one compile per bucket (:mod:`.compile_cache`)."""
    from .compile_cache import compile_ahead
    from .load import torch_runner_for

    runner = torch_runner_for(read_engine_config(engine_dir), device=device, compile_mode="inductor")
    return compile_ahead(runner, engine_dir)


def measure_for_engine(model: Any, pretrained: dict[str, Any], build: dict[str, Any], device: str) -> dict[str, Any]:
    """``{device type: table}`` for the engine's limits, measured on ``device``."""
    from ..runtime.base import EngineLimits
    from ..runtime.device import resolve_device
    from ..runtime.paged_llama import PagedLlama
    from ..runtime.torch_runner import TorchRunner
    from .step_costs import table_entry

    target = resolve_device(device)
    max_batch_size = int(build["max_batch_size"])
    limits = EngineLimits(
        max_batch_size=max_batch_size,
        max_input_len=int(build["max_input_len"]),
        max_seq_len=int(build["max_seq_len"]),
        max_draft_len=int(build["max_draft_len"]),
        vocab_size=int(pretrained["vocab_size"]),
    )
    max_tokens = max(2, limits.max_draft_len + 1)
    block = int(build["plugin_config"]["tokens_per_block"])
    kv_tokens = 1024 + (max_batch_size + 1) * (max_tokens + block)  # one context, a tail per sequence
    runner = TorchRunner(model if isinstance(model, PagedLlama) else model.to(target), limits, tokens_per_block=block,
                         max_tokens_in_paged_kv_cache=kv_tokens, cuda_graph_mode=False)
    return {target.split(":")[0]: table_entry(runner, max_tokens, max_batch_size=max_batch_size)}
