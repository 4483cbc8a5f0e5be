"""What `--tracker jsonl,tensorboard,wandb` costs a training step against `--tracker jsonl`
(`jaxformer bench tracker-overhead`; the target: at most 1%). `make train`'s model (the
dates task, the tiny preset, batch 64) runs blocks of N steps as the loop does: each
step's metrics are read one step late, as the next step runs, and every --log-every'th
is logged through a run folder whose trackers are the mode's (W&B offline, its files in a
temporary folder). The modes alternate in paired rounds (`jaxformer_lab.bench.stats`;
two warm-up rounds compile the step and start the trackers).

The record: each mode's time per step, the overhead (all / jsonl - 1: the median of the
rounds' own with its 95% interval, what varied: the round) and the share of the steps'
time spent inside the logging calls of the mode with every tracker.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
import time
from dataclasses import dataclass

import jax

from jaxformer import trackers
from jaxformer.checks import BadValue, check_int
from jaxformer.config import TransformerConfig
from jaxformer.train import set_up
from jaxformer.train.config import RunConfig
from jaxformer.train.run_folder import RunFolder
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

TARGET = 0.01  # what tracking may add to a step
MODES = {"jsonl": "jsonl", "all": "jsonl,tensorboard,wandb"}


@dataclass(frozen=True)
class TrackerOptions(Options):
    steps: int = setting(40, "N: steps per block")
    rounds: int = setting(10, "timed rounds, each a block of each mode (>= 6)")
    log_every: int = setting(10, "steps between logged records (a run's default: 10)")
    quick: bool = setting(False, "blocks of 10 steps, 6 rounds")

    def __post_init__(self):
        super().__post_init__()
        check_int("--log-every", self.log_every)
        if not isinstance(self.steps, int) or self.steps < 2 or self.rounds < 6:
            raise BadValue(
                f"--steps must be >= 2 and --rounds >= 6, got {self.steps}, {self.rounds}"
            )


@BENCHMARKS.register("tracker-overhead", TrackerOptions)
def run(options: TrackerOptions) -> Record:
    """What the TensorBoard and W&B trackers cost a step: blocks of logged steps, paired."""
    steps, rounds = (10, 6) if options.quick else (options.steps, options.rounds)
    with tempfile.TemporaryDirectory() as tmp, _offline(tmp):
        times, logging = _time_blocks(steps, rounds, options.log_every, pathlib.Path(tmp))
    per_step = {k: stats.median_ci([t / steps for t in v]) for k, v in times.items()}
    overhead = stats.paired_ratio(times["all"], times["jsonl"])
    share = stats.median_ci([s / t for s, t in zip(logging, times["all"], strict=True)])
    verdict = "within" if overhead["high"] - 1 <= TARGET else "not shown within"
    table = Table(
        caption=f"Milliseconds per step of blocks of {steps} steps, every {options.log_every}th "
        "logged, with --tracker "
        "jsonl and with jsonl,tensorboard,wandb (W&B offline), the overhead (all / jsonl - 1) "
        "and the share of the steps' time inside the logging calls with every tracker; "
        "medians over the rounds with 95% intervals, each round a pair (what varied: the "
        f"round). The overhead is {verdict} the 1% target (its interval's upper end).",
        columns=[
            "N",
            "log every",
            "rounds",
            "ms / step, jsonl",
            "ms / step, all",
            "overhead",
            "in logging",
        ],
        align="rrrrrrr",
        rows=[
            [
                str(steps),
                str(options.log_every),
                str(rounds),
                _ms(per_step["jsonl"]),
                _ms(per_step["all"]),
                _percent(overhead, 1),
                _percent(share, 0),
            ],
        ],
    )
    headline = {
        "overhead": round(overhead["median"] - 1, 4),
        "overhead_high": round(overhead["high"] - 1, 4),
        "in_logging": round(share["median"], 4),
    }
    source = "make train's model (dates, tiny preset, batch 64)"
    data = {"headline": headline, "times": times, "logging_s": logging, "steps": steps}
    return capture([table], source=source, data=data)


def _time_blocks(steps: int, rounds: int, every: int, tmp: pathlib.Path) -> tuple[dict, list]:
    """Seconds of each round's block of each mode, and of the logging calls in each timed
    round's block with every tracker."""
    run = RunConfig.from_options(task="dates", out=str(tmp / "unused"))
    job = set_up(TransformerConfig.tiny(259), run)
    box = {"state": job.placement.put(job.state, like=job.layout)}
    batches = [job.data.train_batch(i, run.optim.batch_size) for i in range(steps)]
    folders, done, logging = {}, {name: 0 for name in MODES}, []
    for name, tracker in MODES.items():
        folder = RunFolder(tmp / name, placement=job.placement, meta=job.meta, verbose=False)
        folder.start(resume=False)
        runtime = RunConfig.from_options(task="dates", out="x", tracker=tracker).runtime
        folder.open_trackers(runtime, 0, {"run": run.to_dict()})
        folders[name] = folder
    say(f"timing {list(MODES)} in {rounds} rounds of {steps} steps")

    def block(name: str) -> None:
        held, spent = None, 0.0
        for batch in [*batches, None]:
            if batch is not None:
                box["state"], metrics = job.train_step(box["state"], batch)
            if held is not None:  # the step before's, read as this one runs
                done[name] += 1
                record = {k: float(v) for k, v in jax.device_get(held).items()}
            if held is not None and done[name] % every == 0:
                started = time.perf_counter()
                folders[name].log({"step": done[name], **record})
                spent += time.perf_counter() - started
            held = metrics
        if name == "all":
            logging.append(spent)

    try:
        times = stats.time_interleaved({name: lambda n=name: block(n) for name in MODES}, rounds)
    finally:
        for folder in folders.values():
            folder.close({})
        trackers.package("wandb").teardown()  # its service, before its folder goes
    return times, logging[-rounds:]  # the warm-up rounds' left out


@contextlib.contextmanager
def _offline(tmp: str):
    """W&B offline and quiet, its files under `tmp`; the environment restored after."""
    names = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": tmp}
    kept = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _ms(ci: dict) -> str:
    return f"{ci['median'] * 1e3:.1f} [{ci['low'] * 1e3:.1f}, {ci['high'] * 1e3:.1f}]"


def _percent(ci: dict, minus: float) -> str:
    m, lo, hi = (ci[k] - minus for k in ("median", "low", "high"))
    return f"{m:+.2%} [{lo:+.2%}, {hi:+.2%}]"
