"""`jaxformer bench optimizer-step`: the train step under Muon and schedule-free AdamW
against AdamW's, side by side (the target: Muon's step at most 1.10x AdamW's).

The model is train-step's (shared.seq2seq_config: the tiny preset at d_model 256, 2 + 2
post-LN layers, vocabulary 1000, source and target length 64), at each --batches size.
Per batch size the programs run in interleaved rounds (stats.time_interleaved, the order
rotated each round): one jitted step each of adamw, muon (5 Newton-Schulz steps), muon
with --cheap-ns-steps and schedule_free_adamw. Each optimizer's time over AdamW's is the
median of the per-round ratios with its 95% interval (what varied: the round). Newton-
Schulz costs ~ 30 d^3 per d x d matrix whatever the batch, the forward and backward ~ 6
tokens d^2: the ratio falls as the batch grows."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxformer.checks import BadValue, check_int
from jaxformer_lab.bench import host, shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.bench.train_step import VOCAB, random_batch
from jaxformer_lab.results import Record, Table, capture

TARGET = 1.10  # Muon's step over AdamW's


@dataclasses.dataclass(frozen=True)
class OptimizerStepOptions(Options):
    batches: tuple[int, ...] = setting((32, 128, 256), "sequences per step, one timing each")
    rounds: int = setting(10, "interleaved rounds, >= 6")
    steps_per_round: int = setting(1, "steps of each program per round")
    cheap_ns_steps: int = setting(3, "Newton-Schulz steps of the cheaper Muon")

    def __post_init__(self):
        super().__post_init__()
        for name in ("steps_per_round", "cheap_ns_steps"):
            check_int(f"--{name.replace('_', '-')}", getattr(self, name))
        for size in self.batches:
            check_int("--batches", size)
        if not isinstance(self.rounds, int) or self.rounds < 6:
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")


@BENCHMARKS.register("optimizer-step", OptimizerStepOptions)
def run(options: OptimizerStepOptions) -> Record:
    """The train step under muon and schedule_free_adamw against adamw's, in paired rounds."""
    optimizers = {  # a program's name: (the optimizer, its options)
        "adamw": ("adamw", {}),
        "muon": ("muon", {}),
        f"muon_ns{options.cheap_ns_steps}": ("muon", dict(ns_steps=options.cheap_ns_steps)),
        "schedule_free_adamw": ("schedule_free_adamw", {}),
    }
    result = {"batches": {}, "rounds": options.rounds, "steps_per_round": options.steps_per_round}
    load = [shared.conditions()["load_average"]]
    for size in options.batches:
        calls = programs(random_batch(np.random.default_rng(0), size), optimizers, options)
        say(f"batch {size}: timing {list(calls)} in {options.rounds} rounds")
        times = stats.time_interleaved(calls, options.rounds)
        per_step = {n: [t / options.steps_per_round for t in ts] for n, ts in times.items()}
        result["batches"][size] = figures(per_step)
    result["machine"] = host.machine_info(None) | shared.conditions()
    result["load_average"] = load + [result["machine"]["load_average"]]  # at start, at end
    return capture([table(result)], data=result | {"headline": headline(result)})


def figures(per_step: dict[str, list[float]]) -> dict:
    """Per program its seconds per step, and its time over AdamW's and its extra seconds,
    round by round (each a median with its 95% interval)."""
    adamw = per_step["adamw"]
    return {
        name: dict(
            seconds=stats.median_ci(seconds),
            over_adamw=stats.paired_ratio(seconds, adamw),
            extra_seconds=stats.paired_saving(seconds, adamw),
            samples=seconds,
        )
        for name, seconds in per_step.items()
    }


def programs(batch: dict, optimizers: dict, options: OptimizerStepOptions) -> dict:
    """{name: a call of steps_per_round jitted steps of the optimizer that waits for the last}."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxformer import train
    from jaxformer.models import Transformer

    batch = {name: jnp.asarray(v) for name, v in batch.items()}
    schedule = optax.constant_schedule(1e-4)
    calls = {}
    for name, (optimizer, extra) in optimizers.items():
        optimizer = train.make_optimizer(schedule, name=optimizer, **extra)
        model = Transformer(shared.seq2seq_config(VOCAB), rngs=nnx.Rngs(0))
        graphdef, state = train.create_train_state(model, optimizer, seed=0)
        step = train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1)
        compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
        calls[name] = _call(compiled, state, batch, options.steps_per_round)
    return calls


def _call(compiled, state, batch: dict, k: int):
    import jax

    box = {"state": state}

    def call():
        for _ in range(k):
            box["state"], metrics = compiled(box["state"], batch)
        jax.block_until_ready(metrics["loss"])

    return call


def table(r: dict) -> Table:
    """A row per batch size and optimizer: ms / step and the time over AdamW's."""
    rows = []
    for size, runs in r["batches"].items():
        for name, run in runs.items():
            s, ratio, extra = run["seconds"], run["over_adamw"], run["extra_seconds"]
            if name == "adamw":
                rows.append([str(size), name, _ms(s), "1 (the baseline)", ""])
            else:
                rows.append([str(size), name, _ms(s), _ratio(ratio), _ms(extra)])
    caption = (
        "The train step of train-step's model (d_model 256, 2+2 post-LN layers, d_ff 1024, "
        "vocabulary 1000, 64/64 tokens a pair, float32) under each optimizer; medians over "
        f"{r['rounds']} interleaved rounds of {r['steps_per_round']} step(s) with 95% "
        "intervals; the time over AdamW's and the extra time are the medians of the rounds' "
        f"own (what varied: the round). The target: muon <= {TARGET:.2f}x.{_load(r)}"
    )
    columns = ["batch", "optimizer", "ms / step [95%]", "time / AdamW's [95%]", "extra ms [95%]"]
    return Table(columns, rows, "llrrr", caption=caption)


def _load(r: dict) -> str:
    start, end = r.get("load_average") or (None, None)
    if start is None or end is None:
        return ""
    return f" The 1-minute load average: {start[0]:.1f} at the start, {end[0]:.1f} at the end."


def _ms(ci: dict) -> str:
    return f"{1e3 * ci['median']:.0f} [{1e3 * ci['low']:.0f}, {1e3 * ci['high']:.0f}]"


def _ratio(ci: dict) -> str:
    return f"{ci['median']:.2f}x [{ci['low']:.2f}, {ci['high']:.2f}]"


def headline(r: dict) -> dict:
    """Per batch size, Muon's time over AdamW's [median, low, high] and whether the target
    holds (the interval's top at most TARGET)."""
    line = {}
    for size, runs in r["batches"].items():
        for name in runs:
            if name != "adamw":
                ci = runs[name]["over_adamw"]
                line[f"{name}_b{size}"] = [round(ci[k], 3) for k in ("median", "low", "high")]
        line[f"muon_target_met_b{size}"] = runs["muon"]["over_adamw"]["high"] <= TARGET
    return line
