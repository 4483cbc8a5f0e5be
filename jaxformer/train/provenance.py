"""Where a result comes from: the command as typed, the device, the versions of the
packages that made it, and the code's commit. A run's summary records them, and so does
every results record of the lab."""

from __future__ import annotations

import functools
import os
import pathlib
import platform
import shlex
import subprocess
import sys

VERSIONED = ("jax", "jaxlib", "flax", "optax", "torch", "tokamax", "transformers", "sacrebleu")


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
    here = pathlib.Path(__file__).resolve().parents[1]
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
