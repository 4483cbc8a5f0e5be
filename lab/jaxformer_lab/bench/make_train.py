"""How long `make train` takes (`jaxformer bench make-train`): its command (`python -m
jaxformer train --task dates --out DIR`, with the environment already built) as one fresh
process with an empty compilation cache, timed from start to exit, with the machine's load
average sampled every 5 s (on a shared machine other jobs take cores: the load says how
much).

The record (docs/results/make_train.json, rendered in docs/results/training.md): the
in-run held-out exact match, the whole run's and the steps' time, tokens/s, and the load.
One run: its time has no interval (a second fresh run would double the benchmark's time);
the load says how far it is from an idle machine's.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

from jaxformer.files import read_json, read_metrics
from jaxformer_lab.bench import load
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say
from jaxformer_lab.results import Record, Table, capture

COMMAND = ["-m", "jaxformer", "train", "--task", "dates"]  # the Makefile's `train` target


@BENCHMARKS.register("make-train", Options)
def run(options: Options) -> Record:
    """How long `make train` takes: its command as one fresh process, cache empty."""
    with tempfile.TemporaryDirectory() as tmp:
        timed = timed_run(pathlib.Path(tmp))
        tables = [_accuracy(timed["out"]), _time(timed)]
    headline = {"wall_s": round(timed["wall"], 1), "load": round(max(timed["loads"]), 1)}
    source = "the Makefile's command, one fresh process, an empty compilation cache"
    return capture(tables, source=source, data={"headline": headline})


def timed_run(tmp: pathlib.Path) -> dict:
    """Wall and CPU seconds of one run, its load averages, and its run folder."""
    out = tmp / "dates"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= dict(XDG_CACHE_HOME=str(tmp / "cache"))
    say(f"running {' '.join(['python', *COMMAND])} (minutes)")
    command = [sys.executable, *COMMAND, "--out", str(out)]
    with load.load_averages() as loads:
        start = time.perf_counter()
        finished = subprocess.run(command, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if finished.returncode != 0:  # the run's own error, not a bare exit status
        raise RuntimeError(
            f"{' '.join(command)} exited with {finished.returncode}: {finished.stderr[-2000:]}"
        )
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dict(wall=wall, user=usage.ru_utime, system=usage.ru_stime, loads=loads, out=out)


def _accuracy(out: pathlib.Path) -> Table:
    """Held-out exact match at each in-run evaluation and at the end."""
    summary = read_json(out / "summary.json")
    in_run = [
        r
        for r in read_metrics(out / "metrics.jsonl")
        if "exact_match" in r and r["step"] < summary["steps"]
    ]
    rows = [[str(r["step"]), f"{r['exact_match']:.1%}"] for r in in_run]
    final = summary["final_eval"]
    rows.append(
        [
            f"{summary['steps']} (end, all {final['eval_pairs']:,} pairs)",
            f"{final['exact_match']:.1%}",
        ]
    )
    pairs = in_run[0]["eval_pairs"] if in_run else 0
    return Table(
        caption=f"Held-out exact match during the run (greedy; the in-run evaluations decode "
        f"the first {pairs} held-out pairs, the final one all of them):",
        columns=["step", "held-out exact match"],
        align="rr",
        rows=rows,
    )


def _time(timed: dict) -> Table:
    summary = read_json(timed["out"] / "summary.json")
    loads = timed["loads"]
    row = [
        f"{timed['wall']:.0f} s",
        f"{timed['user']:.0f} s + {timed['system']:.0f} s",
        f"{summary['train_seconds']:.0f} s",
        f"{summary['eval_seconds']:.0f} s",
        f"{summary['train_tokens_per_second']:,.0f}",
        f"{sum(loads) / len(loads):.1f} ({min(loads):.1f}-{max(loads):.1f})",
    ]
    return Table(
        caption="Time (one run):",
        columns=[
            "whole process",
            "CPU (user + system)",
            "training steps",
            "evaluations",
            "target tokens / s",
            "load average (mean, range)",
        ],
        align="rrrrrr",
        rows=[row],
        notes=[
            f"The load average is sampled every 5 s during the run; above {os.cpu_count()} "
            "(the cores), other jobs were running beside it and the times are longer than on "
            "an idle machine."
        ],
    )
