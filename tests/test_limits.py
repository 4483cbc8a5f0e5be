"""The library stays small enough to read in an afternoon: at most 13,040 lines in 60
files, the model core a third of them, no file over 600 lines, no function over 80, no
module docstring over 15 lines, and no machine name, issue number or measured time in its
code (the evidence lives in the docs). Read from the source, so it holds without the lab."""

import ast
import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

LIBRARY = pathlib.Path(__file__).resolve().parents[1] / "jaxformer"
CORE = ("functional", "nn", "models.py", "decode.py")
# Device names used as values: the abstract GPUs the kernels are lowered for.
VALUES = {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}
HISTORY = re.compile(r"H100|H200|A100|EPYC|Xeon|\d-core|issue \d+|\d+(\.\d+)? ?ms\b")


def files() -> dict[pathlib.Path, str]:
    return {p: p.read_text() for p in sorted(LIBRARY.rglob("*.py"))}


def lines(text: str) -> int:
    return len(text.splitlines())


def test_the_library_is_at_most_13040_lines_in_60_files_a_third_of_them_core():
    found = files()
    total = sum(map(lines, found.values()))
    core = sum(lines(t) for p, t in found.items() if p.relative_to(LIBRARY).parts[0] in CORE)
    assert len(found) <= 60 and total <= 13_040, (len(found), total)
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


TRAIN = LIBRARY / "train"


def train_imports() -> dict[str, set[str]]:
    """Each module of train/ and the modules of train/ it imports, wherever the import
    stands (a function's, an annotation's)."""
    graph = {}
    for path in sorted(TRAIN.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {n.split(".")[2] for n in names if n.startswith("jaxformer.train.")}
        graph[path.stem] = found & {p.stem for p in TRAIN.glob("*.py")} - {path.stem}
    return graph


def test_train_is_a_spine_of_at_most_7_floors_3300_lines_and_no_circle():
    graph, floors = train_imports(), {}

    def floor(module, seen=()):
        if module in seen:
            raise AssertionError(f"a circle in train/: {' -> '.join([*seen, module])}")
        if module not in floors:
            floors[module] = 1 + max((floor(m, (*seen, module)) for m in graph[module]), default=0)
        return floors[module]

    assert max(floor(module) for module in graph) <= 7, floors
    total = sum(lines(p.read_text()) for p in TRAIN.glob("*.py"))
    assert total <= 3_300, total


def imports_of(args: list[str], plugins: bool) -> set[str]:
    """The modules that `jaxformer ARGS` has imported when it exits, with the installed
    plugins or none."""
    extensions = "" if plugins else ", extensions=()"
    code = (
        "import json, sys\nfrom jaxformer import cli\n"
        f"try:\n    cli.main(sys.argv[1:]{extensions})\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["generate", "--help"]])
@pytest.mark.parametrize("plugins", [True, False])
def test_the_command_imports_what_it_runs(args, plugins):
    """`jaxformer --help`, `train --help` and `generate --help` import no lab module but
    the one that names the lab's commands, no scipy, and a bounded number of modules
    (docs/architecture.md gives the measured figures; the bound is generous)."""
    modules = imports_of(args, plugins)
    lab = sorted(m for m in modules if m.startswith("jaxformer_lab"))
    with_lab = plugins and importlib.util.find_spec("jaxformer_lab") is not None
    assert lab == (["jaxformer_lab", "jaxformer_lab.plugin"] if with_lab else []), lab
    assert not any(m == "scipy" or m.startswith("scipy.") for m in modules)
    training = [m for m in modules if m.startswith(("jaxformer.train", "jaxformer.data."))]
    assert args[0] == "train" or training in ([], ["jaxformer.data.registry"]), training
    assert len(modules) <= 1200, len(modules)
