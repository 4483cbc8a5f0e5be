"""`jaxformer bench compile-time`: what compiling the train step costs, in two parts.

depth: compile time, step time and memory of the train step as models get deeper (the
encoder-decoder `transformer` and the decoder-only `lm`, shared.seq2seq_config's widths),
the layer stacks unrolled against `scan_layers=True`, and `remat` none / dots / full.
Compiles are the fastest of --tries (jit's trace + lower + compile of a fresh function),
steps the median of --repeats calls, memory XLA's plan of the compiled step
(`memory_analysis()`); a plot goes next to the record (compile-time.png).

cache: time to the first training step of `make train`'s job as fresh `jaxformer train`
processes with an empty, then a warm persistent compilation cache, and with it off
("seconds_to_first_step" from each run's summary.json, the best of --cache-runs).

The method in full: docs/scaling.md (depth) and docs/performance.md (cache).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from jaxformer.checks import check_int
from jaxformer_lab.bench import shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, beside, say, setting
from jaxformer_lab.results import Record, Table, capture

REMATS = ("none", "dots", "full")
MODELS = ("transformer", "lm")
JOB = ["--task", "dates", "--steps", "2", "--eval-every", "2", "--eval-examples", "64"]


@dataclasses.dataclass(frozen=True)
class CompileTimeOptions(Options):
    quick: bool = setting(False, "depths 1 and 2, one try, one cache run")
    parts: tuple[str, ...] = setting(
        ("depth", "cache"), "the parts to run", choices=("depth", "cache")
    )
    layers: tuple[int, ...] = setting((), "depths N (default 2 6 12 24; quick 1 2)")
    models: tuple[str, ...] = setting(MODELS, "the models of the depth part", choices=MODELS)
    repeats: int = setting(5, "timed steps per variant")
    tries: int | None = setting(
        None, "compilations of each step, the fastest counts (default 2; quick 1)"
    )
    cache_runs: int | None = setting(
        None, "cold, warm and off processes, the best counts (default 2; quick 1)"
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("repeats", "tries", "cache_runs"):
            if getattr(self, name) is not None:
                check_int(f"--{name.replace('_', '-')}", getattr(self, name))
        for n in self.layers:
            check_int("--layers", n)


@BENCHMARKS.register("compile-time", CompileTimeOptions)
def run(options: CompileTimeOptions) -> Record:
    """Compile time and memory of the train step against depth; the compilation cache."""
    tables, data = [], {}
    if "depth" in options.parts:
        data["rows"] = depth_rows(options)
        tables += depth_tables(data["rows"])
        plot(data["rows"], beside(options, ".png"))
    if "cache" in options.parts:
        data["cache"] = cache_runs(options.cache_runs or (1 if options.quick else 2))
        tables.append(cache_table(data["cache"]))
    return capture(tables, data=data | {"headline": headline(data)})


def batches() -> dict[str, dict]:
    """A batch of each model: 32 `dates` examples; 8 rows of 128 tokens of a text."""
    import jax.numpy as jnp

    from jaxformer.data import ByteTokenizer, TaskData, TextData

    tok = ByteTokenizer()
    seq2seq = TaskData("dates", tok, seed=0, dev_size=10).train_batch(0, 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "text.txt"
        path.write_text(
            "\n\n".join(f"paragraph {i}: " + "the quick brown fox " * 20 for i in range(64))
        )
        lm = TextData(path, tok, seq_len=128, seed=0).train_batch(0, 8)
    return {
        name: {k: jnp.asarray(v) for k, v in b.items()}
        for name, b in (("transformer", seq2seq), ("lm", lm))
    }


def train_state(model: str, layers: int, scan: bool, remat: str):
    """(a function that makes a fresh jitted train step, the train state) of `model` with
    N = `layers`: a fresh function is traced and compiled anew."""
    import jax
    import optax
    from flax import nnx

    from jaxformer.models import DecoderLM, Transformer
    from jaxformer.train import create_train_state, make_optimizer, make_train_step

    encoder = layers if model == "transformer" else 0
    config = shared.seq2seq_config(
        259, num_encoder_layers=encoder, num_decoder_layers=layers, scan_layers=scan, remat=remat
    )
    cls = Transformer if model == "transformer" else DecoderLM
    schedule = optax.constant_schedule(1e-3)
    optimizer = make_optimizer(schedule)
    graphdef, state = create_train_state(cls(config, rngs=nnx.Rngs(0)), optimizer, seed=0)

    def fresh_step():
        step = make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1)
        return jax.jit(step, donate_argnums=0)

    return fresh_step, state


def compiling(model: str, layers: int, scan: bool, remat: str, batch: dict, into: dict, key: str):
    """A call that compiles a fresh step of the variant and keeps it, with its state, in
    into[key]."""
    fresh_step, state = train_state(model, layers, scan, remat)

    def call():
        into[key] = (fresh_step().lower(state, batch).compile(), state)

    return call


def depth_rows(options: CompileTimeOptions) -> list[dict]:
    """A row per model and depth: compile and step time, unrolled and scanned, and memory."""
    data = batches()
    for scan in (False, True):  # warm-up: one-time start-up costs of the first compilations
        compiling("lm", 1, scan, "none", data["lm"], {}, "warm-up")()
    rows = []
    for model in options.models:
        for layers in options.layers or ((1, 2) if options.quick else (2, 6, 12, 24)):
            rows.append(measure(model, layers, data[model], options))
            say(json.dumps(rows[-1]))
    return rows


def measure(model: str, layers: int, batch: dict, options: CompileTimeOptions) -> dict:
    """One model at one depth: the compile times (unrolled and scanned, alternately),
    each variant's step time and memory."""
    import jax

    compiled = {}
    calls = {
        key: compiling(model, layers, scan, "none", batch, compiled, key)
        for key, scan in (("unrolled", False), ("scan", True))
    }
    tries = options.tries or (1 if options.quick else 2)
    seconds = stats.time_interleaved(calls, tries, warmup=0)
    row = {"model": model, "layers": layers}
    row |= {f"compile_s_{k}": round(min(s), 2) for k, s in seconds.items()}
    row["scan_compile_speedup"] = round(row["compile_s_unrolled"] / row["compile_s_scan"], 2)
    for remat in REMATS[1:]:
        compiling(model, layers, True, remat, batch, compiled, f"scan_{remat}")()
    for key, (program, state) in compiled.items():
        box = {"state": state}

        def call(program=program, box=box):
            box["state"], metrics = program(box["state"], batch)
            jax.block_until_ready(metrics)

        ms = shared.time_one(call, options.repeats)
        row[f"step_ms_{key}"] = round(1e3 * ms["median"], 1)
        row[f"temp_MiB_{key}"], row[f"peak_MiB_{key}"] = memory_mib(program)
    return row


def memory_mib(compiled) -> tuple[float, float]:
    """(temporaries, peak) in MiB, from XLA's plan for the compiled step."""
    m = compiled.memory_analysis()
    peak = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
    peak -= m.alias_size_in_bytes
    return round(m.temp_size_in_bytes / 2**20, 1), round(peak / 2**20, 1)


def cache_runs(runs: int) -> list[dict]:
    """Seconds to the first step of `runs` cold, warm and off triples, each triple with a
    new cache folder."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            cache, folder = pathlib.Path(tmp) / f"cache{i}", pathlib.Path(tmp)
            row = {"cold": first_step(cache, folder / f"cold{i}")}
            row["warm"] = first_step(cache, folder / f"warm{i}")
            row["off"] = first_step(cache, folder / f"off{i}", "--no-compile-cache")
            say(", ".join(f"{k} {s:.2f} s" for k, s in row.items()) + " to the first step")
            rows.append(row)
    return rows


def first_step(cache: pathlib.Path, out: pathlib.Path, *extra: str) -> float:
    """seconds_to_first_step of a fresh `jaxformer train` of JOB with its cache in `cache`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env |= {"XDG_CACHE_HOME": str(cache)}
    command = [sys.executable, "-m", "jaxformer", "train", *JOB, "--no-progress", "--out", str(out)]
    subprocess.run([*command, *extra], env=env, check=True, capture_output=True)
    return json.loads((out / "summary.json").read_text())["seconds_to_first_step"]


def depth_tables(rows: list[dict]) -> list[Table]:
    """The depth part's tables: compile and step time by depth, unrolled against scanned."""
    columns = ["model", "N", "compile unrolled (s)", "compile scan (s)", "scan speedup"]
    columns += ["step unrolled (ms)", "step scan (ms)"]
    cells = [
        [r["model"], r["layers"], r["compile_s_unrolled"], r["compile_s_scan"]]
        + [f"{r['scan_compile_speedup']}x", r["step_ms_unrolled"], r["step_ms_scan"]]
        for r in rows
    ]
    caption = (
        "Train step (forward, backward, Adam); d_model 256, 4 heads, d_ff 1024, dropout 0.1. "
        "`transformer`: N encoder + N decoder layers, 32 `dates` examples per batch; `lm`: N "
        "decoder layers, 8 x 128 tokens. Compile time: the fastest try; step time: the median:"
    )
    by_remat = " / ".join(REMATS)
    keys = ["scan" if m == "none" else f"scan_{m}" for m in REMATS]
    memory = [
        [r["model"], r["layers"]]
        + [
            " / ".join(str(r[f"{what}_{k}"]) for k in keys)
            for what in ("temp_MiB", "peak_MiB", "step_ms")
        ]
        for r in rows
    ]
    columns2 = ["model", "N", f"temp {by_remat}", f"peak {by_remat}", f"step {by_remat} (ms)"]
    caption2 = (
        "Memory of the compiled step with scan_layers, by remat (XLA's plan, MiB; temporaries "
        "hold what the backward pass keeps), and step time:"
    )
    return [
        Table(columns, cells, "lrrrrrr", caption=caption),
        Table(columns2, memory, "lrrrr", caption=caption2),
    ]


def cache_table(rows: list[dict]) -> Table:
    """The best seconds to the first step with the cache empty, warm and off."""
    best = {kind: min(r[kind] for r in rows) for kind in ("cold", "warm", "off")}
    cells = [
        ["empty (cold)", f"{best['cold']:.1f}"],
        ["warm", f"{best['warm']:.1f} ({best['cold'] / best['warm']:.1f}x shorter)"],
        ["off", f"{best['off']:.1f}"],
    ]
    caption = (
        "`make train`'s job (2 steps) as fresh processes; `seconds_to_first_step` from each "
        f"summary, best of {len(rows)}:"
    )
    return Table(["compilation cache", "seconds to the first step"], cells, "lr", caption=caption)


def headline(data: dict) -> dict:
    """The headline: each model's scan speed-up at its deepest; the cache's best times."""
    line = {}
    for r in data.get("rows", []):  # the deepest of each model
        line[f"scan_compile_speedup_{r['model']}"] = r["scan_compile_speedup"]
        line[f"layers_{r['model']}"] = r["layers"]
    if "cache" in data:
        best = {k: min(r[k] for r in data["cache"]) for k in ("cold", "warm", "off")}
        line |= {f"{k}_seconds": s for k, s in best.items()}
    return line


def plot(rows: list[dict], path: pathlib.Path) -> None:
    """Compile time and memory against depth, one line per model and layout, to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_c, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        n = [r["layers"] for r in rs]
        ax_c.plot(n, [r["compile_s_unrolled"] for r in rs], "o-", label=f"{model}, unrolled")
        ax_c.plot(n, [r["compile_s_scan"] for r in rs], "s--", label=f"{model}, scan_layers")
        if model == rows[0]["model"]:
            for remat, marker in zip(REMATS, "o^s", strict=True):
                key = "scan" if remat == "none" else f"scan_{remat}"
                temps = [r[f"temp_MiB_{key}"] for r in rs]
                ax_m.plot(n, temps, marker + "-", label=f"remat {remat}")
            ax_m.set(title=f"{model}: temporary memory of the step (scan_layers)")
    ax_c.set(xlabel="layers per stack (N)", ylabel="seconds", title="train step compile time")
    ax_c.legend()
    ax_m.set(xlabel="layers per stack (N)", ylabel="MiB")
    ax_m.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
