"""Compile the drafters' C extensions: ``python -m promptlookup.drafting.native.build``.

Every ``<name>.c`` in this folder becomes the extension module ``_<name>`` next to it
(``_<name>`` + the interpreter's ``EXT_SUFFIX``), built with the C compiler Python was
configured with (``CC``, else ``cc``) against this interpreter's headers. Each module is
written to a temporary file and renamed into place, so an interrupted build never leaves
a half-written module. A module already newer than its source is skipped.

With no compiler (or no ``Python.h`` for this interpreter) the build prints one line
saying so and exits 0: the drafters then run
their pure-Python implementations (same drafts, several times the cost per step), and
:func:`promptlookup.drafting.native.implementation` reports which one is in use.
``--strict`` turns a failed build into exit code 2 (used by ``make``); ``--has_compiler``
prints 1 or 0 (``make test`` then requires the C modules to be importable).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CFLAGS = ["-O2", "-std=c11", "-fPIC", "-shared", "-Wall", "-Wextra", "-Wno-unused-parameter"]


def sources() -> list[Path]:
    return sorted(HERE.glob("*.c"))


def module_path(source: Path) -> Path:
    return source.with_name("_" + source.stem + sysconfig.get_config_var("EXT_SUFFIX"))


def compiler() -> list[str] | None:
    """The C compiler command, or ``None`` without one or without this Python's headers."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "") or ["cc"]
    if not shutil.which(cc[0]) or not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return None
    return cc


def build_one(cc: list[str], source: Path) -> None:
    """Compile ``source`` into its module; raises ``RuntimeError`` with the compiler's output."""
    target = module_path(source)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(HERE))
    os.close(fd)
    try:
        cmd = [*cc, *CFLAGS, f"-I{sysconfig.get_paths()['include']}", str(source), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr.strip()}")
        if proc.stderr.strip():
            print(proc.stderr.strip(), file=sys.stderr)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="compile the drafters' C extensions", allow_abbrev=False)
    p.add_argument("--strict", action="store_true", help="exit 2 if a compiler exists but a build fails")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--has_compiler", action="store_true", help="print 1 if a C compiler is available, else 0")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cc = compiler()
    if args.has_compiler:
        print(int(cc is not None))
        return 0
    if cc is None:
        print("note: no C compiler (or no Python.h) found; the drafters will use their pure-Python "
              "implementations (same drafts, slower). Install gcc and the Python headers, then run "
              "`python -m promptlookup.drafting.native.build`.")
        return 0
    for source in sources():
        target = module_path(source)
        if not args.force and target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
            continue
        try:
            build_one(cc, source)
        except RuntimeError as exc:
            print(f"error: building {source.name} failed:\n{exc}", file=sys.stderr)
            if args.strict:
                return 2
            continue
        print(f"built {target.relative_to(HERE.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
