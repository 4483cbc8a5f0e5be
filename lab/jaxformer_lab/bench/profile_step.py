"""`jaxformer bench profile`: where one training step spends its time.

--model dates (the default): `make train`'s job (the dates task, the tiny preset, batch
64) trained for --steps steps, the last traced (`profile="{steps - 1}:{steps}"`), --repeats
times as fresh runs; the trace's operations are sorted by kind: matrix products (dot
fusions), layout copies and transposes, random bits (dropout's threefry), reductions,
other fusions (elementwise work fused by XLA). The record has a row per run; the last
run's timeline goes next to it (profile.png).

--model gpt2: one training step of lm-throughput's model (its options: --quick, --batch,
--attention, ...) traced after three of warm-up; the trace and the compiled step's
optimized HLO text go next to the record (profile.perfetto.json.gz, profile.hlo.txt.gz)
and are read as --trace and --hlo read a pair taken elsewhere (the model's sizes from the
options): each device operation by category (jaxformer_lab.bench.hlo_profile).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import pathlib
import shutil
import tempfile

from jaxformer.checks import BadValue, MissingFile, check_int
from jaxformer_lab.bench import hlo_profile, shared
from jaxformer_lab.bench.registry import BENCHMARKS, beside, say, setting
from jaxformer_lab.results import Record, Table, capture

KINDS = {  # first match wins, on the lower-cased operation name (ynn: XLA CPU's YNNPACK dots)
    "matrix products": ("ynn", "dot", "gemm", "matmul", "convolution"),
    "layout copies": ("copy", "transpose"),
    "random bits": ("rng", "threefry", "random"),
    "reductions": ("reduce",),
}


@dataclasses.dataclass(frozen=True)
class ProfileOptions(shared.LMOptions):
    model: str = setting("dates", "make train's job, or GPT-2's step", choices=("dates", "gpt2"))
    steps: int = setting(12, "dates: steps of each run, the last traced")
    repeats: int = setting(1, "dates: fresh runs")
    trace: str = setting("", "gpt2: read this trace (Perfetto JSON, gzipped), with --hlo")
    hlo: str = setting("", "gpt2: the traced step's optimized HLO text, with --trace")

    def __post_init__(self):
        super().__post_init__()
        check_int("--steps", self.steps, minimum=2)
        check_int("--repeats", self.repeats)
        if bool(self.trace) != bool(self.hlo):
            raise BadValue("--trace and --hlo go together")
        if self.trace and self.model != "gpt2":
            raise BadValue("--trace and --hlo read a GPT-2 profile: give --model gpt2")
        for path in (self.trace, self.hlo):
            if path and not pathlib.Path(path).is_file():
                raise MissingFile(f"{path}: no such file")


@BENCHMARKS.register("profile", ProfileOptions)
def run(options: ProfileOptions) -> Record:
    """Where one training step spends its time: by kind (dates) or by category (gpt2)."""
    if options.model == "dates":
        return profile_dates(options)
    if options.trace:
        summary = hlo_profile.read_profile(
            pathlib.Path(options.trace), pathlib.Path(options.hlo), options.sizes()
        )
    else:
        summary = profile_gpt2(options)
    headline = {k: summary[k] for k in ("kernel_ms", "busy_ms")}
    return capture([gpt2_table(summary)], data=summary | {"headline": headline})


def profile_gpt2(options: ProfileOptions) -> dict:
    """Trace one step of the options' model after three of warm-up, keep the trace and
    the compiled step's HLO next to the record, and profile them."""
    import jax

    step, state, batch, _ = shared.lm_step(options)
    compiled = step.lower(state, batch).compile()
    trace, hlo = beside(options, ".perfetto.json.gz"), beside(options, ".hlo.txt.gz")
    hlo.parent.mkdir(parents=True, exist_ok=True)
    hlo.write_bytes(gzip.compress(compiled.as_text().encode()))
    for _ in range(3):  # warm-up
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        jax.profiler.stop_trace()
        shutil.copy(next(pathlib.Path(tmp).rglob("perfetto_trace.json.gz")), trace)
    say(f"traced one step: {trace}, {hlo}")
    return hlo_profile.read_profile(trace, hlo, options.sizes())


def gpt2_table(summary: dict) -> Table:
    """A row per category: its kernels' ms per step and share, then all kernels."""
    rows = [[c, f"{ms:.2f}", f"{summary['shares'][c]:.1%}"] for c, ms in summary["ms"].items()]
    rows.append(["all kernels", f"{summary['kernel_ms']:.2f}", "100%"])
    s = summary["sizes"]
    caption = (
        f"One training step of the GPT-2-shaped LM ({s['layers']} layers, d_model "
        f"{s['d_model']}, batch {s['batch']} x {s['context']} tokens) by category:"
    )
    note = (
        f"Kernel time per step, the mean over {summary['steps']} traced step(s); the device "
        f"was busy {summary['busy_ms']:.2f} ms per step (overlapping kernels counted once)."
    )
    return Table(["category", "ms per step", "share"], rows, "lrr", caption=caption, notes=[note])


def kind_of(name: str) -> str:
    low = name.lower()
    return next(
        (k for k, keys in KINDS.items() if any(key in low for key in keys)), "other fusions"
    )


def xla_events(trace_file: pathlib.Path) -> list[dict]:
    """The complete events ("X") of the XLA runtime threads, with their thread's name."""
    events = json.load(gzip.open(trace_file))
    events = events["traceEvents"] if isinstance(events, dict) else events
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = []
    for e in events:
        thread = threads.get((e.get("pid"), e.get("tid")), "")
        name = e.get("name", "")
        container = "::" in name or name.startswith("end:")  # the executor's own spans
        if e.get("ph") == "X" and "python" not in thread.lower() and e.get("dur") and not container:
            out.append(dict(name=e["name"], thread=thread, ts=e["ts"], dur=e["dur"]))
    return out


def summarise(events: list[dict]) -> dict:
    """The traced step's wall time (first to last operation), busy time (the operations'
    summed time) and each kind's share of it."""
    by_kind, by_name = collections.Counter(), collections.Counter()
    for e in events:
        by_kind[kind_of(e["name"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
    total = sum(by_kind.values())
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    return dict(
        busy_ms=round(total / 1e3, 2),
        span_ms=round(span / 1e3, 2),
        shares={k: round(v / total, 3) for k, v in by_kind.most_common()},
        top_operations=[(n, round(v / 1e3, 2)) for n, v in by_name.most_common(10)],
    )


def profile_dates(options: ProfileOptions) -> Record:
    """The dates job, --repeats fresh runs of --steps steps, the last traced; the
    operations of each traced step by kind, and the last run's timeline next to the record."""
    from jaxformer.config import TransformerConfig
    from jaxformer.train import loop
    from jaxformer.train.config import RunConfig

    runs, steps = [], options.steps
    for i in range(options.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            run = RunConfig.from_options(
                task="dates",
                steps=steps,
                profile=f"{steps - 1}:{steps}",
                eval_every=10**6,
                eval_examples=64,
                log_every=10**6,
                out=f"{tmp}/run",
            )
            loop.train(TransformerConfig.tiny(259), run, progress=False)
            trace = next(pathlib.Path(tmp, "run", "profile").rglob("perfetto_trace.json.gz"))
            events = xla_events(trace)
        runs.append(summarise(events))
        say(f"run {i + 1}: step {runs[-1]['span_ms']} ms, shares {runs[-1]['shares']}")
    plot(events, beside(options, ".png"))
    headline = {"span_ms": [r["span_ms"] for r in runs], "shares": [r["shares"] for r in runs]}
    data = dict(runs=runs, conditions=shared.conditions(), headline=headline)
    return capture([dates_table(runs, steps)], data=data)


def dates_table(runs: list[dict], steps: int) -> Table:
    """A row per run: the step's wall and busy time and each kind's share of the busy time."""
    kinds = [*KINDS, "other fusions"]
    rows = [
        [str(i), f"{r['span_ms']:.0f}", f"{r['busy_ms']:.0f}"]
        + [f"{r['shares'].get(k, 0):.1%}" for k in kinds]
        for i, r in enumerate(runs, 1)
    ]
    caption = (
        "One training step of `make train`'s model in XLA's CPU trace (each run a fresh job: "
        f"the dates task, the tiny preset, batch 64, traced at its step {steps} with "
        f"`--profile {steps - 1}:{steps}`): its wall time (first to last operation), the "
        "operations' summed time (busy, over the runtime threads), and each kind's share of "
        "the busy time:"
    )
    columns = ["run", "step ms", "busy ms", *kinds]
    return Table(columns, rows, "r" * len(columns), caption=caption)


def plot(events: list[dict], path: pathlib.Path) -> None:
    """The traced step's operations on each runtime thread, coloured by kind, to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({e["thread"] for e in events})
    start = min(e["ts"] for e in events)
    colours = dict(zip([*KINDS, "other fusions"], plt.cm.tab10.colors, strict=False))
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.5 * len(threads)))
    for e in events:
        row = threads.index(e["thread"])
        ax.barh(
            row, e["dur"] / 1e3, left=(e["ts"] - start) / 1e3, color=colours[kind_of(e["name"])]
        )
    labels = [f"{t.split('/')[0].removeprefix('tf_')} #{i}" for i, t in enumerate(threads)]
    ax.set_yticks(range(len(threads)), labels)
    ax.set_xlabel("ms into the traced step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=5)
    fig.suptitle("One training step of make train's model on XLA's CPU runtime, by thread")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
