"""Imports run one way: cli/api/serving -> evaluation -> decoding/engine -> runtime -> drafting/checkpoint.

Every ``import`` in the package (at module level or inside functions) is read from the
source; a lower layer naming a higher one fails, so no cycle can hide behind a lazy import.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "promptlookup"
RANK = {  # a package may import packages of its own rank or lower
    "errors": 0, "literals": 0, "fsutil": 0, "threads": 0, "defaults": 0,
    "drafting": 1, "checkpoint": 1,
    "runtime": 2,
    "decoding": 3, "engine": 3,
    "evaluation": 4,
    "cli": 5, "api": 5, "serving": 5, "hf": 5, "__init__": 6,
}


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


def test_imports_run_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own not in RANK:
            continue
        for pkg in imported_packages(path):
            if pkg in RANK and RANK[pkg] > RANK[own]:
                wrong.append(f"{path.relative_to(PACKAGE)} imports {pkg}")
    assert not wrong, wrong
