"""The size figures of the code that the architecture page quotes: the longest classes and
functions (by lines, read with `ast`) and the lines of the files the redesign names.

    python experiments/code_figures.py [--most 8]

Prints one JSON line: {"longest": [[lines, "path:line kind name"], ...], "lines": {...}}.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "jaxformer"
FILES = ("cli.py", "train/loop.py", "config.py", "interop")


def longest(most: int) -> list[tuple[int, str]]:
    """The `most` longest classes and functions of the package: (lines, where)."""
    rows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                where = f"{path.relative_to(PACKAGE)}:{node.lineno} {kind} {node.name}"
                rows.append((node.end_lineno - node.lineno + 1, where))
    return sorted(rows, reverse=True)[:most]


def lines(name: str) -> int:
    """Lines of a file of the package, or of every .py file in one of its folders."""
    path = PACKAGE / name
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return sum(len(f.read_text().splitlines()) for f in files)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--most", type=int, default=8, help="how many of the longest to list")
    args = parser.parse_args(argv)
    print(json.dumps({"longest": longest(args.most), "lines": {f: lines(f) for f in FILES}}))


if __name__ == "__main__":
    main()
