"""Imports flow one way through the library, and from the lab to the library, never back;
read from the source with `ast`:

    checks, plugins, signals <- files, data, functional, trackers <- config, accelerators
           <- nn <- models
           <- decode, capture, parallel, interop, plots <- checkpoints <- train <- cli
    jaxformer_lab:  markdown, cores, stops, parts <- results, bible, records, ray_cluster
           <- sweep, aot, train_ray, lm_eval <- bench (ray-sweep times the sweep)
           <- gpu_report
           <- cli <- plugin

A module may import its own room (`jaxformer.train.*` from `jaxformer.train.loop`) and any
room below it, never one above or beside it; the lab may import the library, the library
never the lab. `functional/` imports only itself and the checks (no Flax, optax or orbax);
`nn/` no optax or orbax; no library module imports unittest.mock. Nothing imports another
package's private module (`_name`), nor the test or experiment code."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"jaxformer": ROOT / "jaxformer", "jaxformer_lab": ROOT / "lab" / "jaxformer_lab"}
RANKS = {
    "jaxformer": {
        "checks": 0,
        "plugins": 0,
        "signals": 0,
        "files": 1,
        "data": 1,
        "functional": 1,
        "trackers": 1,
        "config": 2,
        "accelerators": 2,
        "nn": 3,
        "models": 4,
        "decode": 5,
        "capture": 5,
        "plots": 5,
        "parallel": 5,
        "interop": 5,
        "checkpoints": 6,
        "train": 7,
        "cli": 8,
        "__main__": 9,
    },
    "jaxformer_lab": {
        "markdown": 0,
        "cores": 0,
        "stops": 0,
        "parts": 0,
        "results": 1,
        "bible": 1,
        "records": 1,
        "ray_cluster": 1,
        "sweep": 2,
        "aot": 2,
        "train_ray": 2,
        "lm_eval": 2,
        "bench": 3,
        "gpu_report": 4,
        "cli": 5,
        "plugin": 6,
        "__main__": 7,
    },
}
BELOW = {"jaxformer": (), "jaxformer_lab": ("jaxformer",)}  # the packages each may import
FORBIDDEN_LIBRARIES = {
    "checks": {"flax", "optax", "orbax"},
    "cores": {"jax", "flax", "optax", "orbax"},
    "functional": {"flax", "optax", "orbax"},
    "nn": {"optax", "orbax"},
}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p, root): p for root in PACKAGES.values() for p in root.rglob("*.py")}


def imported(source: str, name: str) -> list[str]:
    """The modules (or packages) that module `name` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".")[: -node.level or None]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append(full if full in MODULES else base)
    return found


def room(module: str) -> str:
    """`jaxformer.train.loop` -> "train"; a package itself -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(name: str, source: str) -> list[str]:
    """What module `name` imports against the rules."""
    problems, package = [], name.split(".")[0]
    for target in imported(source, name):
        top = target.split(".")[0]
        if top in FORBIDDEN_LIBRARIES.get(room(name), ()):
            problems.append(f"{name} imports {target} ({room(name)}/ must not use {top})")
        if top in ("tests", "experiments"):
            problems.append(f"{name} imports {target} (the package never imports {top}/)")
        if top not in PACKAGES or room(name) == "":
            continue
        if top != package and top not in BELOW[package]:
            problems.append(f"{name} imports {target}: the library never imports the lab")
            continue
        if room(target) == "":
            problems.append(f"{name} imports the package facade `{top}`; import the module")
            continue
        private = [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
        owner = target.rsplit(".", 1)[0]
        if private and not name.startswith(owner + ".") and name != owner:
            problems.append(f"{name} imports {target}, a private module of another package")
        if top != package:
            continue
        here, there = RANKS[package][room(name)], RANKS[package][room(target)]
        if room(target) != room(name) and there >= here:
            problems.append(f"{name} imports {target}: {room(target)} is not below {room(name)}")
    return problems


def outside_functional(name: str, source: str) -> list[str]:
    """The library modules outside functional/ and the checks that module `name` imports."""
    return [
        t
        for t in imported(source, name)
        if t.split(".")[0] == "jaxformer"
        and not t.startswith(("jaxformer.functional", "jaxformer.checks"))
    ]


def test_functional_imports_only_itself_and_the_checks():
    assert outside_functional("jaxformer.functional.kernels", "from jaxformer import accelerators")
    found = [
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if room(name) == "functional"
        for target in outside_functional(name, path.read_text())
    ]
    assert found == []


def uses_mock(source: str) -> bool:
    """Whether `source` imports unittest.mock (`import unittest.mock`, `from unittest import
    mock`, `from unittest.mock import patch`)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(n == "unittest.mock" or n.startswith("unittest.mock.") for n in names):
            return True
    return False


def test_the_library_patches_nothing_with_unittest_mock():
    assert uses_mock("from unittest import mock") and uses_mock("import unittest.mock as m")
    assert [
        n for n, p in MODULES.items() if n.startswith("jaxformer.") and uses_mock(p.read_text())
    ] == []


def test_every_room_has_a_rank():
    for package, ranks in RANKS.items():
        rooms = {room(m) for m in MODULES if m.split(".")[0] == package} - {""}
        assert rooms == set(ranks), package


def test_imports_flow_one_way():
    problems = [p for name, path in MODULES.items() for p in violations(name, path.read_text())]
    assert problems == []


@pytest.mark.parametrize(
    "name, source, complaint",
    [
        ("jaxformer.parallel.placement", "from jaxformer.train import steps", "train is not below"),
        ("jaxformer.parallel.placement", "import jaxformer.train.loop", "train is not below"),
        ("jaxformer.decode", "from jaxformer.interop.torch import to_torch", "beside"),
        ("jaxformer.models", "from jaxformer.nn._params import param", "private module"),
        ("jaxformer.functional.layers", "from flax import nnx", "must not use flax"),
        ("jaxformer.nn.blocks", "import optax", "must not use optax"),
        ("jaxformer.train.loop", "from experiments import throughput", "never imports"),
        ("jaxformer.models", "import jaxformer as jf", "facade"),
        ("jaxformer.data.tasks", "from . import tokenizers\nfrom ..nn import Embed", "nn is not"),
        (
            "jaxformer.train.report",
            "from jaxformer_lab.results import Table",
            "never imports the lab",
        ),
        ("jaxformer_lab.results", "from jaxformer_lab.sweep import stats", "sweep is not below"),
        ("jaxformer_lab.sweep.runner", "from jaxformer.train._hidden import x", "private module"),
    ],
)
def test_a_forbidden_import_is_caught(name, source, complaint):
    """The checker itself: each of these imports, added to the package, fails the test."""
    found = violations(name, source)
    assert any(complaint.replace("beside", "is not below") in p for p in found), found


def test_the_librarys_tests_import_no_lab_module():
    """A fork of the library keeps tests/ without tests/lab/: its tests never need the lab."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "lab" in path.relative_to(ROOT / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [
                f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("jaxformer_lab")
            ]
    assert found == []
