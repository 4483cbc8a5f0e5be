"""Compile time, step time and memory of the train step as models get deeper: the layer
stacks unrolled (a Python loop, the default) against `scan_layers=True` (one scan over
stacked parameters per stack), and `remat` none / dots / full.

    python experiments/compile_time.py [--layers 2,6,12,24] [--models transformer,lm]

Two models, d_model 256, 4 heads, d_ff 1024, dropout 0.1 (the paper's), byte vocabulary:
`transformer`, the paper's encoder-decoder with N encoder and N decoder layers, on batches
of 32 `dates` examples (32 source, 16 target tokens); `lm`, a decoder-only model with N
layers, on 8 packed rows of 128 tokens. The step is `jaxformer.train.make_train_step`
(forward, backward, Adam). Compile time is jit's trace + lower + compile of a fresh
function, the fastest of --tries (against other load on the machine). Memory is XLA's own
plan for the compiled step (`memory_analysis()`): temporaries (what the backward pass
keeps, and workspace) and the peak (temporaries plus arguments and outputs). Every variant
runs side by side in one process. Writes results/compile_time.{md,json,png}; the last line
printed is a JSON summary with `scan_compile_speedup` (the Transformer at the deepest N).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import matplotlib
import optax
from flax import nnx

import jaxformer as jf
from jaxformer.data import ByteTokenizer, TaskData, TextData
from jaxformer.markdown import table
from jaxformer.train import create_train_state, make_optimizer, make_train_step

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = dict(d_model=256, num_heads=4, d_ff=1024, max_len=128)
REMATS = ("none", "dots", "full")


def batches() -> dict[str, dict]:
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


def compiled_step(model: str, layers: int, scan: bool, remat: str, batch: dict, tries: int = 1):
    """(compiled step, seconds to trace + lower + compile (the least of `tries` fresh
    compilations), train state)."""
    config = jf.TransformerConfig(
        vocab_size=ByteTokenizer().vocab_size,
        num_encoder_layers=layers if model == "transformer" else 0,
        num_decoder_layers=layers,
        scan_layers=scan,
        remat=remat,
        **SIZES,
    )
    cls = jf.Transformer if model == "transformer" else jf.DecoderLM
    schedule = optax.constant_schedule(1e-3)
    optimizer = make_optimizer(schedule)
    graphdef, state = create_train_state(cls(config, rngs=nnx.Rngs(0)), optimizer, seed=0)
    seconds = []
    for _ in range(tries):
        step = jax.jit(
            make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1), donate_argnums=0
        )
        start = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        seconds.append(time.perf_counter() - start)
    return compiled, min(seconds), state


def step_ms(compiled, state, batch, repeats: int) -> float:
    state, m = compiled(state, batch)  # warm-up
    jax.block_until_ready(m)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, m = compiled(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 1)


def memory_mib(compiled) -> tuple[float, float]:
    """(temporaries, peak) in MiB, from XLA's plan for the compiled step."""
    m = compiled.memory_analysis()
    peak = (
        m.temp_size_in_bytes
        + m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
    )
    return round(m.temp_size_in_bytes / 2**20, 1), round(peak / 2**20, 1)


def measure(model: str, layers: int, batch: dict, repeats: int, tries: int) -> dict:
    row = {"model": model, "layers": layers}
    for scan, remat in [(False, "none")] + [(True, r) for r in REMATS]:
        key = ("scan" if scan else "unrolled") + ("" if remat == "none" else f"_{remat}")
        n = tries if remat == "none" else 1
        compiled, seconds, state = compiled_step(model, layers, scan, remat, batch, n)
        if remat == "none":
            row[f"compile_s_{key}"] = round(seconds, 2)
        row[f"step_ms_{key}"] = step_ms(compiled, state, batch, repeats)
        row[f"temp_MiB_{key}"], row[f"peak_MiB_{key}"] = memory_mib(compiled)
        del compiled, state
    row["scan_compile_speedup"] = round(row["compile_s_unrolled"] / row["compile_s_scan"], 2)
    return row


def tables(rows: list[dict], device: str) -> str:
    text = [
        f"Train step (forward, backward, Adam) on {device}; d_model 256, 4 heads, d_ff 1024, "
        "dropout 0.1. `transformer`: N encoder + N decoder layers, 32 `dates` examples per "
        "batch; `lm`: N decoder layers, 8 x 128 tokens. Command: "
        "`python experiments/compile_time.py`.",
        "",
    ]
    columns = ["model", "N", "compile unrolled (s)", "compile scan (s)", "scan speedup"]
    columns += ["step unrolled (ms)", "step scan (ms)"]
    cells = [
        [
            r["model"],
            r["layers"],
            r["compile_s_unrolled"],
            r["compile_s_scan"],
            f"{r['scan_compile_speedup']}x",
            r["step_ms_unrolled"],
            r["step_ms_scan"],
        ]
        for r in rows
    ]
    text += table(columns, cells, "lrrrrrr")
    text += [
        "",
        "Memory of the compiled step with scan_layers, by remat (XLA's plan, MiB; temporaries "
        "hold what the backward pass keeps), and step time:",
        "",
    ]
    by_remat = " / ".join(REMATS)
    columns = ["model", "N", f"temp {by_remat}", f"peak {by_remat}", f"step {by_remat} (ms)"]
    suffixes = ["" if m == "none" else f"_{m}" for m in REMATS]
    cells = [
        [r["model"], r["layers"]]
        + [
            " / ".join(str(r[f"{what}_scan{suffix}"]) for suffix in suffixes)
            for what in ("temp_MiB", "peak_MiB", "step_ms")
        ]
        for r in rows
    ]
    text += table(columns, cells, "lrrrr")
    return "\n".join(text) + "\n"


def plot(rows: list[dict], path: pathlib.Path, device: str) -> None:
    fig, (ax_c, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        n = [r["layers"] for r in rs]
        ax_c.plot(n, [r["compile_s_unrolled"] for r in rs], "o-", label=f"{model}, unrolled")
        ax_c.plot(n, [r["compile_s_scan"] for r in rs], "s--", label=f"{model}, scan_layers")
        if model == rows[0]["model"]:
            for remat, marker in zip(REMATS, "o^s", strict=True):
                suffix = "" if remat == "none" else f"_{remat}"
                ax_m.plot(
                    n,
                    [r[f"temp_MiB_scan{suffix}"] for r in rs],
                    marker + "-",
                    label=f"remat {remat}",
                )
            ax_m.set(title=f"{model}: temporary memory of the step (scan_layers)")
    ax_c.set(
        xlabel="layers per stack (N)", ylabel="seconds", title=f"train step compile time ({device})"
    )
    ax_c.legend()
    ax_m.set(xlabel="layers per stack (N)", ylabel="MiB")
    ax_m.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="2,6,12,24", help="comma-separated depths N")
    parser.add_argument("--models", default="transformer,lm", help="transformer, lm or both")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--tries", type=int, default=2, help="compilations, the fastest counts")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = batches()
    device = jax.devices()[0].device_kind
    for scan in (False, True):  # warm-up: one-time start-up costs of the first compilations
        compiled_step("lm", 1, scan, "none", data["lm"])
    rows = []
    for model in args.models.split(","):
        for layers in (int(n) for n in args.layers.split(",")):
            rows.append(measure(model, layers, data[model], args.repeats, args.tries))
            print(json.dumps(rows[-1]), flush=True)
    text = tables(rows, device)
    (out / "compile_time.md").write_text(text)
    (out / "compile_time.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    plot(rows, out / "compile_time.png", device)
    print(text)
    deepest = {r["model"]: r for r in rows}  # the last (deepest) row of each model
    head = deepest.get("transformer", rows[-1])
    summary = {
        "device": device,
        "layers": head["layers"],
        "scan_compile_speedup": head["scan_compile_speedup"],
        "compile_s_unrolled": head["compile_s_unrolled"],
        "compile_s_scan": head["compile_s_scan"],
        "temp_MiB_scan_none_dots_full": [head[f"temp_MiB_scan{s}"] for s in ("", "_dots", "_full")],
    }
    if "lm" in deepest and head is not deepest["lm"]:
        summary["scan_compile_speedup_lm"] = deepest["lm"]["scan_compile_speedup"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
