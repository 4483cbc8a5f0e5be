"""What `--log-internals N` costs (`jaxformer bench internals-overhead`): `make train`'s
model (the dates task, the tiny preset, batch 64) timed in blocks of N steps, side by side:
a block without internals (N plain steps) and a block as the loop runs it with internals
(N - 1 plain steps and the internals step, its record converted to floats), in rounds
through `jaxformer_lab.bench.stats` (two warm-up rounds compile both steps; the order alternates
each round). Every step reads its loss back, as the loop does.

The record (docs/looking-inside.md renders docs/results/internals_overhead.json): each
block's time per step, the overhead (with / without - 1, the median of the rounds' own with
its 95% interval) and the internals step against a plain step (each round's internals step
over that round's plain time per step).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

from jaxformer.checks import BadValue
from jaxformer.config import TransformerConfig
from jaxformer.train import report, set_up
from jaxformer.train.config import RunConfig
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, setting
from jaxformer_lab.results import Record, Table, capture


@dataclass(frozen=True)
class InternalsOptions(Options):
    every: int = setting(100, "N of --log-internals N: steps per block")
    rounds: int = setting(6, "timed rounds, each a block of each kind (>= 6)")

    def __post_init__(self):
        super().__post_init__()
        if self.every < 2 or self.rounds < 6:
            raise BadValue(
                f"--every must be >= 2 and --rounds >= 6, got {self.every}, {self.rounds}"
            )


@BENCHMARKS.register("internals-overhead", InternalsOptions)
def run(options: InternalsOptions) -> Record:
    """What --log-internals N costs: blocks of N steps with and without the internals step."""
    with tempfile.TemporaryDirectory() as tmp:
        times, special = _time_blocks(options, tmp)
    plain = [t / options.every for t in times["without"]]
    per_step = {k: stats.median_ci([t / options.every for t in v]) for k, v in times.items()}
    overhead = stats.paired_ratio(times["with"], times["without"])
    alone = stats.paired_ratio(special, plain)
    cells = [_ms(per_step["without"]), _ms(per_step["with"]), _percent(overhead), _times(alone)]
    table = Table(
        caption="Milliseconds per step of blocks of N steps without internals and with them "
        "(N - 1 plain steps and the internals step), the overhead (with / without - 1) and "
        "the internals step against a plain step; medians over the rounds with 95% "
        "intervals, each round a pair (what varied: the round):",
        columns=[
            "N",
            "rounds",
            "ms / step without",
            "ms / step with",
            "overhead",
            "internals step / plain step",
        ],
        align="rrrrrr",
        rows=[[str(options.every), str(options.rounds), *cells]],
    )
    source = "make train's model (dates, tiny preset, batch 64), the same N batches each block"
    headline = {
        "overhead": round(overhead["median"] - 1, 4),
        "internals_step": round(alone["median"], 3),
    }
    return capture(
        [table],
        source=source,
        data={"headline": headline, "times": times, "internals_step_s": special},
    )


def _time_blocks(options: InternalsOptions, out: str) -> tuple[dict, list[float]]:
    """Seconds of each round's block without and with internals, and of each timed round's
    internals step alone."""
    run = RunConfig.from_options(task="dates", log_internals=options.every, out=out)
    job = set_up(TransformerConfig.tiny(259), run)
    box = {"state": job.placement.put(job.state, like=job.layout)}
    batches = [job.data.train_batch(i, run.optim.batch_size) for i in range(options.every)]
    special = []

    def block(internals: bool) -> None:
        for i, batch in enumerate(batches):
            last = internals and i == len(batches) - 1
            started = time.perf_counter()
            box["state"], metrics = (job.internals_step if last else job.train_step)(
                box["state"], batch
            )
            float(metrics["loss"])
            if last:
                report.internals_record(i, metrics.pop("internals"))
                special.append(time.perf_counter() - started)

    calls = {"without": lambda: block(False), "with": lambda: block(True)}
    times = stats.time_interleaved(calls, options.rounds)
    return times, special[-options.rounds :]  # the warm-up rounds' left out


def _ms(ci: dict) -> str:
    return f"{ci['median'] * 1e3:.1f} [{ci['low'] * 1e3:.1f}, {ci['high'] * 1e3:.1f}]"


def _percent(ratio: dict) -> str:
    return f"{ratio['median'] - 1:+.1%} [{ratio['low'] - 1:+.1%}, {ratio['high'] - 1:+.1%}]"


def _times(ratio: dict) -> str:
    return f"{ratio['median']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]"
