"""How many shapes a translation run's training batches take, per pad multiple: the train
step compiles once per (source length, target length), so on a GPU, where these small
models run in milliseconds, the shapes decide a short run's time (see
docs/results/h200.md, "Table 3 on the GPU").

    python experiments/batch_shapes.py [--dataset wyc-web] [--batch-size 64] [--steps 2000]
                                       [--pad-multiples 32 64 128] [--out FILE]

The batches are `jaxformer train`'s (seed 0, its BPE tokenizer, max_len 128). Needs
`pip install 'jaxformer[data]'`; about 30 s on 2 cores. Prints a final JSON line and writes
--out in the docs/results format.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import pathlib

from jaxformer.config import RunConfig
from jaxformer.train.setup import build_data


def shape_counts(dataset: str, batch_size: int, steps: int, pad_multiple: int) -> dict:
    """{(source length, target length): batches} over the first `steps` training batches."""
    run = RunConfig.from_options(dataset=dataset, pad_multiple=pad_multiple, seq_len=128)
    _, data = build_data(run)
    counts = collections.Counter()
    for index in range(steps):
        batch = data.train_batch(index, batch_size)
        counts[(batch["src"].shape[1], batch["tgt_in"].shape[1])] += 1
    return dict(counts.most_common())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="wyc-web")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--pad-multiples", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--out", default="docs/results/batch_shapes_wyc_web.json")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.steps < 1 or min(args.pad_multiples) < 1:
        parser.error("--batch-size, --steps and each of --pad-multiples must be >= 1")
    counts = {
        m: shape_counts(args.dataset, args.batch_size, args.steps, m) for m in args.pad_multiples
    }
    rows = [
        [str(m), str(len(c)), ", ".join(f"{s}x{t}: {n:,}" for (s, t), n in c.items())]
        for m, c in counts.items()
    ]
    result = {
        "command": "python experiments/batch_shapes.py",
        "device": "any (no model; deterministic)",
        "versions": {},
        "date": datetime.date.today().isoformat(),
        "source": f"the first {args.steps:,} training batches of {args.dataset}, batch "
        f"{args.batch_size}, seed 0, as jaxformer train builds them",
        "tables": [
            {
                "caption": "Training batch shapes (source x target tokens) by pad multiple:",
                "columns": ["pad multiple", "shapes", "batches of each shape"],
                "align": "rrl",
                "rows": rows,
            }
        ],
    }
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({str(m): len(c) for m, c in counts.items()}))


if __name__ == "__main__":
    main()
