"""Tests of the benchmark scripts in bench/ (loaded from their files: bench/ is no package)."""
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str) -> ModuleType:
    """The script ``bench/{name}.py`` as a module (registered in ``sys.modules``, as its
    dataclasses need; loaded once)."""
    key = f"bench_scripts.{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
