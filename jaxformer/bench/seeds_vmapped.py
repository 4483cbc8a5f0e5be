"""k seeds as one vmapped step against the same k seeds stepped one after another, side by
side in alternating rounds of one process (`jaxformer bench seeds-vmapped`).

    jaxformer bench seeds-vmapped [--tasks dates wyc-web] [--seeds 1 3 8] [--rounds 8]
                                  [--steps 5] [--out results/seeds-vmapped.json]

For each task (`dates`: make train's model and batch; `wyc-web`: the speedrun's run
defaults, which need the `data` extra) and each k, it builds the k seeds' runs as `jaxformer
train --seeds` would (`train.seed_runs`, each seed's own `set_up`: initialisation, dropout,
data order) and times, per round, the batches of steps 1 .. --steps (the same each round,
so that warm-up compiles every batch shape) through the vmapped step (`jax.vmap` of the
run's train step over the stacked states; the k batches stacked and padded, as
`train_seeds` does each step) and through each seed's own step in turn (one
process's view of k separate runs: one compiled program shared, no k-fold compile). The
speed-up is separate time / vmapped time per round, the median over rounds with its 95%
order-statistic interval (`jaxformer.bench.stats.paired_ratio`): what varied is the round.
Compile seconds and XLA's memory analysis (arguments + temporaries) are reported for the
vmapped step and the one-seed step: k separate processes would compile the one-seed step
k times. The record is written after every row, so that a stopped run keeps the rows it
measured.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import jax

from jaxformer import results
from jaxformer.bench import stats
from jaxformer.bench.registry import BENCHMARKS, Options, command, option, say
from jaxformer.checks import BadValue
from jaxformer.config import load_run
from jaxformer.train import seed_runs, set_up
from jaxformer.train import seeds as seed_axis

TASKS = {"dates": dict(task="dates"), "wyc-web": dict(dataset="wyc-web")}


@dataclass(frozen=True)
class SeedsOptions(Options):
    tasks: tuple[str, ...] = option(
        ("dates", "wyc-web"), "the runs' tasks (wyc-web needs the data extra)", choices=tuple(TASKS)
    )
    seeds: tuple[int, ...] = option((1, 3, 8), "the values of k, seeds in one step")
    rounds: int = option(8, "timed rounds (>= 6)")
    steps: int = option(5, "steps per program per round")

    def __post_init__(self):
        super().__post_init__()
        if self.rounds < 6 or self.steps < 1 or not self.seeds or min(self.seeds) < 1:
            raise BadValue("--rounds must be >= 6, --steps and every --seeds value >= 1")
        unknown = sorted(set(self.tasks) - set(TASKS))
        if not self.tasks or unknown:
            raise BadValue(f"--tasks must be of {tuple(TASKS)}, got {self.tasks}")


@BENCHMARKS.register("seeds-vmapped", SeedsOptions)
def run(options: SeedsOptions) -> results.Record:
    """k seeds as one vmapped step against the k seeds' own steps one after another."""
    rows = []
    for task in options.tasks:
        for k in options.seeds:
            rows.append(measure(task, k, options))
            say(f"{task}, {k} seed(s): {_row(rows[-1])[4]} faster vmapped")
            partial = record(rows, options)  # a stopped run keeps the rows it measured
            partial.command = command("seeds-vmapped", options)
            partial.write(options.record_path())
    headline = {f"{r['task']} k={r['k']}": round(r["speedup"]["median"], 3) for r in rows}
    return record(rows, options, headline)


def measure(task: str, k: int, args: SeedsOptions) -> dict:
    """One row: the vmapped and the one-after-another steps of k seeds of `task`."""
    out = f"{tempfile.gettempdir()}/seeds_vmapped/{task}"  # set_up writes nothing there
    config, base = load_run(None, run=TASKS[task] | {"out": out})
    setups = [set_up(config, run) for run in seed_runs(base, range(k))]
    run, batch_size = setups[0].run, setups[0].run.optim.batch_size
    vmapped = jax.jit(jax.vmap(setups[0].train_fn), donate_argnums=0)
    one = jax.jit(setups[0].train_fn, donate_argnums=0)
    box = {"stacked": seed_axis.stack([s.state for s in setups]), "each": [s.state for s in setups]}

    def batches(step: int) -> list[dict]:
        return [s.data.train_batch(step, batch_size) for s in setups]

    # Every round trains on the batches of steps 0 .. --steps-1 again, so that the warm-up
    # rounds compile every batch shape (translation batches vary in length) for both.
    def run_vmapped():
        for step in range(args.steps):
            box["stacked"], m = vmapped(box["stacked"], seed_axis.stack_batches(batches(step)))
        jax.block_until_ready(m)

    def run_each():
        for step in range(args.steps):
            for i, batch in enumerate(batches(step)):
                box["each"][i], m = one(box["each"][i], batch)
        jax.block_until_ready(m)

    compiled = {
        "vmapped": _compile(vmapped, box["stacked"], seed_axis.stack_batches(batches(0))),
        "one seed": _compile(one, box["each"][0], batches(0)[0]),
    }
    times = stats.time_interleaved({"vmapped": run_vmapped, "each": run_each}, args.rounds)
    return dict(
        task=task,
        k=k,
        steps=run.optim.steps,
        batch_size=batch_size,
        ms_per_step={
            m: stats.median_ci([t / args.steps * 1e3 for t in ts]) for m, ts in times.items()
        },
        speedup=stats.paired_ratio(times["each"], times["vmapped"]),
        compiled=compiled,
    )


def _compile(fn, state, batch) -> dict:
    """Seconds to compile fn for these arguments, and XLA's memory analysis in MiB."""
    started = time.perf_counter()
    compiled = fn.lower(state, batch).compile()
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    mib = None
    if memory is not None:
        mib = (memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 2**20
    return dict(seconds=round(seconds, 2), memory_mib=None if mib is None else round(mib, 1))


def record(rows: list[dict], args: SeedsOptions, headline=None) -> results.Record:
    table = results.Table(
        columns=[
            "task",
            "k",
            "vmapped ms / step [95%]",
            "k one after another",
            "speed-up [95%]",
            "compile s (vmapped / one seed)",
            "MiB (vmapped / one seed)",
        ],
        rows=[_row(r) for r in rows],
        align="lrrrrrr",
        caption=(
            f"k seeds as one vmapped step against the k seeds' own steps one after another, "
            f"{args.rounds} alternating rounds of {args.steps} steps each (what varied: the "
            "round); a step is one optimizer step of all k seeds:"
        ),
        notes=[
            "Separate processes would also compile the one-seed step k times; memory is "
            "XLA's analysis of the compiled step (arguments and temporaries)."
        ],
    )
    data = {"rows": rows} | ({"headline": headline} if headline else {})
    return results.capture([table], data=data)


def _row(r: dict) -> list[str]:
    v, e, s, c = r["ms_per_step"]["vmapped"], r["ms_per_step"]["each"], r["speedup"], r["compiled"]
    return [
        r["task"],
        str(r["k"]),
        f"{v['median']:.1f} [{v['low']:.1f}, {v['high']:.1f}]",
        f"{e['median']:.1f} [{e['low']:.1f}, {e['high']:.1f}]",
        f"{s['median']:.2f}x [{s['low']:.2f}, {s['high']:.2f}]",
        f"{c['vmapped']['seconds']:.1f} / {c['one seed']['seconds']:.1f}",
        f"{c['vmapped']['memory_mib']} / {c['one seed']['memory_mib']}",
    ]
