"""``pip install`` makes a real package: a fresh virtualenv imports ``promptlookup`` from
outside the checkout and gets the console commands.

Offline and without touching the checkout: the sources are copied to a temporary folder,
built into a wheel there with this environment's setuptools (no build isolation, so no
download), and the wheel is installed with ``--no-deps`` into a new virtualenv. The
commands then run with this environment's packages (torch, transformers) on ``PYTHONPATH``,
which carries no ``.pth`` files, so ``promptlookup`` itself can only come from the wheel.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("pld-convert-checkpoint", "pld-build", "pld-run", "pld-summarize", "pld-serve", "pld-quickstart",
            "pld-ngram-cache", "pld-mlx-decoder")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    shutil.copytree(ROOT / "promptlookup", src / "promptlookup",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.buildhash"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, cwd=tmp)
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    (wheel,) = wheels.glob("promptlookup-*.whl")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, cwd=tmp)
    return env_dir


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # torch & co. from this environment, no .pth files
    env["HOME"] = str(tmp)
    return env


@pytest.mark.slow
def test_a_fresh_virtualenv_imports_the_package_from_outside_the_checkout(installed, tmp_path):
    code = "import promptlookup, promptlookup.api; print(promptlookup.__file__); print(promptlookup.__version__)"
    out = subprocess.run([str(installed / "bin" / "python"), "-c", code], check=True, capture_output=True,
                         text=True, cwd=tmp_path, env=_env(tmp_path)).stdout.split()
    assert Path(out[0]).is_relative_to(installed) and not Path(out[0]).is_relative_to(ROOT)
    import promptlookup

    assert out[1] == promptlookup.__version__
    # the drafters' C sources travel with the package, so it can build them where it is installed
    native = Path(out[0]).parent / "drafting" / "native"
    assert (native / "pool.c").is_file() and (native / "common.h").is_file()


@pytest.mark.slow
def test_the_console_commands_run_the_scripts(installed, tmp_path):
    for command in COMMANDS:
        assert (installed / "bin" / command).is_file(), command
    env = _env(tmp_path)
    got = subprocess.run([str(installed / "bin" / "pld-run"), "--help"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert got.returncode == 0 and "--prompt_lookup_config" in got.stdout
    bad = subprocess.run([str(installed / "bin" / "pld-run"), "--engine_dir", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")
