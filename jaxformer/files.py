"""The files of a run and of a results record: each written whole, JSON objects and
metrics lines read back with one-line errors naming the file, and the provenance a record
carries (the command as typed, the device, the package versions, the code's commit)."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import warnings
from typing import Any

from jaxformer.checks import BadValue, InputWarning, MissingFile

# The packages whose versions a record names, when the process has imported them.
VERSIONED = ("jax", "jaxlib", "flax", "optax", "torch", "tokamax", "transformers", "sacrebleu")


def write_whole(path: pathlib.Path, text: str) -> None:
    """Write `text` to `path` so that a killed process leaves the old file or the new one,
    never part of it (a temporary file beside it, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: str | pathlib.Path) -> dict[str, Any]:
    """The JSON object in a file (config.json, summary.json, a record); a missing or
    damaged file is an error naming it. `path` may be a file in an archive (an object with
    pathlib.Path's read_text, such as zipfile.Path)."""
    path = pathlib.Path(path) if isinstance(path, str) else path
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFile(f"{path}: no such file") from None
    except ValueError as e:  # JSON and UTF-8 errors
        raise BadValue(f"{path}: not valid JSON ({e}); the file is damaged") from None
    if not isinstance(value, dict):
        raise BadValue(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, each a JSON object with an integer "step". A torn
    last line (a process killed while appending it) is left out with an InputWarning; a
    bad line elsewhere is an error naming the file and the line; `path` as read_json's."""
    path = pathlib.Path(path) if isinstance(path, str) else path
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            if number == len(lines):  # no newline after it: the append was cut short
                warnings.warn(f"{path}:{number}: left out a torn last line", InputWarning, 2)
                break
            raise BadValue(f"{path}:{number}: not a JSON record ({e})") from None
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            raise BadValue(f"{path}:{number}: a record must be a JSON object with an int 'step'")
        records.append(record)
    return records


def command_line() -> str:
    """This process's command as a user would type it: `jaxformer ...` for the command,
    `python -m MODULE ...` or `python SCRIPT ...` otherwise."""
    script = pathlib.Path(sys.argv[0])
    if script.name in ("jaxformer", "__main__.py") and "jaxformer" in str(script):
        head = ["jaxformer"]
    elif sys.argv[0] == "-m" or not sys.argv[0]:
        head = ["python"]
    else:
        head = ["python", os.path.relpath(script) if script.is_absolute() else str(script)]
    return shlex.join(head + sys.argv[1:])


def describe_device() -> str:
    """The first device JAX sees: its kind, or for a CPU the processor and its cores."""
    import jax

    device = jax.devices()[0]
    if device.platform != "cpu":
        return f"{device.device_kind} ({jax.device_count()} device(s))"
    return f"{_processor()}, {os.cpu_count()} cores ({platform.machine()})"


def _processor() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "a CPU"


def versions() -> dict[str, str]:
    """Python's version and those of the packages in VERSIONED this process has imported."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in VERSIONED:
        if name in sys.modules:
            out[name] = metadata.version(name)
    return out


@functools.cache
def code_version() -> str:
    """ "jaxformer at commit SHA" (with "and uncommitted changes" when the tree differs), or
    the package's version outside a jaxformer checkout (installed, even into a folder that
    another git repository holds). Read once, at the first call (a run's start): a commit
    made while the process runs is not the code it runs."""
    here = pathlib.Path(__file__).resolve().parent
    try:
        if pathlib.Path(_git(here, "rev-parse", "--show-toplevel")).resolve() == here.parent:
            sha = _git(here, "rev-parse", "--short", "HEAD")
            dirty = _git(here, "status", "--porcelain", "--untracked-files=no")
            return f"jaxformer at commit {sha}" + (" and uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        pass
    from importlib import metadata

    return f"jaxformer {metadata.version('jaxformer')}"


def _git(cwd: pathlib.Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()
