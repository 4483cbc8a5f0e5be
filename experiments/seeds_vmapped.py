"""k seeds as one vmapped step against the same k seeds stepped one after another, side by
side in alternating rounds of one process (issue 44, item 2).

    python experiments/seeds_vmapped.py [--tasks dates wyc-web] [--seeds 1 3 8]
                                        [--rounds 8] [--steps 5]
                                        [--out results/seeds_vmapped.json]

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
k times. Writes a results record (`jaxformer.results`) after every row, so that a stopped run
keeps the rows it measured, and prints a JSON line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import jax  # noqa: E402

from jaxformer import results  # noqa: E402
from jaxformer.bench import stats  # noqa: E402
from jaxformer.config import load_run  # noqa: E402
from jaxformer.train import seed_runs, set_up  # noqa: E402
from jaxformer.train import seeds as seed_axis  # noqa: E402

TASKS = {"dates": dict(task="dates"), "wyc-web": dict(dataset="wyc-web")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=["dates", "wyc-web"])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 3, 8], help="values of k")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds (>= 6)")
    p.add_argument("--steps", type=int, default=5, help="steps per program per round")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/seeds_vmapped.json"))
    args = p.parse_args(argv)
    if args.rounds < 6 or args.steps < 1 or min(args.seeds) < 1:
        p.error("--rounds must be >= 6, --steps and every --seeds value >= 1")
    return args


def measure(task: str, k: int, args) -> dict:
    """One row: the vmapped and the one-after-another steps of k seeds of `task`."""
    config, base = load_run(None, run=TASKS[task] | {"out": f"/tmp/seeds_vmapped/{task}"})
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


def record(rows: list[dict], args) -> results.Record:
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
    return results.capture([table], data={"rows": rows})


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


def main(argv=None) -> dict:
    args = parse_args(argv)
    rows = []
    for task in args.tasks:
        for k in args.seeds:
            rows.append(measure(task, k, args))
            print(
                json.dumps({"task": task, "k": k, "speedup": rows[-1]["speedup"]}), file=sys.stderr
            )
            out = record(rows, args)  # after every row: a stopped run keeps what it measured
            out.write(args.out)
    print(out.markdown())
    line = {
        "benchmark": "seeds_vmapped",
        "rows": [
            {"task": r["task"], "k": r["k"], "speedup": round(r["speedup"]["median"], 3)}
            for r in rows
        ],
    }
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
