"""Imports run one way, and every package (and top-level module) has its own rank.

Top to bottom: cli -> serving -> api -> evaluation -> hf -> decoding -> engine -> runtime
-> drafting -> checkpoint -> the base modules (stream_output, text, defaults, threads,
fsutil, literals, errors). A module may import only what ranks strictly lower than its
own package, so two packages at one level cannot import each other either.

Every ``import`` in the package (at module level or inside functions) is read from the
source; a lower layer naming a higher one fails, so no cycle can hide behind a lazy import.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "promptlookup"
ORDER = [  # top to bottom; a package may import only the packages after it
    "__init__",
    "cli",
    "serving",  # the HTTP app, a client of the API
    "api",  # LLM, configs, the MLX-style decoder
    "evaluation",
    "hf",
    "decoding",  # loops, proposers, scheduler, draft budget
    "engine",
    "runtime",
    "drafting",
    "checkpoint",
    # base modules
    "stream_output",
    "text",
    "defaults",
    "threads",
    "fsutil",
    "literals",
    "errors",
]
RANK = {name: len(ORDER) - i for i, name in enumerate(ORDER)}



def imported_packages(path: Path) -> set[str]:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = parts[: len(parts) - node.level]  # the package of a module (or of an __init__) is parts[:-1]
            target = base + (node.module.split(".") if node.module else [])
            if target:
                found.add(target[0])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.startswith("promptlookup."):
                    found.add(name.split(".")[1])
    return found


def own_package(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_package_has_a_rank():
    unranked = sorted({own_package(p) for p in PACKAGE.rglob("*.py")} - set(RANK))
    assert not unranked, f"give {unranked} a place in ORDER"


def test_imports_run_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = own_package(path)
        rel = path.relative_to(PACKAGE).as_posix()
        for pkg in imported_packages(path):
            if pkg == own or pkg not in RANK:
                continue
            if RANK[pkg] >= RANK.get(own, len(ORDER) + 1):
                wrong.append(f"{rel} imports {pkg}")
    assert not wrong, wrong
