"""What the wyc-web speedrun's speed levers buy on this machine, measured side by side
(`jaxformer bench speedrun-levers`; needs `pip install -e 'lab[data]'`), on the real
wyc-web training batches (the BPE the default run learns):

1. Padding: over one epoch of batch-64 batches, the share of source and target positions
   that are padding at each `--pad-multiple`, and how many batch shapes XLA compiles; the
   same for batches cut by token count (`--batch-tokens`) at batch 64's mean tokens a step.
2. Train-step time of candidate models on the same fixed batches (a spread of the epoch's
   shapes at pad multiple 16): the default tiny model against bfloat16 compute, no
   dropout, 4 encoder and 1 decoder layers, and 2x wider (float32 and bfloat16), in
   rotating rounds (stats): medians over rounds with their 95% intervals, and each
   candidate's speed against the default as the median of the per-round ratios.

Speed figures only: how fast each candidate learns per minute needs training runs
(`jaxformer sweep`). The measured figures: docs/results/training-speed.md."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx

from jaxformer import train
from jaxformer.checks import BadValue
from jaxformer.config import TransformerConfig
from jaxformer.models import Transformer
from jaxformer.train.config import RunConfig
from jaxformer.train.setup import build_data
from jaxformer_lab import bible
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.host import cpu_name
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

BATCH = 64
CANDIDATES = {  # name: changes to the default tiny model (float32, dropout 0.1)
    "tiny (the default), float32": {},
    "tiny, bfloat16 compute": dict(dtype="bfloat16"),
    "tiny, no dropout": dict(dropout_rate=0.0),
    "4 encoder + 1 decoder layers": dict(num_encoder_layers=4, num_decoder_layers=1),
    "d_model 256, d_ff 1024": dict(d_model=256, d_ff=1024),
    "d_model 256, d_ff 1024, bfloat16 compute": dict(d_model=256, d_ff=1024, dtype="bfloat16"),
}


@dataclass(frozen=True)
class LeversOptions(Options):
    rounds: int = setting(6, "rotating timing rounds (>= 6)")
    batches: int = setting(4, "batch shapes timed, from the shortest to the longest")

    def __post_init__(self):
        super().__post_init__()
        if self.rounds < 6 or self.batches < 2:
            raise BadValue(
                f"--rounds must be >= 6 and --batches >= 2, got {self.rounds}, {self.batches}"
            )


@BENCHMARKS.register("speedrun-levers", LeversOptions)
def run(options: LeversOptions) -> Record:
    """What the wyc-web speedrun's speed levers buy: padding, and candidates' step time."""
    run_config = RunConfig.from_options(dataset="wyc-web", pad_multiple=16)
    tokenizer, data = build_data(run_config)
    corpus, epoch = bible.load("wyc-web"), data.batches_per_epoch(BATCH)
    max_len = run_config.data.seq_len
    sides = {
        f"{BATCH} pairs, pad multiple {m}": corpus.data(tokenizer, max_len=max_len, pad_multiple=m)
        for m in (16, 32, 64)
    }
    tokens = mean_tokens(data, epoch)  # the same tokens a step, on average, cut by tokens
    sides[f"{tokens:,} tokens a side, pad multiple 16"] = corpus.data(
        tokenizer, max_len=max_len, pad_multiple=16, batch_tokens=tokens
    )
    padding = [padding_row(side, label) for label, side in sides.items()]
    batches = spread(data, epoch, options.batches)
    times = time_steps(batches, options.rounds, tokenizer.vocab_size)
    shapes = ", ".join(f"{b['src'].shape[1]}/{b['tgt_in'].shape[1]}" for b in batches)
    tables = [
        Table(
            caption=f"Padding of wyc-web's training batches (one epoch, the "
            f"{tokenizer.vocab_size:,}-id BPE), by pad multiple, and cut by tokens "
            f"(`--batch-tokens`) at batch {BATCH}'s mean tokens a step (rows x the padded "
            "longer side):",
            columns=["batches", "batches an epoch", "shapes compiled", "source padding"]
            + ["target padding"],
            align="lrrrr",
            rows=padding,
        ),
        Table(
            caption=f"Train step of each candidate on the same {len(batches)} real batches "
            f"(batch {BATCH}; source/target lengths {shapes}), medians over {options.rounds} "
            "rotating rounds with 95% intervals (what varied: the round); the speed against "
            "the default is the median of the per-round ratios:",
            columns=["model", "ms / step", "target tokens / s", "speed vs the default"],
            align="lrrr",
            rows=step_rows(times, batches),
        ),
    ]
    source = (
        f"the speed levers of the wyc-web speedrun, side by side in one process, on {cpu_name()}"
    )
    headline = {
        name: round(stats.paired_ratio(times[next(iter(times))], t)["median"], 3)
        for name, t in times.items()
    }
    return capture(tables, source=source, data={"headline": headline, "times": times})


def padding_row(data, label: str) -> list[str]:
    """One epoch's batches of `data`: how many, the shapes compiled, and the padded share
    of each side."""
    shapes, real, padded = set(), np.zeros(2), np.zeros(2)
    epoch = data.batches_per_epoch(BATCH)
    for i in range(epoch):
        b = data.train_batch(i, BATCH)
        shapes.add(b["src"].shape + b["tgt_in"].shape)
        real += [b["src_valid"].sum(), b["tgt_valid"].sum()]
        padded += [b["src"].size, b["tgt_in"].size]
    share = 1 - real / padded
    say(f"{label}: {len(shapes)} shapes")
    return [label, f"{epoch:,}", str(len(shapes)), f"{share[0]:.1%}", f"{share[1]:.1%}"]


def mean_tokens(data, epoch_batches: int) -> int:
    """The mean tokens a side of an epoch's batches: rows x the padded longer side."""
    total = 0
    for i in range(epoch_batches):
        b = data.train_batch(i, BATCH)
        total += b["src"].shape[0] * max(b["src"].shape[1], b["tgt_in"].shape[1])
    return round(total / epoch_batches)


def spread(data, epoch_batches: int, n: int) -> list[dict]:
    """`n` batches of the epoch with distinct shapes, from the shortest to the longest."""
    by_shape = {}
    for i in range(epoch_batches):
        b = data.train_batch(i, BATCH)
        by_shape.setdefault((b["src"].shape[1], b["tgt_in"].shape[1]), b)
    shapes = sorted(by_shape, key=lambda s: s[0] + s[1])
    picks = [shapes[round(k * (len(shapes) - 1) / (n - 1))] for k in range(n)]
    return [by_shape[s] for s in dict.fromkeys(picks)]


def candidate_step(vocab_size: int, changes: dict):
    """A candidate's train state and jitted step (the run's default optimizer)."""
    config = TransformerConfig.tiny(vocab_size, **changes)
    schedule = train.make_schedule("cosine", lr=3e-3, warmup_steps=100, total_steps=1000)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(
        Transformer(config, rngs=nnx.Rngs(0)), optimizer, seed=0
    )
    step = train.make_train_step(
        graphdef, optimizer, schedule, label_smoothing=config.label_smoothing
    )
    return state, jax.jit(step)


def time_steps(batches: list[dict], rounds: int, vocab_size: int) -> dict[str, list[float]]:
    """Seconds per pass over `batches`, per candidate, over rotating rounds (two warm-up
    rounds compile every shape)."""
    box = {name: candidate_step(vocab_size, changes) for name, changes in CANDIDATES.items()}

    def one_pass(name: str) -> None:
        state, step = box[name]
        for b in batches:
            state, metrics = step(state, b)
        jax.block_until_ready(metrics)
        box[name] = (state, step)

    say(f"timing {len(CANDIDATES)} candidates x {rounds} rounds")
    return stats.time_interleaved({n: (lambda n=n: one_pass(n)) for n in CANDIDATES}, rounds)


def step_rows(times: dict[str, list[float]], batches: list[dict]) -> list[list[str]]:
    """Per candidate: ms per step and target tokens/s (medians over rounds, 95% interval),
    and its speed against the default: the default's time over the candidate's per round."""
    target_tokens = sum(int(b["tgt_valid"].sum()) for b in batches)
    default = times[next(iter(times))]
    rows = []
    for name, seconds in times.items():
        ms = stats.median_ci([t / len(batches) * 1e3 for t in seconds])
        speed = stats.paired_ratio(default, seconds)
        tokens = stats.median_ci([target_tokens / t for t in seconds])
        rows.append(
            [
                name,
                f"{ms['median']:.0f} [{ms['low']:.0f}, {ms['high']:.0f}]",
                f"{tokens['median']:,.0f} [{tokens['low']:,.0f}, {tokens['high']:,.0f}]",
                f"{speed['median']:.2f} [{speed['low']:.2f}, {speed['high']:.2f}]",
            ]
        )
    return rows
