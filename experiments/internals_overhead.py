"""What `--log-internals N` costs: `make train`'s model (the dates task, the tiny preset,
batch 64) timed in blocks of N steps, side by side: a block without internals (N plain
steps) and a block as the loop runs it with internals (N - 1 plain steps and the
internals step, its record converted to floats), alternating, after one warm-up block
of each (compilation). Every step reads its loss back, as the loop does.

    python experiments/internals_overhead.py [--every 100] [--rounds 5]

Prints a JSON line and writes results/internals_overhead.json, a docs results file (copy
it to docs/results/, where docs/looking-inside.md renders it): the median time per step
of each kind of block, the overhead (with / without - 1) and each round's, and the
internals step alone against a plain step (medians).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.train import report, set_up  # noqa: E402


def block(job, state, batches, *, internals: bool):
    """(state, seconds per step, seconds of the internals step or None) of len(batches) steps."""
    start, special = time.perf_counter(), None
    for i, batch in enumerate(batches):
        last = internals and i == len(batches) - 1
        t = time.perf_counter()
        state, metrics = (job.internals_step if last else job.train_step)(state, batch)
        float(metrics["loss"])
        if last:
            report.internals_record(i, metrics.pop("internals"))
            special = time.perf_counter() - t
    return state, (time.perf_counter() - start) / len(batches), special


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=100, help="N of --log-internals N")
    parser.add_argument("--rounds", type=int, default=5, help="timed blocks of each kind")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = jf.RunConfig.from_options(task="dates", log_internals=args.every, out=tmp)
        job = set_up(jf.TransformerConfig.tiny(259), run)
        state = job.placement.put(job.state, like=job.layout)
        batches = [job.data.train_batch(i, run.optim.batch_size) for i in range(args.every)]
        times = {False: [], True: []}
        plain_steps, internals_steps = [], []
        for r in range(args.rounds + 1):  # round 0 compiles and warms up
            for internals in (r % 2 == 0, r % 2 == 1):  # which goes first alternates too
                state, per_step, special = block(job, state, batches, internals=internals)
                if r:
                    times[internals].append(per_step)
                    if internals:
                        internals_steps.append(special)
                    else:
                        plain_steps.append(per_step)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    paired = [w / o - 1 for w, o in zip(times[True], times[False], strict=True)]
    ratio = statistics.median(internals_steps) / statistics.median(plain_steps)
    row = [
        str(args.every),
        str(args.rounds),
        f"{off:.3f}",
        f"{on:.3f}",
        f"{on / off - 1:+.1%}",
        f"{min(paired):+.1%} to {max(paired):+.1%}",
        f"{ratio:.2f}x",
    ]
    result = {
        "command": f"python experiments/internals_overhead.py --every {args.every} "
        f"--rounds {args.rounds}",
        "device": f"{jax.devices()[0].device_kind}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        "versions": {"jax": jax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": "make train's model (dates, tiny preset, batch 64), blocks of N steps "
        "with and without the internals step, alternating, after a warm-up block of each",
        "tables": [
            {
                "caption": "Seconds per step (medians over the rounds) of blocks of N steps "
                "without internals and with them (N - 1 plain steps and the internals step), "
                "the overhead, each round's own (with / without - 1), and the internals step "
                "against a plain step (medians):",
                "columns": [
                    "N",
                    "rounds",
                    "s / step without",
                    "s / step with",
                    "overhead",
                    "rounds' overheads",
                    "internals step / plain step",
                ],
                "align": "rrrrrrr",
                "rows": [row],
            }
        ],
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "internals_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
