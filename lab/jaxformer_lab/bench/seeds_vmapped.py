"""k seeds as one vmapped step against the same k seeds stepped one after another, side by
side in alternating rounds of one process (`jaxformer bench seeds-vmapped [--tasks dates
wyc-web] [--seeds 1 3 8] [--rounds 8] [--steps 5] ...`).

For each task (`dates`: make train's model and batch; `wyc-web`: the speedrun's run
defaults, which need the `data` extra) and each k, it builds the k seeds' runs as
`jaxformer train --seeds` would (`train.seed_runs`) and times, per round, the same
batches of steps 1 .. --steps through the vmapped step (`jax.vmap` over the stacked
states and batches, as `train_seeds` steps), the mapped step (`jax.lax.map`: one seed at
a time inside one program) and each seed's own step in turn. A speed-up is separate time
/ the program's, the median over rounds with its 95% interval (`stats.paired_ratio`).
--processes, --shared-lengths and --decode add whole runs as processes, one order of
lengths for every seed, and decoding; the record is written after every row, so that a
stopped run keeps what it measured. The method in full: docs/training.md, "Several seeds
as one program"."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import jax
from flax import nnx

from jaxformer import decode
from jaxformer.checks import BadValue
from jaxformer.train import seed_runs, set_up
from jaxformer.train import seeds as seed_axis
from jaxformer.train.config import load_run
from jaxformer.train.evaluate import EvalSettings, translate
from jaxformer_lab import results
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, command, say, setting

TASKS = {"dates": dict(task="dates"), "wyc-web": dict(dataset="wyc-web")}
TRAIN = [sys.executable, "-m", "jaxformer", "train", "--no-progress", "--eval-examples", "32"]
SPEEDUPS = {"vmapped": "speedup", "mapped": "mapped_speedup"}  # each over k steps apart


@dataclass(frozen=True)
class SeedsOptions(Options):
    tasks: tuple[str, ...] = setting(
        ("dates", "wyc-web"), "the runs' tasks (wyc-web needs the data extra)", choices=tuple(TASKS)
    )
    seeds: tuple[int, ...] = setting((1, 3, 8), "the values of k, seeds in one step")
    rounds: int = setting(8, "timed rounds (>= 6)")
    steps: int = setting(5, "steps per program per round")
    processes: int = setting(
        0,
        "also time whole runs of --steps steps, this many rounds (>= 6; 0: not): one "
        "`train --seeds` process (the seeds stepped in turn) against k `train` processes",
    )
    shared_lengths: bool = setting(
        False,
        "the runs' translation batches in one order of lengths for every seed (the run "
        "option shared_lengths), so that the stacked batches pad little",
    )
    decode: int = setting(
        0,
        "also time decoding the first N dev sources with the final evaluation's settings, "
        "for k > 1: the k seeds in one vmapped program against one after another (0: not)",
    )

    def __post_init__(self):
        super().__post_init__()
        if self.rounds < 6 or self.steps < 1 or not self.seeds or min(self.seeds) < 1:
            raise BadValue("--rounds must be >= 6, --steps and every --seeds value >= 1")
        if not isinstance(self.decode, int) or self.decode < 0:
            raise BadValue(f"--decode must be an int >= 0, got {self.decode}")
        if self.processes and self.processes < 6:
            raise BadValue(f"--processes must be 0 or >= 6, got {self.processes}")
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
            speedups = {m: rows[-1][key]["median"] for m, key in SPEEDUPS.items()}
            say(f"{task}, {k} seed(s): " + ", ".join(f"{m} {v:.2f}x" for m, v in speedups.items()))
            partial = record(rows, options)  # a stopped run keeps the rows it measured
            partial.command = command("seeds-vmapped", options)
            partial.write(options.record_path())
    headline = {
        f"{r['task']} k={r['k']} {mode}": round(r[key]["median"], 3)
        for r in rows
        for mode, key in SPEEDUPS.items()
    }
    headline |= {
        f"{r['task']} k={r['k']} decode": round(r["decode"]["speedup"]["median"], 3)
        for r in rows
        if "decode" in r
    }
    return record(rows, options, headline)


def measure(task: str, k: int, args: SeedsOptions) -> dict:
    """One row: the vmapped and the one-after-another steps of k seeds of `task`."""
    out = f"{tempfile.gettempdir()}/seeds_vmapped/{task}"  # set_up writes nothing there
    config, base = load_run(None, run=_run_fields(task, args) | {"out": out})
    setups = [set_up(config, run) for run in seed_runs(base, range(k))]
    run, batch_size = setups[0].run, setups[0].run.optim.batch_size
    programs = {
        "vmapped": jax.jit(seed_axis.seed_step(setups[0].train_fn), donate_argnums=0),
        "mapped": jax.jit(seed_axis.seed_step(setups[0].train_fn, 1), donate_argnums=0),
    }
    one = jax.jit(setups[0].train_fn, donate_argnums=0)
    box = {m: seed_axis.stack([s.state for s in setups]) for m in programs}
    box["each"] = [s.state for s in setups]

    def batches(step: int) -> list[dict]:
        return [s.data.train_batch(step, batch_size) for s in setups]

    # Every round trains on the batches of steps 0 .. --steps-1 again, so that the warm-up
    # rounds compile every batch shape (translation batches vary in length) for both.
    def run_stacked(mode: str) -> None:
        for step in range(args.steps):
            stacked = seed_axis.stack_batches(batches(step))
            box[mode], m = programs[mode](box[mode], stacked)
        jax.block_until_ready((box[mode], m))

    def run_each():
        for step in range(args.steps):
            for i, batch in enumerate(batches(step)):
                box["each"][i], m = one(box["each"][i], batch)
        jax.block_until_ready((box["each"], m))  # every seed's step, not only the last's

    first = seed_axis.stack_batches(batches(0))
    compiled = {m: _compile(fn, box[m], first) for m, fn in programs.items()}
    compiled["one seed"] = _compile(one, box["each"][0], batches(0)[0])
    calls = {m: (lambda m=m: run_stacked(m)) for m in programs} | {"each": run_each}
    times = stats.time_interleaved(calls, args.rounds)
    timed = [batches(step) for step in range(args.steps)]
    positions = {
        "stacked": sum(
            k * max(b["src"].shape[1] + b["tgt_in"].shape[1] for b in bs) for bs in timed
        ),
        "apart": sum(b["src"].shape[1] + b["tgt_in"].shape[1] for bs in timed for b in bs),
    }
    return (
        dict(
            task=task,
            k=k,
            steps=run.optim.steps,
            batch_size=batch_size,
            ms_per_step={
                m: stats.median_ci([t / args.steps * 1e3 for t in ts]) for m, ts in times.items()
            },
            speedup=stats.paired_ratio(times["each"], times["vmapped"]),
            mapped_speedup=stats.paired_ratio(times["each"], times["mapped"]),
            compiled=compiled,
            padding=round(positions["stacked"] / positions["apart"], 3),
        )
        | (processes(task, k, args) if args.processes and k > 1 else {})
        | (decoding(setups, box["each"], args) if args.decode and k > 1 else {})
    )


def decoding(setups: list, states: list, args: SeedsOptions) -> dict:
    """The k seeds' translations of the first --decode dev sources, with the final
    evaluation's beam, length penalty and batches: in one vmapped program
    (decode.translate_seeds, as a seed group evaluates) against each seed's own decode one
    after another (evaluate.translate, as a run evaluates), in paired rounds, after checking
    that both make the same predictions (`same_predictions`). The models are the timed
    steps' (a few steps from their initialisation: their predictions' lengths are not a
    trained model's)."""
    lead = setups[0]
    settings = EvalSettings.of(lead.run, lead.data)
    sources = [src for src, _ in lead.data.dev_pairs[: args.decode]]
    models = [nnx.merge(lead.graphdef, state.params) for state in states]
    stacked = seed_axis.stack([state.params for state in states])

    def together():
        return decode.translate_seeds(
            lead.graphdef,
            stacked,
            lead.tokenizer,
            [sources] * len(states),
            beam_size=settings.beam,
            alpha=settings.alpha,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            pad_multiple=settings.pad_multiple,
            max_len=lead.config.max_len,
        )

    def apart():
        return [
            translate(model, lead.tokenizer, sources, settings, settings.beam) for model in models
        ]

    same = together() == apart()  # and the first calls compile both
    times = stats.time_interleaved({"vmapped": together, "apart": apart}, args.rounds)
    return dict(
        decode=dict(
            same_predictions=same,
            sources=len(sources),
            beam=settings.beam,
            max_new_tokens=settings.max_new_tokens,
            ms={m: stats.median_ci([t * 1e3 for t in ts]) for m, ts in times.items()},
            speedup=stats.paired_ratio(times["apart"], times["vmapped"]),
        )
    )


def processes(task: str, k: int, args: SeedsOptions) -> dict:
    """Whole runs: one `jaxformer train --seeds 0 .. k-1` process (on a CPU its seeds are
    stepped in turn by one compiled program) against k `jaxformer train --seed S` processes
    one after another, per round, each run --steps steps with a 32-pair final evaluation,
    with the compilation cache as a user has it (the warm-up round fills it)."""
    command = [*TRAIN, *train_flags(task, args), "--steps", str(args.steps)]

    def run(extra: list[str]) -> None:
        done = subprocess.run(command + extra, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command + extra)} failed:\n{done.stderr[-2000:]}")

    def together():
        with tempfile.TemporaryDirectory() as out:
            run(["--out", out, "--seeds", *map(str, range(k))])

    def apart():
        with tempfile.TemporaryDirectory() as out:
            for seed in range(k):
                run(["--out", f"{out}/seed{seed}", "--seed", str(seed)])

    times = stats.time_interleaved({"one": together, "k": apart}, args.processes, warmup=1)
    return dict(
        process_seconds={m: stats.median_ci(ts) for m, ts in times.items()},
        process_speedup=stats.paired_ratio(times["k"], times["one"]),
    )


def train_flags(task: str, args: SeedsOptions) -> list[str]:
    """The `jaxformer train` options of `task`'s runs."""
    return [
        f"--{key.replace('_', '-')}" + ("" if value is True else f"={value}")
        for key, value in _run_fields(task, args).items()
    ]


def _run_fields(task: str, args: SeedsOptions) -> dict:
    """The run options of `task`'s runs."""
    return TASKS[task] | ({"shared_lengths": True} if args.shared_lengths else {})


def _compile(fn, state, batch) -> dict:
    """Seconds to compile fn for these arguments, XLA's memory analysis in MiB and its cost
    analysis (flops, bytes accessed) of one call."""
    started = time.perf_counter()
    compiled = fn.lower(state, batch).compile()
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    mib = None
    if memory is not None:
        mib = (memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 2**20
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    return dict(
        seconds=round(seconds, 2),
        memory_mib=None if mib is None else round(mib, 1),
        flops=cost.get("flops"),
        bytes=cost.get("bytes accessed"),
    )


def record(rows: list[dict], args: SeedsOptions, headline=None) -> results.Record:
    table = results.Table(
        columns=[
            "task",
            "k",
            "vmapped ms / step [95%]",
            "mapped",
            "k one after another",
            "vmapped speed-up [95%]",
            "mapped speed-up [95%]",
            "compile s (vmapped / mapped / one seed)",
            "MiB (vmapped / mapped / one seed)",
            "positions stacked / apart",
            "XLA's flops, bytes: vmapped / k one-seed steps",
        ],
        rows=[_row(r) for r in rows],
        align="lrrrrrrrrrr",
        caption=(
            f"k seeds as one program, vmapped (all k at once) and mapped (`jax.lax.map`, one "
            f"seed at a time inside the program), against the k seeds' own steps one after "
            f"another, {args.rounds} rotating rounds of {args.steps} steps each (what varied: "
            "the round); a step is one optimizer step of all k seeds"
            + (
                ", every seed's batches in one order of lengths (shared_lengths)"
                * args.shared_lengths
            )
            + ":"
        ),
        notes=[
            "Separate processes would also compile the one-seed step k times; memory is "
            "XLA's analysis of the compiled step (arguments and temporaries); positions: "
            "source + target positions each timed step computes, the k batches stacked "
            "(padded to the longest) over their own lengths; XLA's flops and bytes accessed: "
            "its cost analysis of the vmapped step over k times the one-seed step's."
        ],
    )
    tables = [table]
    decoded = [r for r in rows if "decode" in r]
    if decoded:
        tables.append(
            results.Table(
                columns=[
                    "task",
                    "k",
                    "sources",
                    "beam",
                    "same predictions",
                    "vmapped ms [95%]",
                    "one after another ms",
                    "speed-up [95%]",
                ],
                rows=[_decode_row(r) for r in decoded],
                align="lrrrlrrr",
                caption=(
                    "Decoding dev sources with the final evaluation's settings: the k seeds "
                    "in one vmapped program (a seed group's evaluation) against each seed's "
                    f"own decode one after another, {args.rounds} rotating rounds (what "
                    "varied: the round); the models a few steps from their initialisation "
                    "(their predictions' lengths are not a trained model's):"
                ),
            )
        )
    whole = [r for r in rows if "process_speedup" in r]
    if whole:
        tables.append(
            results.Table(
                columns=["task", "k", "one process s [95%]", "k processes s", "speed-up [95%]"],
                rows=[_process_row(r) for r in whole],
                align="lrrrr",
                caption=(
                    f"Whole runs of {args.steps} steps: one `jaxformer train --seeds` process "
                    "(the seeds stepped in turn, the CPU's default) against k `jaxformer train` "
                    f"processes one after another, {args.processes} rotating rounds (what "
                    "varied: the round), the compilation cache on as by default:"
                ),
            )
        )
    data = {"rows": rows} | ({"headline": headline} if headline else {})
    return results.capture(tables, data=data)


def _interval(c: dict, unit: str = "", digits: int = 2) -> str:
    return f"{c['median']:.{digits}f}{unit} [{c['low']:.{digits}f}, {c['high']:.{digits}f}]"


def _decode_row(r: dict) -> list[str]:
    d = r["decode"]
    return [
        r["task"],
        str(r["k"]),
        str(d["sources"]),
        str(d["beam"]),
        "yes" if d["same_predictions"] else "**no**",
        _interval(d["ms"]["vmapped"], digits=1),
        _interval(d["ms"]["apart"], digits=1),
        _interval(d["speedup"], "x"),
    ]


def _process_row(r: dict) -> list[str]:
    seconds = r["process_seconds"]
    return [
        r["task"],
        str(r["k"]),
        _interval(seconds["one"], digits=1),
        _interval(seconds["k"], digits=1),
        _interval(r["process_speedup"], "x"),
    ]


def _row(r: dict) -> list[str]:
    ms, compiled, modes = r["ms_per_step"], r["compiled"], ("vmapped", "mapped", "one seed")
    return [
        r["task"],
        str(r["k"]),
        *(_interval(c, digits=1) for c in ms.values()),
        *(_interval(s, "x") for s in (r["speedup"], r["mapped_speedup"])),
        " / ".join(f"{compiled[m]['seconds']:.1f}" for m in modes),
        " / ".join(str(compiled[m]["memory_mib"]) for m in modes),
        f"{r['padding']:.2f}" if "padding" in r else "",
        _cost_ratio(compiled, r["k"]),
    ]


def _cost_ratio(compiled: dict, k: int) -> str:
    """XLA's flops and bytes of the vmapped step over k one-seed steps': "1.00, 0.96"."""
    vmapped, one = compiled["vmapped"], compiled["one seed"]
    if not (
        vmapped.get("flops") and one.get("flops") and vmapped.get("bytes") and one.get("bytes")
    ):
        return ""
    return ", ".join(f"{vmapped[c] / (k * one[c]):.2f}" for c in ("flops", "bytes"))
