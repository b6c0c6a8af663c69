"""Input-grounded prompts for demos and benchmarks, built from files every machine has.

- *code edits*: a function from the Python standard library's own sources, with an
  instruction to rewrite it (add type hints, add a docstring, rename a variable). The
  answer copies most of the input, which is where prompt lookup shines.
- *summaries*: CNN/DailyMail articles from a local JSONL (``article`` field), when given.

``python -m promptlookup.evaluation.grounded_prompts --kind code --count 2 --output p.json``
writes a JSON list of prompt strings (run.py's ``--input_file`` format).
"""
from __future__ import annotations

import argparse
import ast
import json
import sysconfig
from pathlib import Path

from ..fsutil import atomic_write_json

CODE_TASKS = (
    "Add type hints to this Python function. Reply with the full function only.",
    "Add a docstring to this Python function. Reply with the full function only.",
    "Rewrite this Python function with clearer variable names. Reply with the full function only.",
)
STDLIB_MODULES = ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "heapq.py", "bisect.py", "base64.py",
                  "calendar.py", "difflib.py", "string.py", "statistics.py", "glob.py")


def stdlib_functions(min_lines: int = 12, max_lines: int = 45) -> list[tuple[str, str]]:
    """(qualified name, source) of mid-sized top-level functions, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for name in STDLIB_MODULES:
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if min_lines <= n <= max_lines:
                    found.append((f"{name[:-3]}.{node.name}", ast.get_source_segment(text, node) or ""))
    return found


def code_edit_prompts(count: int) -> list[str]:
    funcs = stdlib_functions()
    prompts = []
    for i in range(min(count, len(funcs))):
        # Spread the picks over the modules rather than taking the first file only.
        _name, src = funcs[(i * 7) % len(funcs)]
        prompts.append(f"{CODE_TASKS[i % len(CODE_TASKS)]}\n\n```python\n{src}\n```")
    return prompts


def summary_prompts(jsonl_path: str | Path, count: int, max_chars: int = 3000) -> list[str]:
    prompts = []
    with open(jsonl_path, encoding="utf-8") as fh:
        for line in fh:
            if len(prompts) >= count:
                break
            article = json.loads(line)["article"][:max_chars]
            prompts.append(f"Summarize the following article in a few sentences.\n\n{article}")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    # A developer helper (the Makefile's demo prompt): the stdlib parser, without prefix matching.
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kind", choices=["code", "summary"], default="code", help="code edits or article summaries")
    p.add_argument("--count", type=int, default=1, help="number of prompts")
    p.add_argument("--dataset_path", default=None, help="CNN/DailyMail JSONL (--kind summary)")
    p.add_argument("--output", required=True, help="JSON file to write the prompts to")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "code":
        prompts = code_edit_prompts(args.count)
    else:
        prompts = summary_prompts(args.dataset_path, args.count)
    atomic_write_json(args.output, prompts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
