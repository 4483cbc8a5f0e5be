"""How long `make train` takes: its command (`python -m jaxformer train --task dates --out
DIR`, with .venv already built) as one fresh process with an empty compilation cache,
timed from start to exit, with the machine's load average sampled every 5 s (on a
shared machine other jobs take cores: the load says how much).

    python experiments/make_train_time.py [--out results/make_train.json] [--note TEXT]

Writes a results file in the docs' format (docs/results/make_train.json renders it): the
in-run held-out exact match, the whole run's and the steps' time, tokens/s, and the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from jaxformer.train.run_folder import read_json, read_metrics  # noqa: E402

COMMAND = ["-m", "jaxformer", "train", "--task", "dates"]  # the Makefile's `train` target


def timed_run(tmp: pathlib.Path) -> dict:
    """Wall and CPU seconds of one run, its load averages, and its run folder."""
    out = tmp / "dates"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= dict(XDG_CACHE_HOME=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    loads, done = [os.getloadavg()[0]], threading.Event()

    def sample():
        while not done.wait(5.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *COMMAND, "--out", str(out)], env=env, check=True, capture_output=True
    )
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dict(wall=wall, user=usage.ru_utime, system=usage.ru_stime, loads=loads, out=out)


def result(run: dict, note: str) -> dict:
    """The docs' results file of a timed run."""
    summary = read_json(run["out"] / "summary.json")
    records = read_metrics(run["out"] / "metrics.jsonl")
    in_run = [r for r in records if "exact_match" in r and r["step"] < summary["steps"]]
    rows = [[str(r["step"]), f"{r['exact_match']:.1%}"] for r in in_run]
    final = summary["final_eval"]
    rows.append(
        [
            f"{summary['steps']} (end, all {final['eval_pairs']:,} pairs)",
            f"{final['exact_match']:.1%}",
        ]
    )
    loads = run["loads"]
    mean_load = sum(loads) / len(loads)
    time_row = [
        f"{run['wall']:.0f} s",
        f"{run['user']:.0f} s + {run['system']:.0f} s",
        f"{summary['train_seconds']:.0f} s",
        f"{summary['eval_seconds']:.0f} s",
        f"{summary['train_tokens_per_second']:,.0f}",
        f"{mean_load:.1f} ({min(loads):.1f}-{max(loads):.1f})",
    ]
    pairs = in_run[0]["eval_pairs"] if in_run else 0
    return {
        "command": "make train",
        "device": f"{_processor()}, {os.cpu_count()} CPU cores, "
        f"shared with other jobs{'; ' + note if note else ''}",
        "versions": {"jax": jax.__version__, "python": platform.python_version()},
        "date": datetime.date.today().isoformat(),
        "source": "`python experiments/make_train_time.py`: the Makefile's command with .venv "
        "built, one fresh process, an empty compilation cache",
        "tables": [
            {
                "caption": f"Held-out exact match during the run (greedy; the in-run evaluations "
                f"decode the first {pairs} held-out pairs, the final one all of them):",
                "columns": ["step", "held-out exact match"],
                "align": "rr",
                "rows": rows,
            },
            {
                "caption": "Time:",
                "columns": [
                    "whole process",
                    "CPU (user + system)",
                    "training steps",
                    "evaluations",
                    "target tokens / s",
                    "load average (mean, range)",
                ],
                "align": "rrrrrr",
                "rows": [time_row],
                "notes": [
                    "The load average is sampled every 5 s during the run; above 2 (the "
                    "cores), other jobs were running beside it and the times are longer than "
                    "on an idle machine."
                ],
            },
        ],
    }


def _processor() -> str:
    """The CPU's model name (Linux), else the machine type."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/make_train.json")
    parser.add_argument("--note", default="", help="what the device line should add")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measured = result(timed_run(pathlib.Path(tmp)), args.note)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(measured, indent=2) + "\n")
    print(json.dumps(measured["tables"][1]["rows"][0]))


if __name__ == "__main__":
    main()
