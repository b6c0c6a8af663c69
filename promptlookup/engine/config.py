"""The engine directory: what ``build.sh`` writes and the runtimes read.

Layout (PyTorch engine)::

    config.json            {"version", "backend": "torch",
                            "pretrained_config": <the TensorRT-LLM checkpoint config>,
                            "build_config": {max_batch_size, max_input_len, max_seq_len,
                                             max_draft_len, max_beam_width,
                                             speculative_decoding_mode,
                                             plugin_config: {use_paged_context_fmha,
                                                             gemm_plugin, paged_kv_cache,
                                                             tokens_per_block}},
                            "step_costs": {<device type>: {"costs": [...], ...}},  (optional)
                            "compiled": {<device type>: {"backend": "inductor", "torch", "file",
                                                         "buckets", "compile_s", ...}}}  (optional)
    rank{N}.safetensors    the checkpoint's weights (TensorRT-LLM names, any tp/pp)
    tokenizer files        copied from the checkpoint
    compiled/inductor-<device type>.bin
                           torch.compile's cache artifacts (build.sh --torch_compile inductor;
                           engine/compile_cache.py), optional

A TensorRT-LLM engine directory (from the real ``trtllm-build``) has the same top-level
``pretrained_config`` / ``build_config`` keys and ``rank{N}.engine`` files instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..runtime.base import EngineLimits

ENGINE_FORMAT_VERSION = "promptlookup-engine-1"
ENGINE_KIND = "engine"  # the kind in an engine directory's output manifest (promptlookup.fsutil)
COMPILED_KEY = "compiled"  # config.json's entry for the compile caches (engine/compile_cache.py)


@dataclass(frozen=True)
class EngineConfig:
    directory: Path
    backend: str  # "torch" or "trtllm"
    pretrained: dict[str, Any]
    build: dict[str, Any]
    step_costs: dict[str, Any] | None = None  # {device type: {"costs": [...], ...}} (engine/step_costs.py)
    compiled: dict[str, Any] | None = None  # {device type: {"file", "torch", ...}} (engine/compile_cache.py)

    @property
    def limits(self) -> EngineLimits:
        b = self.build
        return EngineLimits(
            max_batch_size=int(b["max_batch_size"]),
            max_input_len=int(b["max_input_len"]),
            max_seq_len=int(b["max_seq_len"]),
            max_draft_len=int(b.get("max_draft_len", 0)),
            vocab_size=int(self.pretrained["vocab_size"]),
        )

    @property
    def tokens_per_block(self) -> int:
        return int(self.build.get("plugin_config", {}).get("tokens_per_block", 32))

    @property
    def world_size(self) -> int:
        m = self.pretrained.get("mapping", {})
        return int(m.get("tp_size", 1)) * int(m.get("pp_size", 1))


def weights_of(pretrained: dict[str, Any]) -> dict[str, Any]:
    """What an engine's weights are, for reports: ``{"weights": "int8" | "int4" | <dtype>,
    "quant_algo": "W8A16" | "W4A16" | "W8A16_GPTQ" | "W4A16_GPTQ" | None, "group_size": int | None}``."""
    from ..checkpoint.config import quant_spec_of

    quant = quant_spec_of(pretrained)
    if quant is None:
        return {"weights": pretrained.get("dtype"), "quant_algo": None, "group_size": None}
    return {"weights": quant.precision, "quant_algo": quant.quant_algo, "group_size": quant.group_size}


def read_engine_config(engine_dir: str | Path) -> EngineConfig:
    """Read and check an engine directory; a missing or incomplete one is a UserError."""
    d = Path(engine_dir)
    if not d.is_dir():
        raise UserError(f"engine directory {d} does not exist; build one with build.sh --checkpoint_dir ... --output_dir {d}")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"engine directory {d} has no config.json; rebuild it with build.sh")
    try:
        raw = json.loads(cfg_path.read_text())
        if isinstance(raw, dict) and "architecture" in raw and "pretrained_config" not in raw:
            raise UserError(f"{d} is a checkpoint (convert_checkpoint.py's output), not an engine; build one from it: "
                            f"./build.sh --checkpoint_dir {d} --output_dir ENGINE_DIR")
        pretrained, build = raw["pretrained_config"], raw["build_config"]
        for key in ("max_batch_size", "max_input_len", "max_seq_len"):
            int(build[key])
        int(pretrained["vocab_size"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{cfg_path} is not an engine config ({exc.__class__.__name__}: {exc}); rebuild it with build.sh") from None
    backend = raw.get("backend") or ("trtllm" if any(d.glob("rank*.engine")) else "torch")
    world = int(pretrained.get("mapping", {}).get("tp_size", 1)) * int(pretrained.get("mapping", {}).get("pp_size", 1))
    suffix = "engine" if backend == "trtllm" else "safetensors"
    missing = [f"rank{r}.{suffix}" for r in range(world) if not (d / f"rank{r}.{suffix}").is_file()]
    if missing:
        raise UserError(f"engine directory {d} is incomplete (missing {', '.join(missing)}); rebuild it with build.sh")
    optional = {key: raw.get(key) if isinstance(raw.get(key), dict) else None for key in ("step_costs", COMPILED_KEY)}
    return EngineConfig(d, backend, pretrained, build, **optional)


def check_end_id(end_id: int, vocab_size: int) -> None:
    """``end_id`` is a token of the engine's vocabulary (else generation could never stop on it)."""
    if not 0 <= end_id < vocab_size:
        raise UserError(f"--end_id {end_id} is outside the engine's vocabulary (0..{vocab_size - 1}); pass a token id "
                        "in that range, or leave --end_id out to use the tokenizer's end-of-sequence token")


def engine_weight_bytes(engine_dir: str | Path) -> int:
    """The bytes of every tensor in the engine's ``rank*.safetensors`` (from the file headers
    alone: O(number of tensors), nothing is loaded)."""
    total = 0
    for path in sorted(Path(engine_dir).glob("rank*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total
