"""XLA-compiled against eager execution, workload by workload: when does `jax.jit` pay off?

For each workload (attention alone, one encoder layer, one decoder layer, the full forward
pass, the full train step: loss, gradient and optax update) at each model size and batch
size it measures

    eager        the plain Python function, every jnp operation dispatched on its own
                 (each primitive is compiled once and cached by JAX: op-by-op execution)
    disable_jit  the same under `jax.disable_jit()`, which also unrolls the `jit`s nested
                 inside library code (jax.random, jax.nn, optax)
    jit          `jax.jit` in steady state (the train step donates its state, as in training)

as medians over repeated calls after one warm-up call, `block_until_ready` on the outputs;
and the one-off cost of compiling, split into `jax.jit(f).trace(...)`, `.lower()` and
`.compile()` (a fresh function object each time, so no cache is hit). From these:

    speed-up           eager time / jit time
    break-even calls   (trace + lower + compile) / (eager time - jit time): the number of
                       calls after which compiling has paid for itself (None: never)

    python experiments/xla_vs_eager.py [--quick]

Writes results/xla_vs_eager.json, .md (a table) and .png (a plot); prints a final JSON line
with the speed-up and break-even range of each workload. Runs unchanged on a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jaxformer as jf  # noqa: E402
from jaxformer import functional as F  # noqa: E402
from jaxformer import nn, train  # noqa: E402

VOCAB = 1000
SIZES = {  # name -> (config, sequence length)
    "tiny": (jf.TransformerConfig.tiny(VOCAB, d_model=64, d_ff=256, max_len=64), 16),
    "small": (jf.TransformerConfig.tiny(VOCAB, max_len=64), 32),
    "paper_base": (jf.TransformerConfig.paper_base(VOCAB, max_len=64), 16),
}
WORKLOADS = ("attention", "encoder_layer", "decoder_layer", "forward", "train_step")


@dataclass
class Workload:
    fn: Callable  # the plain Python function
    args: tuple
    jit_kwargs: dict  # for jax.jit
    threads_state: bool = False  # fn(state, ...) -> (state, ...): feed the state back


def build(name: str, config: jf.TransformerConfig, B: int, L: int) -> Workload:
    rng = np.random.default_rng(0)
    E, H, Dk = config.d_model, config.num_heads, config.key_dim
    valid = jnp.asarray(np.arange(L)[None, :] < rng.integers(L // 2, L + 1, (B, 1)))
    x = jnp.asarray(rng.standard_normal((B, L, E)), jnp.float32)
    if name == "attention":
        q, k, v = (jnp.asarray(rng.standard_normal((B, L, H, Dk)), jnp.float32) for _ in range(3))
        return Workload(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True), (q, k, v), {}
        )
    opts, mask = config.block_options(), F.padding_mask(None, valid)
    if name == "encoder_layer":
        params = nn.EncoderLayer(config, rngs=nnx.Rngs(0)).params()
        return Workload(lambda x, p: F.encoder_layer(x, p, mask, opts), (x, params), {})
    if name == "decoder_layer":
        params = nn.DecoderLayer(config, rngs=nnx.Rngs(0)).params()
        causal = F.causal_mask(L)
        return Workload(
            lambda y, memory, p: (
                F.decoder_layer(y, p, causal, opts, memory=memory, cross_mask=mask).y
            ),
            (x, x, params),
            {},
        )
    tokens = jnp.asarray(rng.integers(3, VOCAB, (B, L)), jnp.int32)
    batch = dict(src=tokens, src_valid=valid, tgt_in=tokens, tgt_out=tokens, tgt_valid=valid)
    model = jf.Transformer(config, rngs=nnx.Rngs(0))
    if name == "forward":
        graphdef, params = nnx.split(model)
        return Workload(
            lambda params, batch: train.model_logits(nnx.merge(graphdef, params), batch, rng=None),
            (params, batch),
            {},
        )
    if name == "train_step":
        schedule = train.make_schedule("paper", d_model=E, warmup_steps=4000)
        optimizer = train.make_optimizer(schedule)
        graphdef, state = train.create_train_state(model, optimizer, seed=0)
        step = train.make_train_step(
            graphdef, optimizer, schedule, label_smoothing=config.label_smoothing
        )
        return Workload(step, (state, batch), {"donate_argnums": 0}, threads_state=True)
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")


def time_calls(call: Callable, w: Workload, args: tuple, repeats: int, budget_s: float):
    """Median seconds per call after one warm-up; stops early past budget_s (>= 3 calls)."""
    out = jax.block_until_ready(call(*args))
    if w.threads_state:
        args = (out[0], *args[1:])
    times = []
    while len(times) < repeats and (len(times) < 3 or sum(times) < budget_s):
        t0 = time.perf_counter()
        out = jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - t0)
        if w.threads_state:
            args = (out[0], *args[1:])
    return statistics.median(times), args


def compile_times(w: Workload, args: tuple):
    """Seconds to trace, lower and compile a fresh jit of w.fn, and the compiled program."""

    def fresh(*a):  # a new function object: no tracing or compilation cache applies
        return w.fn(*a)

    t0 = time.perf_counter()
    traced = jax.jit(fresh, **w.jit_kwargs).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    return {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2}, compiled


def measure(name: str, size: str, B: int, repeats: int, budget_s: float) -> dict:
    config, L = SIZES[size]
    w = build(name, config, B, L)
    row = {"workload": name, "size": size, "batch": B, "length": L}
    times, compiled = compile_times(w, w.args)
    row |= times
    args = w.args
    eager_s, args = time_calls(w.fn, w, args, repeats, budget_s)

    def no_jit(*a):
        with jax.disable_jit():
            return w.fn(*a)

    disable_s, args = time_calls(no_jit, w, args, repeats, budget_s)
    jit_s, _ = time_calls(compiled, w, args, repeats, budget_s)  # what jax.jit(w.fn) runs
    build_s = row["trace_s"] + row["lower_s"] + row["compile_s"]
    saved = eager_s - jit_s
    row |= {
        "eager_ms": 1e3 * eager_s,
        "disable_jit_ms": 1e3 * disable_s,
        "jit_ms": 1e3 * jit_s,
        "speedup": eager_s / jit_s,
        "speedup_vs_disable_jit": disable_s / jit_s,
        "break_even_calls": math.ceil(build_s / saved) if saved > 0 else None,
    }
    return row


def markdown(rows: list[dict], device: str) -> str:
    lines = [
        f"Device: {device}. Times per call (medians); compile = trace + lower + compile.",
        "",
        "| workload | size | batch | eager ms | disable_jit ms | jit ms | speed-up | "
        "trace s | lower s | compile s | break-even calls |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['size']} | {r['batch']} | {r['eager_ms']:.2f} | "
            f"{r['disable_jit_ms']:.2f} | {r['jit_ms']:.3f} | {r['speedup']:.1f}x | "
            f"{r['trace_s']:.3f} | {r['lower_s']:.3f} | {r['compile_s']:.2f} | "
            f"{'never' if r['break_even_calls'] is None else r['break_even_calls']} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: pathlib.Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [f"{r['workload']}\n{r['size']} B={r['batch']}" for r in rows]
    xs = np.arange(len(rows))
    ax1.bar(xs, [r["speedup"] for r in rows], color="tab:blue")
    ax1.set_yscale("log")
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.set_ylabel("jit speed-up over eager (x)")
    ax2.bar(xs, [r["break_even_calls"] or 1e7 for r in rows], color="tab:orange")
    ax2.set_yscale("log")
    ax2.set_ylabel("calls until compiling pays off")
    for ax in (ax1, ax2):
        ax.set_xticks(xs, labels, rotation=90, fontsize=6)
    fig.suptitle(f"jaxformer: XLA (jax.jit) vs eager, {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small grid (< 3 min on 2 cores)")
    parser.add_argument("--out", default="results/xla_vs_eager")
    args = parser.parse_args(argv)
    if args.quick:
        grid = [(w, s, B) for s, B in (("tiny", 1), ("tiny", 8), ("small", 8)) for w in WORKLOADS]
        grid += [(w, "paper_base", 1) for w in ("attention", "encoder_layer", "decoder_layer")]
        repeats, budget = 9, 0.5
    else:
        grid = [(w, s, B) for s in SIZES for B in (1, 8, 32) for w in WORKLOADS]
        repeats, budget = 10, 10.0

    device = (
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {jax.device_count()} device(s))"
    )
    rows = []
    t_start = time.perf_counter()
    for name, size, B in grid:
        row = measure(name, size, B, repeats, budget)
        rows.append(row)
        print(
            f"{name:14s} {size:10s} B={B:<3d} eager {row['eager_ms']:9.2f} ms  "
            f"disable_jit {row['disable_jit_ms']:9.2f} ms  jit {row['jit_ms']:8.3f} ms  "
            f"x{row['speedup']:7.1f}  compile {row['trace_s'] + row['lower_s'] + row['compile_s']:6.2f} s  "
            f"break-even {row['break_even_calls']}",
            flush=True,
        )

    from experiments.throughput import machine_info  # one description of the machine

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "rows": rows,
        "sizes": {s: {"config": c.to_dict(), "length": L} for s, (c, L) in SIZES.items()},
        "quick": args.quick,
        "wall_s": time.perf_counter() - t_start,
        "machine": machine_info() | {"device": device, "flax": _version("flax")},
        "optax": _version("optax"),
    }
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    out.with_suffix(".md").write_text(markdown(rows, device))
    plot(rows, out.with_suffix(".png"), device)

    headline = {"device": device}
    for name in WORKLOADS:
        mine = [r for r in rows if r["workload"] == name]
        if mine:
            headline[name] = {
                "speedup_min": round(min(r["speedup"] for r in mine), 2),
                "speedup_max": round(max(r["speedup"] for r in mine), 2),
                "break_even_max": max(
                    (r["break_even_calls"] for r in mine),
                    key=lambda n: math.inf if n is None else n,
                ),
            }
    print(json.dumps(headline))
    return headline


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
