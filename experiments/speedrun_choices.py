"""What the wyc-web speedrun's speed levers buy on this machine, measured side by side.

Two measurements on the real wyc-web training batches (the BPE the default run learns):

1. **Padding.** Over one epoch of batch-64 batches, the share of source and target
   positions that are padding at each `--pad-multiple`, and how many batch shapes XLA
   compiles. Padding is the most a length-aware batching (batches by token count, as the
   paper's ~25k tokens) could save on a CPU, where a step's time follows its padded size.
2. **Train-step time** of candidate models on the same fixed batches (a spread of the
   epoch's shapes at pad multiple 16): the default tiny model in float32, with bfloat16
   compute, without dropout, with 4 encoder layers and 1 decoder layer, and 2x wider
   (in float32 and with bfloat16 compute).
   Rounds alternate over the candidates, so a busy machine slows them alike; each
   figure is the median over rounds, with the range, and a candidate's speed against
   the default is the ratio of their times within each round.

These are speed figures only: how fast each candidate learns per minute needs training
runs (`jaxformer sweep`).

    python experiments/speedrun_choices.py [--rounds 5] [--out results/speedrun_choices.json]

Needs `pip install 'jaxformer[data]'`. Prints a final JSON line; writes --out in the
docs/results format (copy it there to show it on the Training results page).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

import flax
import jax
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jaxformer as jf  # noqa: E402
from jaxformer import train  # noqa: E402
from jaxformer.bench.host import ISA_FLAGS, cpu_info  # noqa: E402  one description
from jaxformer.data import bible  # noqa: E402
from jaxformer.train.setup import build_data  # noqa: E402

BATCH = 64
CANDIDATES = {  # name: changes to the default tiny model (float32, dropout 0.1)
    "tiny (the default), float32": {},
    "tiny, bfloat16 compute": dict(dtype="bfloat16"),
    "tiny, no dropout": dict(dropout_rate=0.0),
    "4 encoder + 1 decoder layers": dict(num_encoder_layers=4, num_decoder_layers=1),
    "d_model 256, d_ff 1024": dict(d_model=256, d_ff=1024),
    "d_model 256, d_ff 1024, bfloat16 compute": dict(d_model=256, d_ff=1024, dtype="bfloat16"),
}


def padding_rows(run: jf.RunConfig, tokenizer, epoch_batches: int) -> list[list]:
    """One row per pad multiple: shapes compiled, and the padded share of each side."""
    corpus, rows = bible.load(run.data.dataset), []
    for multiple in (16, 32, 64):
        data = corpus.data(tokenizer, max_len=run.data.seq_len, pad_multiple=multiple)
        shapes, real, padded = set(), np.zeros(2), np.zeros(2)
        for i in range(epoch_batches):
            b = data.train_batch(i, BATCH)
            shapes.add((b["src"].shape[1], b["tgt_in"].shape[1]))
            real += [b["src_valid"].sum(), b["tgt_valid"].sum()]
            padded += [b["src"].size, b["tgt_in"].size]
        share = 1 - real / padded
        rows.append([str(multiple), str(len(shapes)), f"{share[0]:.1%}", f"{share[1]:.1%}"])
    return rows


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
    config = jf.TransformerConfig.tiny(vocab_size, **changes)  # the run's default model
    model = jf.Transformer(config, rngs=nnx.Rngs(0))
    schedule = train.make_schedule("cosine", lr=3e-3, warmup_steps=100, total_steps=1000)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(model, optimizer, seed=0)
    smoothing = config.label_smoothing
    step = jax.jit(train.make_train_step(graphdef, optimizer, schedule, label_smoothing=smoothing))
    return state, step


def time_steps(batches, rounds: int, vocab_size: int) -> dict[str, list[float]]:
    """Seconds per pass over `batches`, per candidate, over alternating rounds."""
    runs = {}
    for name, changes in CANDIDATES.items():
        state, step = candidate_step(vocab_size, changes)
        for b in batches:  # compile every shape before timing
            state, metrics = step(state, b)
        jax.block_until_ready(metrics)
        runs[name] = [state, step, []]
    for _ in range(rounds):
        for run in runs.values():
            started = time.perf_counter()
            for b in batches:
                run[0], metrics = run[1](run[0], b)
            jax.block_until_ready(metrics)
            run[2].append(time.perf_counter() - started)
    return {name: run[2] for name, run in runs.items()}


def step_rows(times: dict[str, list[float]], batches) -> list[list]:
    """Per candidate: ms per step and target tokens/s (medians over rounds, range), and its
    speed against the default measured within each round (the default's time over the
    candidate's, so the machine's drift between rounds cancels): median and range."""
    target_tokens = sum(int(b["tgt_valid"].sum()) for b in batches)
    default = times[next(iter(times))]
    rows = []
    for name, seconds in times.items():
        ms = [t / len(batches) * 1000 for t in seconds]
        speed = [d / t for d, t in zip(default, seconds, strict=True)]
        rows.append(
            [
                name,
                f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})",
                f"{target_tokens / statistics.median(seconds):,.0f}",
                f"{statistics.median(speed):.2f} ({min(speed):.2f}-{max(speed):.2f})",
            ]
        )
    return rows


def device_name() -> str:
    """The CPU, its cores and the vector extensions its matmul speed hangs on."""
    cpu = cpu_info()
    extensions = ", ".join(cpu.get("flags", [])) or "none of " + ", ".join(ISA_FLAGS)
    return f"{cpu.get('model', 'a CPU')}, {len(os.sched_getaffinity(0))} cores ({extensions})"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument("--batches", type=int, default=4, help="batch shapes timed")
    parser.add_argument("--out", default="results/speedrun_choices.json")
    args = parser.parse_args(argv)
    run = jf.RunConfig.from_options(dataset="wyc-web")
    tokenizer, data = build_data(run)
    epoch = data.batches_per_epoch(BATCH)
    padding = padding_rows(run, tokenizer, epoch)
    batches = spread(data, epoch, args.batches)
    times = step_rows(time_steps(batches, args.rounds, tokenizer.vocab_size), batches)
    shapes = ", ".join(f"{b['src'].shape[1]}/{b['tgt_in'].shape[1]}" for b in batches)
    result = {
        "command": "python experiments/speedrun_choices.py"
        + (f" --rounds {args.rounds}" if args.rounds != 5 else ""),
        "device": device_name(),
        "versions": {"jax": jax.__version__, "flax": flax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": "the speed levers of the wyc-web speedrun, side by side in one process",
        "tables": [
            {
                "caption": f"Padding of wyc-web's training batches (batch {BATCH}, one epoch "
                f"of {epoch} batches, the {tokenizer.vocab_size:,}-id BPE), by pad multiple:",
                "columns": ["pad multiple", "shapes compiled", "source padding", "target padding"],
                "align": "rrrr",
                "rows": padding,
            },
            {
                "caption": f"Train step of each candidate on the same {len(batches)} real "
                f"batches (batch {BATCH}; source/target lengths {shapes}), median over "
                f"{args.rounds} alternating rounds (range over the rounds); the speed "
                "against the default is taken within each round:",
                "columns": ["model", "ms / step", "target tokens / s", "speed vs the default"],
                "align": "lrrr",
                "rows": times,
            },
        ],
    }
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    line = {"padding": padding, "steps": times}
    print(json.dumps(line))
    return result


if __name__ == "__main__":
    main()
