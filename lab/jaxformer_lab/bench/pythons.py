"""The other Python environments a benchmark may run programs in: the interpreter that
runs torch where this one has none (`--torch-python`), and the JAX lines to compare.

They are found as `.venv*/bin/python` in three folders, in this order, each's sorted by
name: the checkout's root (the folder holding `jaxformer/` and `lab/`, when the lab runs
from a checkout), the working directory, and the folder holding this interpreter's
environment. `describe` asks an interpreter its versions (Python, jax, jaxlib, numpy,
torch) in a subprocess, without importing any of them. A worker started in another
interpreter imports this process's jaxformer and lab (`worker_env`), so the code timed is
the code of this checkout whatever the environment installed.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

from jaxformer import checks
from jaxformer.checks import MissingFile, MissingPackage

LAB = pathlib.Path(__file__).resolve().parents[2]  # the folder holding jaxformer_lab

_ASK = """\
import importlib.metadata as m, importlib.util as u, json, platform, sys
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
out = {n: v(n) for n in ("jax", "jaxlib", "numpy", "torch", "flax")}
out["torch"] = out["torch"] if u.find_spec("torch") else None
print(json.dumps(out | {"python": platform.python_version(), "prefix": sys.prefix}))
"""


def search_folders() -> list[pathlib.Path]:
    """Where environments are looked for (see the module doc), without repeats."""
    root = LAB.parent
    checkout = [root] if (root / "jaxformer").is_dir() and (root / "lab").is_dir() else []
    folders = [*checkout, pathlib.Path.cwd(), pathlib.Path(sys.prefix).absolute().parent]
    return list(dict.fromkeys(pathlib.Path(os.path.abspath(f)) for f in folders))


def candidates() -> list[str]:
    """Every `.venv*/bin/python` in the search folders, in their order (see the module
    doc), this interpreter's environment left out."""
    mine = os.path.abspath(sys.prefix)
    found = []
    for folder in search_folders():
        for python in sorted(folder.glob(".venv*/bin/python")):
            if os.path.abspath(python.parent.parent) != mine:
                found.append(os.path.abspath(python))
    return list(dict.fromkeys(found))


@functools.cache
def describe(python: str) -> dict:
    """{path, python, prefix, jax, jaxlib, numpy, torch, flax} of an interpreter (a
    package it lacks: None); MissingFile where it is not an interpreter that runs."""
    if not os.path.isfile(python):
        raise MissingFile(f"{python}: no such interpreter")
    try:
        done = subprocess.run(
            [python, "-c", _ASK], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise MissingFile(f"{python} does not run as a Python interpreter ({e})") from None
    return {"path": python} | json.loads(done.stdout.strip().splitlines()[-1])


def torch_python(given: str = "") -> dict | None:
    """The interpreter that runs torch (its `describe`): `given` (it must import torch), or
    by default this one if it has torch, else the first found (`candidates`) that has;
    None where there is none."""
    if given:
        info = describe(os.path.abspath(given))
        if info["torch"] is None:
            raise MissingPackage(
                f"--torch-python {given} (Python {info['python']}) has no torch: give an "
                "interpreter whose environment has it, e.g. .venv-3.11/bin/python"
            )
        return info
    for python in [sys.executable, *candidates()]:
        info = describe(python)
        if info["torch"] is not None:
            return info
    return None


def no_torch_found() -> str:
    """The one line that says no interpreter with torch was found, and where it looked."""
    where = ", ".join(str(f) for f in search_folders())
    return (
        f"no Python with torch: this one ({sys.executable}) has none, nor any .venv*/bin/"
        f"python in {where}; give one with --torch-python"
    )


def jax_lines(given: tuple[str, ...] = ()) -> list[dict]:
    """The JAX lines to compare (each interpreter's `describe`): the `given` interpreters
    (each must have JAX), or this interpreter and each found (`candidates`) whose JAX
    version differs from those before it: of one version, the newest Python, then the
    first found."""
    if given:
        lines = [describe(os.path.abspath(p)) for p in given]
        for info in lines:
            if info["jax"] is None:
                raise MissingPackage(f"{info['path']} (Python {info['python']}) has no JAX")
        return lines
    found = [describe(sys.executable)]
    others = [describe(p) for p in candidates()]
    others = sorted(
        (i for i in others if i["jax"]), key=lambda i: _version(i["python"]), reverse=True
    )
    for info in others:  # the newest Python first; of equals, the first found
        if info["jax"] not in {line["jax"] for line in found}:
            found.append(info)
    return found


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment with this jaxformer and lab first on PYTHONPATH (a worker
    in another interpreter runs the same code), less the variables that point into this
    interpreter's environment (JAX sets TPU_LIBRARY_PATH to its libtpu, which another JAX's
    profiler would load), and `extra`."""
    paths = [pathlib.Path(checks.__file__).resolve().parents[1], LAB]
    old = os.environ.get("PYTHONPATH", "")
    path = os.pathsep.join(dict.fromkeys([*map(str, paths), *filter(None, old.split(os.pathsep))]))
    env = {}
    for name, value in os.environ.items():
        kept = [p for p in value.split(os.pathsep) if not _mine(p)]
        if kept:
            env[name] = value if len(kept) == value.count(os.pathsep) + 1 else os.pathsep.join(kept)
    return env | {"PYTHONPATH": path} | extra


def _mine(path: str) -> bool:
    """Whether `path` lies in this interpreter's environment."""
    return path.startswith(os.path.join(os.path.abspath(sys.prefix), ""))


def check_python(flag: str, python: str) -> None:
    """Refuse (one line) a path given for `flag` that is not a file."""
    if python and not os.path.isfile(python):
        raise MissingFile(f"{flag} {python}: no such file")
