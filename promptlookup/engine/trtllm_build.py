"""Building a real TensorRT-LLM engine for prompt lookup with ``trtllm-build``.

The command follows TensorRT-LLM's prompt-lookup (NGram V1) example, targeting
TensorRT-LLM 1.0:

    trtllm-build --checkpoint_dir CKPT --output_dir ENGINE \\
        --speculative_decoding_mode draft_tokens_external --max_draft_len K \\
        --use_paged_context_fmha enable \\
        --max_batch_size B --max_input_len I --max_seq_len S --gemm_plugin auto

``draft_tokens_external`` lets the runtime verify drafts made outside the engine;
``--max_draft_len`` must be at least the ``prompt_lookup_num_tokens`` used at run time;
paged context FMHA is what makes KV block reuse possible, and reuse is what makes the
orchestrator's re-submission of whole sequences cheap.

:func:`run_trtllm_build` builds into a hidden sibling directory and renames it into place
only on success (:func:`promptlookup.fsutil.atomic_output_dir`), so a failed or
interrupted build never leaves a half-written engine. Not exercised on a GPU in CI.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence, TextIO

from ..errors import UserError
from ..fsutil import atomic_output_dir
from .config import ENGINE_KIND

TRTLLM_BUILD = "trtllm-build"


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"--{name} must be a positive integer, got {value!r}")


def trtllm_build_command(
    checkpoint_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_draft_len: int,
    gemm_plugin: str = "auto",
    use_paged_context_fmha: bool = True,
    extra: Sequence[str] = (),
    executable: str = TRTLLM_BUILD,
    speculative_decoding_mode: str = "draft_tokens_external",
) -> list[str]:
    """The ``trtllm-build`` argv for a prompt-lookup target engine (pure; runs nothing).

    ``extra`` is appended verbatim, so any other trtllm-build flag can be passed through.
    """
    for name, value in (
        ("max_batch_size", max_batch_size),
        ("max_input_len", max_input_len),
        ("max_seq_len", max_seq_len),
        ("max_draft_len", max_draft_len),
    ):
        _check_positive(name, value)
    if max_input_len > max_seq_len:
        raise UserError(f"--max_input_len {max_input_len} exceeds --max_seq_len {max_seq_len}")
    if not gemm_plugin or not isinstance(gemm_plugin, str) or gemm_plugin.startswith("-"):
        raise UserError(f"--gemm_plugin needs a value such as auto, float16 or disable, got {gemm_plugin!r}")
    return [
        executable,
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--speculative_decoding_mode", speculative_decoding_mode,
        "--max_draft_len", str(max_draft_len),
        "--use_paged_context_fmha", "enable" if use_paged_context_fmha else "disable",
        "--max_batch_size", str(max_batch_size),
        "--max_input_len", str(max_input_len),
        "--max_seq_len", str(max_seq_len),
        "--gemm_plugin", gemm_plugin,
        *map(str, extra),
    ]  # fmt: skip


def run_trtllm_build(
    checkpoint_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_draft_len: int,
    gemm_plugin: str = "auto",
    use_paged_context_fmha: bool = True,
    extra: Sequence[str] = (),
    stream: TextIO | None = None,
    executable: str | None = None,
    require_tensorrt_llm: bool = True,
    speculative_decoding_mode: str = "draft_tokens_external",
) -> Path:
    """Run ``trtllm-build``, copying its output line by line to ``stream`` (default stdout).

    Raises :class:`UserError` when TensorRT-LLM or a suitable GPU is unavailable, when the
    installed release no longer has the engine workflow (1.3 and later), when
    ``trtllm-build`` is not on ``PATH``, when the checkpoint has no ``config.json``, or when
    the build fails. ``executable`` and ``require_tensorrt_llm=False`` exist for tests.
    Returns the engine directory.
    """
    if require_tensorrt_llm:
        from ..runtime.trtllm.env import trtllm_unavailable_reason

        reason = trtllm_unavailable_reason()
        if reason is not None:
            raise UserError(f"cannot build a TensorRT-LLM engine: {reason}")
        from ..runtime.trtllm.releases import installed_release

        installed_release().require("engine_workflow", "building a TensorRT-LLM engine (trtllm-build)")
    exe = executable or shutil.which(TRTLLM_BUILD)
    if exe is None:
        raise UserError(
            f"{TRTLLM_BUILD} is not on PATH; install TensorRT-LLM (it provides {TRTLLM_BUILD}) "
            "or build a PyTorch engine with --backend torch"
        )
    if not (Path(checkpoint_dir) / "config.json").is_file():
        raise UserError(
            f"{checkpoint_dir} has no config.json; convert a checkpoint there first (convert_checkpoint.py)"
        )
    stream = sys.stdout if stream is None else stream
    with atomic_output_dir(output_dir, ENGINE_KIND, inputs=[("--checkpoint_dir", checkpoint_dir)]) as tmp:
        argv = trtllm_build_command(
            checkpoint_dir,
            tmp,
            max_batch_size=max_batch_size,
            max_input_len=max_input_len,
            max_seq_len=max_seq_len,
            max_draft_len=max_draft_len,
            gemm_plugin=gemm_plugin,
            use_paged_context_fmha=use_paged_context_fmha,
            extra=extra,
            speculative_decoding_mode=speculative_decoding_mode,
            executable=exe,
        )
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
        except OSError as exc:
            raise UserError(f"cannot run {exe}: {exc.strerror or exc}") from None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                stream.write(line)
                stream.flush()
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != 0:
            raise UserError(f"{TRTLLM_BUILD} failed with exit code {code} (its output is above)")
        if not (tmp / "config.json").is_file():
            raise UserError(f"{TRTLLM_BUILD} exited cleanly but wrote no config.json")
    return Path(output_dir)


__all__ = ["TRTLLM_BUILD", "run_trtllm_build", "trtllm_build_command"]
