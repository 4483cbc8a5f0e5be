"""The library stays small enough to read in an afternoon: at most 13,000 lines in 60
files, the model core a third of them, no file over 600 lines, no function over 80, no
module docstring over 15 lines, and no machine name, issue number or measured time in its
code (the evidence lives in the docs). Read from the source, so it holds without the lab."""

import ast
import pathlib
import re

LIBRARY = pathlib.Path(__file__).resolve().parents[1] / "jaxformer"
CORE = ("functional", "nn", "models.py", "decode.py")
# Device names used as values: the abstract GPUs the kernels are lowered for.
VALUES = {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}
HISTORY = re.compile(r"H100|H200|A100|EPYC|Xeon|\d-core|issue \d+|\d+(\.\d+)? ?ms\b")


def files() -> dict[pathlib.Path, str]:
    return {p: p.read_text() for p in sorted(LIBRARY.rglob("*.py"))}


def lines(text: str) -> int:
    return len(text.splitlines())


def test_the_library_is_at_most_13000_lines_in_60_files_a_third_of_them_core():
    found = files()
    total = sum(map(lines, found.values()))
    core = sum(lines(t) for p, t in found.items() if p.relative_to(LIBRARY).parts[0] in CORE)
    assert len(found) <= 60 and total <= 13_000, (len(found), total)
    assert core / total >= 1 / 3, core / total


def test_no_file_over_600_lines_no_function_over_80_no_module_docstring_over_15():
    long_files, long_functions, long_docs = [], [], []
    for path, text in files().items():
        name = path.relative_to(LIBRARY)
        if lines(text) > 600:
            long_files.append((name, lines(text)))
        tree = ast.parse(text)
        doc = ast.get_docstring(tree, clean=False)
        if doc and lines(doc) > 15:
            long_docs.append((name, lines(doc)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long_functions.append((f"{name}:{node.name}", length))
    assert (long_files, long_functions, long_docs) == ([], [], [])


def test_no_machine_name_issue_number_or_measured_time_in_the_code():
    found = []
    for path, text in files().items():
        for number, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line) and not any(value in line for value in VALUES):
                found.append(f"{path.relative_to(LIBRARY)}:{number}: {line.strip()}")
    assert found == []
