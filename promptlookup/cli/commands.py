"""The console commands ``pip install`` creates (``pyproject.toml``'s ``[project.scripts]``).

Each runs the same ``main`` as its top-level script (``run.py``, ``build.sh``, ...) through
:func:`~promptlookup.errors.run_cli`, so exit codes and one-line errors are the scripts'.
Imports happen inside each command: one command loads only what it needs.
"""
from __future__ import annotations

from typing import NoReturn

from ..errors import run_cli


def convert_checkpoint() -> NoReturn:
    """``pld-convert-checkpoint`` = ``python convert_checkpoint.py``."""
    from .convert import main

    run_cli(main)


def build() -> NoReturn:
    """``pld-build`` = ``./build.sh`` (trtllm-build's flags)."""
    from .build import main

    run_cli(main)


def run() -> NoReturn:
    """``pld-run`` = ``python run.py``."""
    from .run import main

    run_cli(main)


def summarize() -> NoReturn:
    """``pld-summarize`` = ``python summarize.py``."""
    from .summarize import main

    run_cli(main)


def serve() -> NoReturn:
    """``pld-serve`` = ``python serve.py`` (needs the ``serve`` extra)."""
    from .serve import main

    run_cli(main)


def quickstart() -> NoReturn:
    """``pld-quickstart`` = ``python quickstart_advanced.py``."""
    from .quickstart import main

    run_cli(main)


def ngram_cache() -> NoReturn:
    """``pld-ngram-cache`` = ``python -m promptlookup.cli.ngram_cache``."""
    from .ngram_cache import main

    run_cli(main)


def mlx_decoder() -> NoReturn:
    """``pld-mlx-decoder`` = ``python -m promptlookup.cli.mlx_decoder`` (MLX's prompt-lookup example's flags)."""
    from .mlx_decoder import main

    run_cli(main)
