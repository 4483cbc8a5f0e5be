"""How many runs a sweep should train at once on this CPU (`jaxformer bench sweep-jobs
[--config RUN_FILE] [--jobs 2] [--rounds 6] [--steps 10]`): one run on every core against
N runs at once, each pinned to its share of the cores (what `jaxformer sweep --jobs N` does
on a CPU: `jaxformer_lab.cores`), once compiled.

The runs are seeds 0 .. N-1 of the run file (default: `jaxformer train`'s defaults, the
dates task). Each arm is worker processes (`jaxformer_lab.bench.rounds`): one worker on
every core stepping the N runs in turn, and N workers, each pinned to its share of the
cores, stepping one run each at the same time. A round gives each arm --steps steps of
every run (the same batches every round, so that the warm-up round compiles every batch
shape); the speed-up is the one worker's time over the N workers', the median over
rounds with its 95% interval: how many more runs a sweep finishes an hour with --jobs N
than with --jobs 1, compiling aside. N pinned workers hold N copies of a run's data and
training state (docs/training.md, "Runs at once on a CPU").
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import resource
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from jaxformer.checks import BadValue, MissingFile
from jaxformer_lab import cores as cores_lib
from jaxformer_lab.bench import rounds, stats
from jaxformer_lab.bench.host import cpu_name
from jaxformer_lab.bench.registry import BENCHMARKS, Options, beside, say, setting
from jaxformer_lab.results import Record, Table, capture


@dataclass(frozen=True)
class JobsOptions(Options):
    config: str = setting("", "the runs' run file (default: jaxformer train's defaults)")
    jobs: tuple[int, ...] = setting((2,), "the values of N, runs at once (each >= 2)")
    rounds: int = setting(6, "timed rounds (>= 6)")
    steps: int = setting(10, "steps of every run per round")

    def __post_init__(self):
        super().__post_init__()
        if self.rounds < 6 or self.steps < 1:
            raise BadValue(
                f"--rounds must be >= 6 and --steps >= 1, got {self.rounds}, {self.steps}"
            )
        if not self.jobs or min(self.jobs) < 2:
            raise BadValue(f"every --jobs value must be >= 2, got {list(self.jobs)}")
        if self.config and not pathlib.Path(self.config).is_file():
            raise MissingFile(f"--config {self.config}: no such run file")


@BENCHMARKS.register("sweep-jobs", JobsOptions)
def run(options: JobsOptions) -> Record:
    """One run on every core against N runs at once, each on its share of the cores."""
    if cores_lib.shares(max(options.jobs)) is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        raise BadValue(
            f"--jobs {max(options.jobs)}: runs cannot be pinned to cores here ({cores} cores "
            "to pin to; pinning needs Linux and a core for each run)"
        )
    rows = [measure(n, options) for n in options.jobs]
    table = Table(
        caption=f"Seeds 0 .. N-1 of {options.config or 'the default run'}: one worker process "
        "on every core stepping the N runs in turn against N workers at once, each pinned to "
        f"its share of the cores, {options.rounds} rotating rounds of {options.steps} steps "
        "of every run (what varied: the round); the speed-up is the runs finished an hour, "
        f"compiling aside, on {cpu_name()}:",
        columns=["N", "cores each", "one worker s / round [95%]", "N workers s / round"]
        + ["speed-up [95%]", "peak MiB: one worker / N workers"],
        align="rrrrrr",
        rows=[_row(r) for r in rows],
    )
    headline = {f"jobs={r['jobs']}": round(r["speedup"]["median"], 3) for r in rows}
    return capture([table], data={"headline": headline, "rows": rows})


def measure(n: int, options: JobsOptions) -> dict:
    """One row: N runs in one worker on every core against N pinned workers at once."""
    shares = cores_lib.shares(n)
    workers = {"one": _start("one", list(range(n)), None, options)}
    workers |= {f"run{i}": _start(f"run{i}", [i], shares[i], options) for i in range(n)}
    try:
        ready = rounds.ready_all(workers, timeout_s=1800)
        failed = {name: m["error"] for name, m in ready.items() if "error" in m}
        if failed:
            raise RuntimeError(f"workers failed: {failed}")
        say(f"jobs={n}: {len(workers)} workers ready; timing {options.rounds} rounds")
        pinned = [w for name, w in workers.items() if name != "one"]
        with ThreadPoolExecutor(n) as pool:

            def at_once() -> None:
                list(pool.map(lambda w: w.run(options.steps), pinned))

            calls = {"one": lambda: workers["one"].run(options.steps), "at_once": at_once}
            times = stats.time_interleaved(calls, options.rounds, warmup=1)
    finally:
        for w in workers.values():
            w.close()
    return dict(
        jobs=n,
        cores=[sorted(s) for s in shares],
        times=times,  # seconds of each round, one list per arm: entry i is round i
        seconds={m: stats.median_ci(ts) for m, ts in times.items()},
        speedup=stats.paired_ratio(times["one"], times["at_once"]),
        peak_mib={name: round(m["peak_bytes"] / 2**20) for name, m in ready.items()},
    )


def _start(name: str, seeds: list[int], cores: set[int] | None, options: JobsOptions):
    """A worker process for the runs of `seeds` (on `cores` only, if given), its stderr
    in a log next to the record."""
    code = (
        "import sys; from jaxformer_lab.bench import sweep_jobs; sweep_jobs.worker(*sys.argv[1:])"
    )
    command = [sys.executable, "-c", code, options.config, json.dumps(seeds)]
    path = beside(options, f"-{name}.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "w")
    return rounds.Worker(name, command, dict(os.environ), log, cores=cores)


def worker(config: str, seeds: str) -> None:
    """A worker process's side: serve the steps of `seeds` of the run file `config`."""
    rounds.serve(functools.partial(build, config, json.loads(seeds)))


def build(config: str, seeds: list[int]) -> rounds.Program:
    """The runs of `seeds` (set up as `jaxformer train --seed S` would), stepped in turn:
    run(k) takes each run's steps 0 .. k-1 (its batches of those steps); its peak_bytes is
    the process's peak resident memory."""
    import jax

    from jaxformer.train import seed_runs, set_up
    from jaxformer.train.config import load_run

    model, base = load_run(config or None, run={"out": f"{tempfile.gettempdir()}/sweep_jobs"})
    setups = [set_up(model, run) for run in seed_runs(base, seeds)]
    step = jax.jit(setups[0].train_fn, donate_argnums=0)
    states = [s.state for s in setups]
    rows = setups[0].run.optim.batch_size

    def run(k: int) -> float:
        for i in range(k):
            for j, s in enumerate(setups):
                states[j], metrics = step(states[j], s.data.train_batch(i, rows))
        return float(metrics["loss"])

    def peak_bytes() -> int:  # Linux's ru_maxrss is in KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    return rounds.Program(run, setups[0].param_count, {"seeds": seeds}, peak_bytes)


def _row(r: dict) -> list[str]:
    seconds = r["seconds"]
    return [
        str(r["jobs"]),
        str(len(r["cores"][0])),
        _interval(seconds["one"]),
        _interval(seconds["at_once"]),
        _interval(r["speedup"], "x"),
        f"{r['peak_mib']['one']:,} / {sum(v for k, v in r['peak_mib'].items() if k != 'one'):,}",
    ]


def _interval(c: dict, unit: str = "") -> str:
    return f"{c['median']:.2f}{unit} [{c['low']:.2f}, {c['high']:.2f}]"
