"""What Ray costs a sweep on one machine (`jaxformer bench ray-sweep`): the same sweep of
2 variants x 2 seeds (4 short `jaxformer train` runs, 2 at a time) run by the local
scheduler and as tasks on a local Ray cluster started for the benchmark, round by round,
the two arms' order alternating. The ratio is Ray's wall time over the local scheduler's
in the same round, the median over rounds with its 95% interval (what varied: the round);
each sweep starts from an empty folder, after one untimed sweep in each arm has filled
the compilation cache, so the rounds time the sweeps, not compiling.

    jaxformer bench ray-sweep [--rounds 6] [--steps 20]
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time
from dataclasses import dataclass

from jaxformer.checks import BadValue
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.host import cpu_name
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

JOBS = 2  # runs at once, in both arms
MODEL = dict(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)


@dataclass(frozen=True)
class RaySweepOptions(Options):
    rounds: int = setting(6, "timed rounds (>= 6, for a 95% interval), one sweep per arm each")
    steps: int = setting(20, "training steps of each run")

    def __post_init__(self):
        super().__post_init__()
        if self.rounds < 6 or self.steps < 1:
            raise BadValue(
                f"--rounds must be >= 6 and --steps >= 1, got {self.rounds}, {self.steps}"
            )


@BENCHMARKS.register("ray-sweep", RaySweepOptions)
def run(options: RaySweepOptions) -> Record:
    """A 4-run sweep by the local scheduler and on a local Ray cluster, in rounds."""
    from jaxformer_lab.sweep import ray_jobs

    cluster = ray_jobs.connect("local", cpus=1)
    times = {"local": [], "ray": []}
    try:
        for arm in ("local", "ray"):  # compiled programs cached: rounds time the sweeps alone
            say(f"warm-up: {arm} {_sweep_seconds(options.steps, _arm(arm, cluster)):.1f} s")
        for r in range(options.rounds):
            arms = ("local", "ray") if r % 2 == 0 else ("ray", "local")
            for arm in arms:
                seconds = _sweep_seconds(options.steps, _arm(arm, cluster))
                times[arm].append(seconds)
                say(f"round {r + 1}/{options.rounds}: {arm} {seconds:.1f} s")
    finally:
        cluster.close()
    return _record(options, times)


def _sweep_seconds(steps: int, cluster) -> float:
    """The wall time of one fresh sweep (its runs and its report), locally or on `cluster`."""
    from jaxformer_lab import sweep

    with tempfile.TemporaryDirectory() as folder:
        spec_file = pathlib.Path(folder) / "spec.json"
        base = dict(task="copy", steps=steps, batch_size=8, eval_every=steps, **MODEL)
        spec = dict(base=base, variants={"baseline": {}, "wide_ff": {"d_ff": 128}}, seeds=2)
        spec_file.write_text(json.dumps(spec | {"out": str(pathlib.Path(folder) / "sweep")}))
        spec, t0 = sweep.Spec.load(spec_file), time.perf_counter()
        sweep.run(spec, jobs=JOBS, cluster=cluster, say=lambda _: None)
        seconds = time.perf_counter() - t0
        ended = [sweep.status(spec.folder(v, s)) for v in spec.runs for s in spec.seeds]
        if ended != ["done"] * len(ended):
            raise BadValue(f"a timed sweep's runs did not all finish: {ended}")
        return seconds


def _arm(name: str, cluster):
    return cluster if name == "ray" else None


def _record(options: RaySweepOptions, times: dict[str, list[float]]) -> Record:
    ratio = stats.paired_ratio(times["ray"], times["local"])
    local, ray = (stats.median_ci(times[arm]) for arm in ("local", "ray"))

    def cell(s: dict) -> str:
        return f"{s['median']:.2f} ({s['low']:.2f}-{s['high']:.2f})"

    table = Table(
        ["arm", "sweep wall s", "Ray / local"],
        [["local scheduler", cell(local), ""], ["local Ray cluster", cell(ray), cell(ratio)]],
        "lrr",
        caption=f"A sweep of 4 runs ({options.steps} steps each, {JOBS} at a time) on "
        f"{cpu_name()}: median over {options.rounds} rounds (95% interval); the ratio is "
        "the median of per-round ratios.",
        notes=["Target: Ray within 10% of the local scheduler (ratio <= 1.10)."],
    )
    return capture([table], data={"seconds": times, "ratio": ratio})
