"""How long a new user's first two commands take (`jaxformer bench first-hour`): a fresh
clone of this checkout's commit, then `make train` and `make test` as the README gives
them, each split into its install and its run, with pip's cache empty (`--pip-cache
cold`, the default: a first machine) or the user's own (`warm`).

Each step runs as the user would run it, from the clone, with an empty compilation cache
and without CI's variables; the machine's load average is sampled every 5 s, since other
jobs on the machine lengthen every figure; NumPy's float32 GEMM rate is measured before
and after, so that a reader can scale the times to a host of their own. The clone and its
environments are removed at the end. The record (docs/results/first_hour.json) is what the
README's times cite (its one-sentence summary).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from jaxformer.checks import BadValue
from jaxformer_lab.bench import load
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

MAKE_SAYS = re.compile(r"make(\[\d+\])?: ")  # make's own lines, not the failing command's
ROOT = pathlib.Path(__file__).resolve().parents[3]  # the checkout this lab runs from
# (name, make target): each install, then what the user asked for.
STEPS = {
    "train": [("install for make train", ".venv/.installed-run"), ("make train", "train")],
    "test": [("install for make test", ".venv/.installed-dev"), ("make test", "test")],
}


@dataclass(frozen=True)
class FirstHourOptions(Options):
    pip_cache: str = setting(
        "cold", "pip's cache: an empty one, or yours", choices=("cold", "warm")
    )
    parts: tuple[str, ...] = setting(("train", "test"), "the commands to time, in order")

    def __post_init__(self):
        super().__post_init__()
        unknown = sorted(set(self.parts) - set(STEPS))
        if unknown or not self.parts:
            raise BadValue(f"--parts {' '.join(unknown)}: choose from {' '.join(STEPS)}")


@BENCHMARKS.register("first-hour", FirstHourOptions)
def run(options: FirstHourOptions) -> Record:
    """`make train` and `make test` from a fresh clone, each install and run timed."""
    commit = _git("rev-parse", "--short", "HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        clone = pathlib.Path(tmp) / "jaxformer"
        say(f"cloning {ROOT} at {commit} into a temporary folder")
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        env = _user_env(pathlib.Path(tmp), options.pip_cache)
        gemm = [gemm_gflops()]
        rows = [timed(name, target, clone, env) for p in options.parts for name, target in STEPS[p]]
        gemm.append(gemm_gflops())
        line = _line(clone)
    headline = {
        p: round(sum(r["wall_s"] for r in rows if r["part"] == p), 1) for p in options.parts
    }
    headline |= {"pip_cache": options.pip_cache, "gemm_gflops": gemm}
    source = f"a fresh clone of jaxformer at commit {commit}, pip's cache {options.pip_cache}"
    table = _table(rows, options.pip_cache)
    table.notes.append(
        f"NumPy's float32 GEMM ({GEMM_N} x {GEMM_N}, best of 5) ran at {gemm[0]:.0f} GFLOP/s "
        f"before the steps and {gemm[1]:.0f} after: on a host of your own, scale the minutes "
        "by the ratio of the rates (the tests are mostly compute-bound; the installs are not)."
    )
    summary = _summary(headline, gemm, line)
    data = {"headline": headline, "steps": rows, "line": line}
    return capture([table], source=source, data=data, summary=summary)


GEMM_N = 1024


def gemm_gflops(n: int = GEMM_N, repeats: int = 5) -> float:
    """This host's float32 GEMM rate by NumPy's BLAS: the best of `repeats` products."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    a @ a  # warm-up: the BLAS's threads and pages
    best = min(_seconds(lambda: a @ a) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _line(clone: pathlib.Path) -> str:
    """The Python and JAX of the environment `make` built in the clone."""
    code = "import sys, jax; print(f'Python {sys.version.split()[0]}, jax {jax.__version__}')"
    python = clone / ".venv" / "bin" / "python"
    if not python.is_file():
        return "an environment that did not start"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or "an environment that did not start"


def _summary(headline: dict, gemm: list[float], line: str) -> str:
    """The record's finding in one sentence: each command's minutes, with the host's rate."""
    took = [f"`make {p}` took {headline[p] / 60:.1f} minutes" for p in STEPS if p in headline]
    return (
        f"From a fresh clone, pip's cache {headline['pip_cache']}, {' and '.join(took)}, "
        f"installs included ({line}), on a host whose NumPy float32 GEMM ran at "
        f"{min(gemm):.0f}-{max(gemm):.0f} GFLOP/s."
    )


def _git(*args: str) -> str:
    """`git ARGS` in the checkout; one line where it is not one (an installed lab)."""
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BadValue(f"first-hour clones the checkout it runs from, and {ROOT} is not one")
    return done.stdout.strip()


def _user_env(tmp: pathlib.Path, pip_cache: str) -> dict[str, str]:
    """This environment less CI's variables and any virtual environment, with an empty
    compilation cache and (cold) an empty pip cache."""
    drop = (
        "CI",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "JAXFORMER_PLUGINS",
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["XDG_CACHE_HOME"] = str(tmp / "cache")
    if pip_cache == "cold":
        env["PIP_CACHE_DIR"] = str(tmp / "pip-cache")
    return env


def timed(name: str, target: str, clone: pathlib.Path, env: dict) -> dict:
    """One `make TARGET` in the clone: its wall seconds and the load average's mean and
    range while it ran; its output in the clone's make-<target>.log (said when it fails)."""
    say(f"{name}: make {target} (minutes)")
    log = clone / f"make-{pathlib.Path(target).name}.log"
    with load.load_averages() as loads, open(log, "w") as out:
        start = time.perf_counter()
        run = subprocess.run(["make", target], cwd=clone, env=env, stdout=out, stderr=out)
        wall = time.perf_counter() - start
    code = run.returncode
    if code != 0:
        said = [line for line in log.read_text().splitlines() if not MAKE_SAYS.match(line)]
        last = said[-1] if said else ""
        failed = "".join(f"\n  {line}" for line in said if line.startswith("FAILED "))
        raise RuntimeError(f"make {target} exited with {code} after {wall:.0f} s: {last}{failed}")
    say(f"  {wall:.0f} s")
    part = next(p for p, steps in STEPS.items() if (name, target) in steps)
    averages = [round(sum(loads) / len(loads), 1), round(min(loads), 1), round(max(loads), 1)]
    return dict(part=part, step=name, target=target, wall_s=round(wall, 1), load=averages)


def _table(rows: list[dict], pip_cache: str) -> Table:
    """A row per step, then each command's total."""
    cells = [[r["step"], f"{r['wall_s'] / 60:.1f}", "{} ({}-{})".format(*r["load"])] for r in rows]
    for part in dict.fromkeys(r["part"] for r in rows):
        total = sum(r["wall_s"] for r in rows if r["part"] == part)
        cells.append([f"**make {part} from a fresh clone**", f"**{total / 60:.1f}**", ""])
    return Table(
        caption=f"A fresh clone's first commands, pip's cache {pip_cache} (minutes):",
        columns=["step", "minutes", "load average (mean, range)"],
        align="lrr",
        rows=cells,
        notes=[
            f"The load average is sampled every 5 s; above {os.cpu_count()} (the cores), more "
            "processes wanted a core than there were: the step's own (make test's workers and "
            "the processes its tests start) or other jobs."
        ],
    )
