"""The LM speedrun on 2 CPU cores (docs/results/training-lm.md): its data, its sweep with
the machine's load recorded, and the load's table.

    python experiments/lm_speedrun.py data                  # runs/lm-speedrun/shards
    python experiments/lm_speedrun.py sweep configs/sweeps/lm_speedrun.yaml
    python experiments/lm_speedrun.py load runs/lm-speedrun/sweep --out docs/results/lm_speedrun_load.json

`data` writes the installed Bible versions' chapters (`pip install -e 'lab[data]'`) as
token shards with a BPE of 2,048 ids: `jaxformer bench shard-loader`'s `prepare_bibles`,
nothing downloaded. `sweep` runs `jaxformer sweep SPEC --jobs 1` and samples, every 5 s,
how many cores other processes kept busy (`jaxformer_lab.bench.load`: the machine's busy
time less this process tree's) into the sweep folder's load.jsonl; `load` reads it with
each run's time span (run.json written at launch, summary.json at the end) into a results
file: the others' cores during each variant's runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "lab")]

from jaxformer_lab import records  # noqa: E402
from jaxformer_lab.bench import load  # noqa: E402
from jaxformer_lab.results import Table, capture  # noqa: E402

VOCAB = 2048
EVERY = 5.0  # seconds between load samples


def data(out: pathlib.Path) -> None:
    from jaxformer_lab.bench.shard_loader import prepare_bibles

    train, val = prepare_bibles(str(out), VOCAB)
    (out / "bibles.txt").unlink()  # the shards hold it
    print(json.dumps({"train": train, "val": val}))


def sweep(spec_path: str, out: str | None) -> int:
    """`jaxformer sweep SPEC --jobs 1` as a child process, the load sampled beside it."""
    from jaxformer_lab.sweep import Spec

    folder = Spec.load(spec_path, out=out).out
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "jaxformer", "sweep", spec_path, "--jobs", "1"]
    command += ["--out", out] if out else []
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lab")])}
    child = subprocess.Popen(command, env=env)
    with open(folder / "load.jsonl", "a") as log:
        before = load.snapshot()
        while child.poll() is None:
            time.sleep(EVERY)
            now = load.snapshot()
            sample = {"time": round(time.time(), 1), "others_cores": load.others_cores(before, now)}
            log.write(json.dumps(sample | {"load_average": os.getloadavg()[0]}) + "\n")
            log.flush()
            before = now
    return child.returncode


def spans(folder) -> dict[tuple[str, int], tuple[float, float]]:
    """(variant, seed) -> (start, end), epoch seconds, of each run with a times.json."""
    out = {}
    for variant in sorted(folder.iterdir(), key=lambda p: p.name):
        for run in sorted(variant.iterdir(), key=lambda p: p.name) if variant.is_dir() else ():
            if (run / "times.json").is_file():
                t = json.loads((run / "times.json").read_text())
                out[variant.name, int(run.name.removeprefix("seed"))] = (t["start"], t["end"])
    return out


def stamp(folder: pathlib.Path) -> None:
    """Each finished run's times.json: its start (run.json's time, written at launch) and
    end (summary.json's), kept with its records (an archive keeps no file times)."""
    for run in sorted(folder.glob("*/seed*")):
        if (run / "summary.json").is_file() and not (run / "times.json").is_file():
            times = {"start": (run / "run.json").stat().st_mtime}
            times["end"] = (run / "summary.json").stat().st_mtime
            (run / "times.json").write_text(json.dumps(times) + "\n")


def load_record(folder, command: str):
    """The others' cores (mean over the run's samples) of each variant's runs."""
    samples = [json.loads(line) for line in (folder / "load.jsonl").read_text().splitlines()]
    by_variant: dict[str, list[float]] = {}
    for (variant, _), (start, end) in spans(folder).items():
        inside = [s["others_cores"] for s in samples if start <= s["time"] <= end]
        if inside:
            by_variant.setdefault(variant, []).append(statistics.fmean(inside))
    rows = [
        [
            name,
            str(len(means)),
            f"{statistics.fmean(means):.2f}",
            f"{min(means):.2f}-{max(means):.2f}",
        ]
        for name, means in by_variant.items()
    ]
    every = [s["others_cores"] for s in samples]
    rows.append(
        [
            "the whole sweep",
            "",
            f"{statistics.fmean(every):.2f}",
            f"{min(every):.2f}-{max(every):.2f} (5 s samples)",
        ]
    )
    table = Table(
        caption="How busy the machine was: the cores other processes kept busy during each "
        "variant's runs (the machine's busy time less the sweep's own, sampled every 5 s; "
        "the machine has 2 cores), mean over the runs and the range of the runs' means:",
        columns=["variant", "runs", "others' cores, mean", "range"],
        align="lrrr",
        rows=rows,
    )
    made = capture([table], source=f"{folder}/load.jsonl, each run's times.json")
    return dataclasses.replace(made, command=command)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("data", help="the shards")
    d.add_argument("--out", default="runs/lm-speedrun", type=pathlib.Path)
    s = sub.add_parser("sweep", help="the sweep, its load sampled")
    s.add_argument("spec")
    s.add_argument("--out", help="the sweep's folder (default: the spec's out)")
    ld = sub.add_parser("load", help="the load's results file")
    ld.add_argument("folder", help="the sweep's folder (or its records archive's path)")
    ld.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.what == "data":
        data(args.out)
        return 0
    if args.what == "sweep":
        code = sweep(args.spec, args.out)
        stamp(pathlib.Path(args.out) if args.out else _spec_out(args.spec))
        return code
    command = f"python experiments/lm_speedrun.py load {args.folder} --out {args.out}"
    load_record(records.tree(args.folder), command).write(args.out)
    return 0


def _spec_out(spec_path: str) -> pathlib.Path:
    from jaxformer_lab.sweep import Spec

    return Spec.load(spec_path).out


if __name__ == "__main__":
    sys.exit(main())
