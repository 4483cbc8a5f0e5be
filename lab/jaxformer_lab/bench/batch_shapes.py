"""How many shapes a translation run's training batches take, per pad multiple
(`jaxformer bench batch-shapes`): the train step compiles once per (source length, target
length), so on a GPU, where these small models run in milliseconds, the shapes decide a
short run's time (docs/results/h200.md, "Table 3 on the GPU").

The batches are `jaxformer train`'s (seed 0, its tokenizer, max_len 128); no model runs,
so the counts are the same on any machine. A Bible dataset needs `pip install
-e 'lab[data]'` (wyc-web: about 30 s on 2 cores).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from jaxformer.checks import BadValue
from jaxformer.train.config import RunConfig
from jaxformer.train.setup import build_data
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture


@dataclass(frozen=True)
class BatchShapesOptions(Options):
    dataset: str = setting("wyc-web", "the translation dataset (a Bible pair SRC-TGT)")
    batch_size: int = setting(64, "rows per batch")
    steps: int = setting(2000, "training batches counted, from the first")
    pad_multiples: tuple[int, ...] = setting((32, 64, 128), "the pad multiples compared")

    def __post_init__(self):
        super().__post_init__()
        numbers = (self.batch_size, self.steps, *self.pad_multiples)
        if not self.pad_multiples or min(numbers) < 1:
            raise BadValue("--batch-size, --steps and each of --pad-multiples must be >= 1")


@BENCHMARKS.register("batch-shapes", BatchShapesOptions)
def run(options: BatchShapesOptions) -> Record:
    """The shapes a translation run's training batches take, per pad multiple."""
    counts = {}
    for multiple in options.pad_multiples:
        counts[multiple] = shape_counts(options, multiple)
        say(f"pad multiple {multiple}: {len(counts[multiple])} shapes")
    table = Table(
        caption="Training batch shapes (source x target tokens) by pad multiple:",
        columns=["pad multiple", "shapes", "batches of each shape"],
        align="rrl",
        rows=[
            [str(m), str(len(c)), ", ".join(f"{s}x{t}: {n:,}" for (s, t), n in c.items())]
            for m, c in counts.items()
        ],
    )
    source = (
        f"the first {options.steps:,} training batches of {options.dataset}, batch "
        f"{options.batch_size}, seed 0, as jaxformer train builds them"
    )
    headline = {str(m): len(c) for m, c in counts.items()}
    return capture([table], source=source, data={"headline": headline})


def shape_counts(options: BatchShapesOptions, pad_multiple: int) -> dict[tuple[int, int], int]:
    """{(source length, target length): batches} over the first `steps` training batches,
    most frequent first."""
    run = RunConfig.from_options(dataset=options.dataset, pad_multiple=pad_multiple, seq_len=128)
    _, data = build_data(run)
    found = collections.Counter()
    for index in range(options.steps):
        batch = data.train_batch(index, options.batch_size)
        found[(batch["src"].shape[1], batch["tgt_in"].shape[1])] += 1
    return dict(found.most_common())
