"""Compile the project's C extensions: ``python -m promptlookup.drafting.native.build``.

Every ``<name>.c`` in the folders of :data:`FOLDERS` (the drafters', this one, and the
CPU products', ``promptlookup/runtime/kernels``) becomes the extension module ``_<name>``
next to it (``_<name>`` + the interpreter's ``EXT_SUFFIX``), built with the C compiler
Python was configured with (``CC``, else ``cc``) against this interpreter's headers, with
the folder's own extra flags (the kernels: ``-O3 -ffp-contract=off -fopenmp``; where the
compiler has no OpenMP, the kernels are built once more without it, single-threaded). Each module is
written to a temporary file and renamed into place, so an interrupted build never leaves
a half-written module.

A module is up to date when the stamp beside it (``<module>.buildhash``) holds the hash
of everything that went into it: the compiler command and flags, this interpreter's
include directory, the source, the shared header ``common.h`` and the headers beside the
source (the kernels' ``cpu_kernels.h``). So a change of flags or
compiler rebuilds it, not only a newer source file.

The link flags depend on the platform (``-shared`` on Linux; ``-bundle -undefined
dynamic_lookup`` on macOS, where extensions resolve Python's symbols at load time). Before
building, a one-line probe extension is compiled and linked with each candidate set; the
first that works is used. Where none does (or there is no compiler, or no ``Python.h``)
the build prints one line saying so and exits 0: the drafters then run their pure-Python
implementations (same drafts, several times the cost per step), and
:func:`promptlookup.drafting.native.implementation` reports which one is in use.
``--strict`` turns a failed build of a module (the toolchain works, the source does not
compile) into exit code 2, as ``make`` uses it; ``--has_compiler`` prints 1 when a working
toolchain exists, else 0 (``make test`` then requires the C modules to be importable).

``--sanitize DIR`` builds instrumented copies (``-fsanitize=address,undefined``) into
``DIR`` for ``make test-asan`` (see ``tests/drafting/asan.py``); it leaves the normal
modules alone.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent.parent / "runtime" / "kernels"


class Folder(NamedTuple):
    """A folder of C sources: its extra compiler flag sets (best first; the first that
    builds is used) and what runs instead when a module of it is not built."""

    flag_sets: tuple[tuple[str, ...], ...]
    fallback: str


FOLDERS = {
    HERE: Folder(((),), "the drafters use their pure-Python twin for it"),
    # -fopenmp links libgomp.so.1, the soname of the libgomp torch loads: one OpenMP runtime
    KERNELS: Folder((("-O3", "-ffp-contract=off", "-fopenmp"), ("-O3", "-ffp-contract=off")),
                    "the CPU products use PyTorch for it"),
}
HEADERS = ("common.h",)
CFLAGS = ["-O2", "-std=c11", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter"]
SANITIZE_CFLAGS = ["-O1", "-g", "-std=c11", "-fPIC", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                   "-fno-sanitize-recover=undefined"]
STAMP_SUFFIX = ".buildhash"
_PROBE = """#include <Python.h>
static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "_probe", NULL, -1, NULL, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__probe(void) { return PyModule_Create(&probe); }
"""


def sources(folders: tuple[Path, ...] | None = None) -> list[Path]:
    """The C sources of ``folders`` (default: every folder of :data:`FOLDERS`)."""
    return [s for folder in (folders or tuple(FOLDERS)) for s in sorted(folder.glob("*.c"))]


def folder(source: Path) -> Folder:
    """``source``'s folder settings (the drafters' for a source outside :data:`FOLDERS`)."""
    return FOLDERS.get(source.parent, FOLDERS[HERE])


def module_path(source: Path, directory: Path | None = None) -> Path:
    name = "_" + source.stem + sysconfig.get_config_var("EXT_SUFFIX")
    return (directory or source.parent) / name


def stamp_path(target: Path) -> Path:
    return target.with_name(target.name + STAMP_SUFFIX)


def include_dir() -> str:
    return sysconfig.get_paths()["include"]


def compiler() -> list[str] | None:
    """The C compiler command, or ``None`` without one or without this Python's headers."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "") or ["cc"]
    if not shutil.which(cc[0]) or not (Path(include_dir()) / "Python.h").is_file():
        return None
    return cc


def link_flag_candidates(platform: str | None = None) -> list[list[str]]:
    """Link flags to try, best first, for ``platform`` (default: this one)."""
    platform = platform or sys.platform
    if platform == "darwin":
        return [["-bundle", "-undefined", "dynamic_lookup"], ["-shared", "-undefined", "dynamic_lookup"]]
    return [["-shared"]]


def _compile(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no output")


@functools.lru_cache(maxsize=None)
def _toolchain(cc: tuple[str, ...], platform: str) -> tuple[tuple[str, ...] | None, str]:
    """The first link flags with which a probe extension builds, or (None, why not)."""
    why = ""
    with tempfile.TemporaryDirectory(prefix="pld-probe-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(_PROBE)
        for flags in link_flag_candidates(platform):
            cmd = [*cc, *CFLAGS, *flags, f"-I{include_dir()}", str(src), "-o", str(Path(tmp) / "_probe.so")]
            proc = _compile(cmd)
            if proc.returncode == 0:
                return tuple(flags), ""
            why = first_line(proc.stderr or proc.stdout)
    return None, why


def toolchain() -> tuple[list[str], list[str]] | None:
    """``(compiler, link flags)`` that build an extension here, or ``None``."""
    cc = compiler()
    if cc is None:
        return None
    flags, _ = _toolchain(tuple(cc), sys.platform)
    return None if flags is None else (cc, list(flags))


def build_hash(command: list[str], source: Path) -> str:
    """What a module depends on: the command (compiler, flags, include dir) and the sources."""
    h = hashlib.sha256("\0".join(command).encode())
    headers = [HERE / name for name in HEADERS] + sorted(source.parent.glob("*.h"))
    for path in (source, *dict.fromkeys(headers)):  # the shared header, and any beside the source
        h.update(b"\0" + path.name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"")
    return h.hexdigest()


def _command(cc: list[str], cflags: list[str], link: list[str], source: Path) -> list[str]:
    return [*cc, *cflags, *link, f"-I{include_dir()}", f"-I{HERE}", str(source)]


def up_to_date(cc: list[str], link: list[str], source: Path, cflags: list[str] = CFLAGS) -> bool:
    """Whether ``source``'s module was built from this source with ``cflags`` plus one of its
    folder's flag sets."""
    target = module_path(source)
    stamp = stamp_path(target)
    if not (target.is_file() and stamp.is_file()):
        return False
    built = stamp.read_text().strip()
    return any(built == build_hash(_command(cc, [*cflags, *extra], link, source), source)
               for extra in folder(source).flag_sets)


def build_best(cc: list[str], source: Path, link: list[str] | None = None) -> Path:
    """:func:`build_one` with the first of the folder's flag sets that builds; raises the
    first set's ``RuntimeError`` when none does."""
    first: RuntimeError | None = None
    for extra in folder(source).flag_sets:
        try:
            return build_one(cc, source, link, cflags=[*CFLAGS, *extra])
        except RuntimeError as exc:
            first = first or exc
    assert first is not None
    raise first


def build_one(
    cc: list[str], source: Path, link: list[str] | None = None, *, cflags: list[str] = CFLAGS,
    directory: Path | None = None,
) -> Path:
    """Compile ``source`` into its module; raises ``RuntimeError`` with the compiler's output.

    The module and its stamp are each written to a temporary file and renamed into place.
    """
    link = link_flag_candidates()[0] if link is None else link
    target = module_path(source, directory)
    command = _command(cc, cflags, link, source)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent))
    os.close(fd)
    try:
        proc = _compile([*command, "-o", tmp])
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}\n{proc.stderr.strip()}")
        if proc.stderr.strip():
            print(proc.stderr.strip(), file=sys.stderr)
        os.chmod(tmp, 0o755)
        stamp = stamp_path(target)
        stamp_tmp = stamp.with_name(f".{stamp.name}.tmp")
        stamp_tmp.write_text(build_hash(command, source) + "\n")
        os.replace(tmp, target)
        os.replace(stamp_tmp, stamp)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="compile the project's C extensions (drafters, CPU kernels)", allow_abbrev=False)
    p.add_argument("--strict", action="store_true", help="exit 2 if the toolchain works but a module fails to build")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--has_compiler", action="store_true",
                   help="print 1 if a C compiler that can build extensions here is available, else 0")
    p.add_argument("--sanitize", metavar="DIR", help="build AddressSanitizer/UBSan copies into DIR (tests only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chain = toolchain()
    if args.has_compiler:
        print(int(chain is not None))
        return 0
    if chain is None:
        cc = compiler()
        if cc is None:
            why = "no C compiler (or no Python.h) found"
        else:
            why = f"{shlex.join(cc)} cannot link a Python extension here ({_toolchain(tuple(cc), sys.platform)[1]})"
        print(f"note: {why}; the drafters will use their pure-Python implementations (same drafts, slower) "
              "and the CPU products PyTorch's. "
              "Install gcc and the Python headers, then run `python -m promptlookup.drafting.native.build`.")
        return 0
    cc, link = chain
    if args.sanitize:
        out = Path(args.sanitize)
        out.mkdir(parents=True, exist_ok=True)
        for source in sources((HERE,)):  # the drafters' misuse tests run against these
            try:
                print(f"built {build_one(cc, source, link, cflags=SANITIZE_CFLAGS, directory=out)}")
            except RuntimeError as exc:
                print(f"error: building {source.name} with sanitizers failed: {first_line(str(exc).split(chr(10), 1)[-1])}",
                      file=sys.stderr)
                return 2
        return 0
    stale = [source for source in sources() if args.force or not up_to_date(cc, link, source)]
    # one compiler per CPU (each module's build is one process); reported in source order
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(stale), os.cpu_count() or 1))) as pool:
        builds = [pool.submit(build_best, cc, source, link) for source in stale]
    for source, build in zip(stale, builds):
        try:
            target = build.result()
        except RuntimeError as exc:
            detail = str(exc).split("\n", 1)[-1]
            print(f"error: building {source.name} failed ({first_line(detail)}); {folder(source).fallback}",
                  file=sys.stderr)
            if args.strict:
                print(str(exc), file=sys.stderr)
                return 2
            continue
        print(f"built {target.relative_to(HERE.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
