"""The XLA-vs-eager lab: when compiling pays off, why, what it costs, and how JAX compares
with PyTorch, for the same model, batch and data (`jaxformer bench xla-vs-eager`).

Modes, per workload (workloads.py: attention, one layer, the forward pass, a train step):

    eager               the pure function f(state, *inputs) = nnx.merge(...)(*inputs), not
                        compiled: JAX dispatches each primitive (and each inner jit) alone
    disable_jit         the same under jax.disable_jit(), which also unrolls the jits
                        inside library code (jax.nn, optax)
    jit                 jax.jit(f): jax.jit over nnx.split / nnx.merge (the state donated
                        where the call changes it), as jaxformer's trainer runs
    jit, no donation    (train step) the same without donating the state
    jit, auto attention (attention) jit through JAX's best kernel for the device
    nnx.jit             nnx.jit over the module object: NNX traverses its graph each call
    nnx.cached_partial  nnx.jit with the module's graph traversal cached
    torch               the torch.nn equivalent with the same weights, eager
    torch.compile       the torch module under torch.compile (default mode)
    torch.compile step  (train step) the whole torch step compiled: loss, zero_grad, Adam
    torch.compile reduce-overhead   (CUDA only: CUDA graphs) the module in that mode

Every mode's first two outputs are compared with jit's. Then the modes are timed in
interleaved rounds; each round is a pair, so every speed-up and ratio is the median of
per-round ratios with its 95% order-statistic interval. First calls (compiling included)
and memory are measured in fresh processes, `repeats` of them per mode, each with a fresh
JAX persistent cache and a fresh Inductor cache; break-even calls are counted from each
mode's first call. Why: what eager dispatches, the Python of nnx.merge / nnx.state, XLA's
FLOPs and bytes (unfused and fused) against the machine's measured GEMM peak and memory
bandwidth, and a fitted model of eager time (eager_model.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.bench import eager_model, programs, stats
from jaxformer.bench.workloads import WORKLOADS, Workload, bench_config, build
from jaxformer.checks import BadValue

JAX_MODES = ("eager", "disable_jit", "jit", "nnx.jit", "nnx.cached_partial")
TORCH_MODES = ("torch", "torch.compile")
# Pairs (slow, compiled) whose break-even the report gives: eager's first call against the
# compiled mode's, both from fresh processes.
BREAK_EVEN = (
    ("eager", "jit"),
    ("torch", "torch.compile"),
    ("torch", "torch.compile step"),
    ("torch", "torch.compile reduce-overhead"),
)


def torch_device() -> str | None:
    """Where torch runs beside JAX ("cuda" on an NVIDIA GPU, else "cpu"); None without
    torch. Sets torch's intra-op threads to XLA's (see `threads`)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(xla_threads())
    if jax.default_backend() == "gpu" and torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default on a GPU
        return "cuda"
    torch.set_float32_matmul_precision("highest")
    return "cpu"


def xla_threads() -> int:
    """XLA's CPU intra-op threads: its pool has one per core this process may run on."""
    return len(os.sched_getaffinity(0))


def modes_of(w: Workload, device: str | None) -> tuple[str, ...]:
    """The modes this workload runs in on this machine (see the module doc)."""
    modes = list(JAX_MODES)
    if w.stateful:
        modes.append("jit, no donation")
    if w.name == "attention":
        modes.append("jit, auto attention")
    if device is not None:
        modes += TORCH_MODES
        if w.stateful:
            modes.append("torch.compile step")
        if device == "cuda":
            modes.append("torch.compile reduce-overhead")
    return tuple(modes)


def pure_function(w: Workload):
    """(f, state): f(state, *inputs) -> output (and the new state where the call changes
    the module), the module's call as a function of its split state."""
    graphdef, state = nnx.split(w.module)

    def f(state, *inputs):
        module = nnx.merge(graphdef, state)
        out = module(*inputs)
        return (out, nnx.state(module)) if w.stateful else out

    return f, state


def python_call(w: Workload) -> Callable[[], Any]:
    """The Python that eager and jit-over-split/merge wrap around the module's call, alone:
    nnx.merge of the state (and nnx.state of the result where the call changes it)."""
    graphdef, state = nnx.split(w.module)

    def call():
        module = nnx.merge(graphdef, state)
        return nnx.state(module) if w.stateful else module

    return call


def mode_calls(w: Workload, device: str | None, modes: tuple[str, ...]) -> dict:
    """Mode name -> a call of the workload in that mode that waits for its output and
    returns it, for each of `modes`. Each mode has its own copy of the state."""
    return {mode: _mode_call(w, device, mode) for mode in modes}


def _mode_call(w: Workload, device: str | None, mode: str) -> Callable[[], Any]:
    f, state = pure_function(w)
    donate = 0 if w.stateful else ()
    if mode == "eager":
        return _threaded(f, state, w)
    if mode == "disable_jit":
        return _threaded(f, state, w, jax.disable_jit)
    if mode == "jit":
        return _threaded(jax.jit(f, donate_argnums=donate), state, w)
    if mode == "jit, no donation":
        return _threaded(jax.jit(f), state, w)
    if mode == "jit, auto attention":
        best = nnx.clone(w.module)
        best.implementation = "auto"
        return _threaded(jax.jit(pure_function(replace(w, module=best))[0]), state, w)
    if mode == "nnx.jit":
        module = nnx.clone(w.module)
        step = nnx.jit(lambda m, *a: m(*a))
        return lambda: jax.block_until_ready(step(module, *w.inputs))
    if mode == "nnx.cached_partial":
        cached = nnx.cached_partial(nnx.jit(lambda m, *a: m(*a)), nnx.clone(w.module))
        return lambda: jax.block_until_ready(cached(*w.inputs))
    return _torch_mode(w, device, mode)


def _torch_mode(w: Workload, device: str, mode: str) -> Callable[[], Any]:
    import torch

    module, inputs, call = w.torch(device)
    if mode == "torch":
        return _torch_call(module, inputs, call, device)
    torch.compiler.reset()  # compile for these shapes alone, not dynamic ones
    if mode == "torch.compile":
        return _torch_call(torch.compile(module), inputs, call, device)
    if mode == "torch.compile step":
        return _torch_call(module, inputs, torch.compile(call), device)
    if mode == "torch.compile reduce-overhead":
        compiled = torch.compile(module, mode="reduce-overhead")
        return _torch_call(compiled, inputs, call, device)
    raise BadValue(f"unknown mode {mode!r}")


def _threaded(f, state, w: Workload, context=contextlib.nullcontext):
    box = [jax.tree.map(jnp.copy, state)]

    def call():
        with context():
            out = f(box[0], *w.inputs)
            if w.stateful:
                out, box[0] = out
            return jax.block_until_ready(out)

    return call


def _torch_call(module, inputs, call, device):
    import torch

    def run():
        out = call(module, *inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return run


def agreement(first: dict[str, list], tolerance: float) -> dict:
    """Per mode, the max abs difference of its first outputs from jit's, relative to the
    largest of jit's, and whether it is within `tolerance`."""
    ref = [np.asarray(o, np.float64) for o in first["jit"]]
    scale = max(float(np.abs(r).max()) for r in ref) or 1.0
    out = {}
    for mode, outputs in first.items():
        diff = max(
            float(np.abs(np.asarray(_numpy(o), np.float64) - r).max())
            for o, r in zip(outputs, ref, strict=True)
        )
        out[mode] = {"max_abs_diff": diff, "agrees": diff <= tolerance * scale}
    return out


def _numpy(x):
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, np.float32)


def program_counts(w: Workload) -> dict:
    """What the workload's program is made of (programs.py): what eager dispatches, jaxpr
    equations, HLO ops and fusions, FLOPs and bytes, XLA's memory plan, from the jit mode's
    program (donated as the jit mode)."""
    f, state = pure_function(w)
    lowered = jax.jit(f, donate_argnums=0 if w.stateful else ()).lower(state, *w.inputs)
    compiled = lowered.compile()
    return {
        "dispatches": programs.dispatches(f, state, *w.inputs),
        "jaxpr_equations": programs.jaxpr_equations(f, state, *w.inputs),
        **programs.hlo_counts(lowered, compiled),
        **programs.cost(lowered, compiled),
        "memory_plan": programs.memory_plan(compiled),
    }


def measure_workload(
    w: Workload, device, rounds: int, tolerance: float, modes: tuple[str, ...], fresh=None
) -> dict:
    """Agreement, paired interleaved timings, program counts and (with `fresh`, the
    fresh-process first calls and memory of `fresh_measurements`) break-even calls."""
    calls = mode_calls(w, device, modes)
    first = {mode: [_numpy(call()), _numpy(call())] for mode, call in calls.items()}
    times = stats.time_interleaved(calls | {"python": python_call(w)}, rounds, warmup=1)
    row = {
        "workload": w.name,
        "batch": w.batch,
        "length": w.length,
        "d_model": w.config.d_model,
        "layers": w.config.num_encoder_layers,
        "times": times,
        "timing": {mode: stats.median_ci(t) for mode, t in times.items()},
        "ratios": paired_ratios(times),
        "agreement": agreement(first, tolerance),
        "counts": program_counts(w),
    }
    if fresh is not None:
        row["fresh"] = fresh
        row["break_even"] = break_evens(times, fresh)
    return row


def paired_ratios(times: dict[str, list[float]]) -> dict:
    """Every mode against jit ("eager / jit" is jit's speed-up over eager), and each torch
    compilation against torch eager: medians of per-round ratios with 95% intervals."""
    out = {f"{m} / jit": stats.paired_ratio(t, times["jit"]) for m, t in times.items()}
    del out["jit / jit"], out["python / jit"]
    for slow, fast in BREAK_EVEN[1:]:
        if fast in times:
            out[f"{slow} / {fast}"] = stats.paired_ratio(times[slow], times[fast])
    return out


def break_evens(times: dict[str, list[float]], fresh: dict) -> dict:
    """Break-even calls of each (slow, compiled) pair in BREAK_EVEN that ran."""
    out = {}
    for slow, fast in BREAK_EVEN:
        if fast in times and "first_call_s" in fresh.get(fast, {}):
            saving = stats.paired_saving(times[slow], times[fast])
            first = (fresh[slow]["first_call_s"], fresh[fast]["first_call_s"])
            out[fast] = stats.break_even(*first, saving) | {"saving_s": saving}
    return out


def fresh_measurements(w_args: dict, modes: tuple[str, ...], repeats: int) -> dict:
    """Per mode, from `repeats` fresh processes (each its own JAX persistent cache and
    Inductor cache): the first call's seconds (median_ci; compiling included) and, from
    the first process, the memory of one call (see `_fresh_probe`). Modes outside
    BREAK_EVEN get one process (memory only)."""
    timed = {m for pair in BREAK_EVEN for m in pair}
    out = {}
    for mode in modes:
        runs = [_fresh_run(mode, w_args) for _ in range(repeats if mode in timed else 1)]
        ok = [r for r in runs if "error" not in r]
        if not ok:
            out[mode] = {"error": runs[0]["error"]}
            continue
        samples = [r["first_call_s"] for r in ok]
        out[mode] = ok[0] | {"first_call_s": stats.best_median_ci(samples), "samples": samples}
    return out


def _fresh_run(mode: str, w_args: dict) -> dict:
    probe = (
        f"from jaxformer.bench.xla_vs_eager import _fresh_probe; _fresh_probe({mode!r}, {w_args!r})"
    )
    with tempfile.TemporaryDirectory() as jax_cache, tempfile.TemporaryDirectory() as inductor:
        env = dict(
            os.environ,
            XLA_PYTHON_CLIENT_PREALLOCATE="false",
            JAX_COMPILATION_CACHE_DIR=jax_cache,
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            TORCHINDUCTOR_CACHE_DIR=inductor,
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
        )
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"error": (result.stderr.strip().splitlines() or ["no output"])[-1]}


def _fresh_probe(mode: str, w_args: dict) -> None:
    """In a fresh process, the same for every mode: build the call, time its first call
    (compiling included), call it once more (warm-up), reset the peak, and measure the rise
    of memory over one more call; the arguments are resident before the reset, so they
    are excluded on every side. Prints one JSON line."""
    w_args = dict(w_args)
    config = bench_config(w_args.pop("d_model"), w_args.pop("layers"), dtype=w_args.pop("dtype"))
    w = build(config=config, **w_args)
    device = torch_device() if mode.startswith("torch") else None
    call = _mode_call(w, device, mode)
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    call()
    before = _memory_now(device, reset=True)
    call()
    print(json.dumps({"first_call_s": first, "peak_rise_bytes": max(0, _peak(device) - before)}))


def _memory_now(device: str | None, reset: bool) -> int:
    """Bytes in use now, resetting the peak: torch's allocator on CUDA (torch modes), JAX's
    device (its peak cannot be reset: the warm-up call's, the same program, is in it),
    else the process's resident memory (VmRSS, peak reset through clear_refs)."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    if jax.default_backend() == "gpu" and device is None:
        return jax.devices()[0].memory_stats()["bytes_in_use"]
    return _resident(reset=reset)


def _peak(device: str | None) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated()
    if jax.default_backend() == "gpu" and device is None:
        return jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    return _resident("VmHWM")


def _resident(field: str = "VmRSS", reset: bool = False) -> int:
    """The process's resident bytes (VmRSS) or their peak (VmHWM) from /proc/self/status;
    reset=True first resets the peak to the current size (Linux >= 4.0)."""
    if reset:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def torch_attention_path(w: Workload, device: str) -> list[str]:
    """The attention-related aten ops one torch call ran (its fused fast path shows as
    _native_multi_head_attention, _transformer_encoder_layer_fwd or a
    _scaled_dot_product_* kernel), from torch's profiler."""
    import torch

    module, inputs, call = w.torch(device)
    with torch.profiler.profile() as prof:
        call(module, *inputs)
    keys = {e.key for e in prof.key_averages()}
    words = ("attention", "multi_head", "transformer_encoder", "scaled_dot_product")
    return sorted(k for k in keys if any(word in k for word in words))


def dispatch_costs(rounds: int, device: str | None, calls_per_round: int = 200) -> dict:
    """Microseconds per call of a trivial program (x + 1 on 8 numbers) in each mode: what
    one primitive costs op by op, one jitted call, NNX's ways of calling a jitted module,
    and one torch op."""
    x = jnp.ones(8)
    module = nnx.Linear(8, 8, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(module)
    jitted = jax.jit(lambda x: x + 1.0)
    split_merge = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    nnx_jitted = nnx.jit(lambda m, x: m(x))
    cached = nnx.cached_partial(nnx.jit(lambda m, x: m(x)), nnx.clone(module))

    def loop(fn):
        def run():
            for _ in range(calls_per_round):
                out = fn()
            jax.block_until_ready(out)

        return run

    calls = {
        "eager primitive": loop(lambda: x + 1.0),
        "jit call": loop(lambda: jitted(x)),
        "jit split/merge module call": loop(lambda: split_merge(state, x)),
        "nnx.jit module call": loop(lambda: nnx_jitted(module, x)),
        "nnx.cached_partial module call": loop(lambda: cached(x)),
    }
    if device is not None:
        import torch

        t = torch.ones(8, device=device)
        calls["torch primitive"] = loop(lambda: t + 1.0)
    times = stats.time_interleaved(calls, rounds, warmup=1)
    return {
        name: {
            k: v * 1e6 / calls_per_round if k in ("median", "low", "high") else v
            for k, v in stats.median_ci(t).items()
        }
        for name, t in times.items()
    }


def machine_roofs(rounds: int, quick: bool) -> dict:
    """The machine's measured float32 GEMM peak ([N, N] @ [N, N], FLOP/s) and memory
    bandwidth (y = x * 2 over a large array: bytes read + written per second), medians
    with 95% intervals over `rounds` calls."""
    gpu = jax.default_backend() == "gpu"
    n = 8192 if gpu else (512 if quick else 2048)
    size = (1 << 28 if gpu else 1 << 24) // 4  # float32 numbers in 256 MiB (GPU), 16 MiB
    a = jnp.ones((n, n), jnp.float32)
    x = jnp.ones(size, jnp.float32)
    matmul, scale = jax.jit(jnp.matmul), jax.jit(lambda x: x * 2)
    times = stats.time_interleaved(
        {
            "gemm": lambda: matmul(a, a).block_until_ready(),
            "stream": lambda: scale(x).block_until_ready(),
        },
        rounds,
    )
    gemm = stats.median_ci([2 * n**3 / t for t in times["gemm"]])
    stream = stats.median_ci([2 * 4 * size / t for t in times["stream"]])
    return {"gemm_flops": gemm, "gemm_n": n, "bandwidth_bytes": stream, "stream_bytes": 8 * size}


def jax_attention_path(w: Workload) -> str:
    """The attention kernel JAX ran: "xla" for the attention workload's jit (its
    "jit, auto attention" mode: what "auto" picks), the model's config otherwise."""
    from jaxformer.functional.attention import choose_implementation

    c = w.config
    q = jnp.zeros((w.batch, w.length, c.num_heads, c.d_model // c.num_heads), c.dtype)
    auto = choose_implementation(q, q, q, masked=True, dropout_rate=0.0)
    if w.name == "attention":
        return f"xla (jit, auto attention: {auto})"
    return auto if c.attention_impl == "auto" else c.attention_impl


SCALE_MODES = ("eager", "jit", "torch", "torch.compile")


def scale_sweep(axes: dict, center: dict, layers, rounds, device, tolerance, dtype) -> list:
    """The forward pass in SCALE_MODES at `center` (d_model, batch, length) with one of
    them moved along each axis in `axes`: rows as measure_workload's (no fresh processes,
    so no break-even), one per point."""
    modes = SCALE_MODES if device is not None else SCALE_MODES[:2]
    rows, seen = [], {}
    for axis, values in axes.items():
        for value in values:
            point = center | {axis: value}
            key = tuple(sorted(point.items()))
            if key not in seen:
                config = bench_config(point["d_model"], layers, dtype=dtype)
                w = build("forward", config, point["batch"], point["length"])
                seen[key] = measure_workload(w, device, rounds, tolerance, modes)
                _say(f"scale {axis}={value}", seen[key])
            rows.append(seen[key] | {"axis": axis, "value": value})
    return rows


def model_terms(row: dict) -> dict:
    """A row's inputs to eager_model: its counts and the medians of eager and Python."""
    c = row["counts"]
    return {
        "dispatches": c["dispatches"]["total"],
        "bytes_unfused": c["bytes_unfused"],
        "bytes_fused": c["bytes_fused"],
        "flops": c["flops"],
        "python_s": row["timing"]["python"]["median"],
        "eager_s": row["timing"]["eager"]["median"],
    }


def explain(rows: list[dict], scale: list[dict] | None) -> dict:
    """The fitted eager model over every workload and scale point, each workload's
    eager-jit gap (paired median saving) split into its terms, and per scale axis the
    crossover (jit's speed-up through 2) measured and predicted."""
    distinct = {(r["d_model"], r["batch"], r["length"]): r for r in scale or []}
    points = rows + list(distinct.values())  # the sweep's center once, not once per axis
    model = eager_model.fit([model_terms(r) for r in points])
    gaps = {}
    for r in rows:
        saving = stats.paired_saving(r["times"]["eager"], r["times"]["jit"])
        gaps[r["workload"]] = eager_model.explain_gap(model, model_terms(r), saving["median"])
    crossovers = {}
    for axis in dict.fromkeys(r["axis"] for r in scale or []):
        mine = [r for r in scale if r["axis"] == axis]
        xs = [r["value"] for r in mine]
        predicted = [eager_model.predict(model, model_terms(r)) for r in mine]
        crossovers[axis] = {
            "measured": eager_model.crossover(
                xs, [r["ratios"]["eager / jit"]["median"] for r in mine]
            ),
            "predicted": eager_model.crossover(xs, [p["eager_s"] / p["jit_s"] for p in predicted]),
            "predicted_speedups": [p["eager_s"] / p["jit_s"] for p in predicted],
        }
    return {"model": model, "gaps": gaps, "crossovers": crossovers}


def _say(label: str, row: dict) -> None:
    t = {m: f"{v['median'] * 1e3:.3g}" for m, v in row["timing"].items()}
    speedup = row["ratios"]["eager / jit"]
    print(
        f"{label:24s} ms/call "
        + "  ".join(f"{m} {v}" for m, v in t.items())
        + f"  jit speed-up {speedup['median']:.2f} ({speedup['low']:.2f}-{speedup['high']:.2f})",
        flush=True,
    )


def run(args) -> dict:
    """The whole lab (`jaxformer bench xla-vs-eager` options in args): every workload in
    every mode, fresh-process first calls and memory, dispatch costs, the machine's roofs,
    the scale sweep and the fitted model; writes <out>/report.md, report.json, modes.png,
    scale.png, roofline.png; returns the headline."""
    if args.rounds < 6:
        raise BadValue(f"--rounds must be >= 6 for a 95% interval of the median, got {args.rounds}")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 7)
    if repeats < 1:
        raise BadValue(f"--repeats must be >= 1, got {repeats}")
    if pathlib.Path(args.out).exists() and not pathlib.Path(args.out).is_dir():
        raise BadValue(f"--out {args.out} is a file; the report needs a folder")
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    jax_cache, inductor = tempfile.TemporaryDirectory(), tempfile.TemporaryDirectory()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor.name  # before torch is imported
    jax.config.update("jax_compilation_cache_dir", jax_cache.name)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    device = None if args.no_torch else torch_device()
    point = (
        dict(d_model=64, layers=1, batch=4, length=16)
        if args.quick
        else dict(d_model=256, layers=2, batch=16, length=64)
    )
    config = bench_config(point["d_model"], point["layers"], dtype=args.dtype)
    gpu = jax.default_backend() == "gpu"
    tolerance = 5e-2 if args.dtype == "bfloat16" else (2e-2 if gpu else 1e-4)  # TF32 on GPUs
    rows = []
    for name in WORKLOADS:
        w = build(name, config, point["batch"], point["length"])
        modes = modes_of(w, device)
        fresh = fresh_measurements(dict(name=name, dtype=args.dtype, **point), modes, repeats)
        row = measure_workload(w, device, args.rounds, tolerance, modes, fresh)
        row["attention_path"] = {"jax": jax_attention_path(w)}
        if device is not None:
            row["attention_path"]["torch"] = torch_attention_path(w, device)
        rows.append(row)
        _say(name, row)
    axes = (
        {"d_model": [64, 128, 256], "batch": [1, 8, 32], "length": [16, 32, 64]}
        if args.quick
        else {"d_model": [64, 128, 256, 512], "batch": [1, 4, 16, 64], "length": [16, 64, 256]}
    )
    center = dict(d_model=128, batch=8, length=32)
    scale = (
        None
        if args.no_scale
        else scale_sweep(axes, center, point["layers"], args.rounds, device, tolerance, args.dtype)
    )
    result = {
        "command": "jaxformer bench xla-vs-eager" + " ".join(_flags(args)),
        "model": f"d_model {point['d_model']}, {point['layers']}+{point['layers']} layers, "
        f"d_ff {4 * point['d_model']}, {config.num_heads} heads, vocabulary "
        f"{config.vocab_size}, batch {point['batch']} x {point['length']} tokens, "
        f"{args.dtype} compute",
        "quick": args.quick,
        "note": args.note,
        "dtype": args.dtype,
        "point": point,
        "rounds": args.rounds,
        "repeats": repeats,
        "tolerance": tolerance,
        "workloads": rows,
        "dispatch_us": dispatch_costs(args.rounds, device),
        "roofs": machine_roofs(args.rounds, args.quick),
        "scale": scale,
        "scale_center": center,
        "why": explain(rows, scale),
        "memory_measure": "device's peak bytes in use" if gpu else "process's resident peak",
        "machine": _machine(device) | {"load_before": load_before},
    }
    result["machine"]["load_after"] = os.getloadavg()[0]
    result["wall_s"] = time.perf_counter() - start
    return write(result, pathlib.Path(args.out))


def _flags(args) -> list[str]:
    flags = [""]
    if args.quick:
        flags.append("--quick")
    if args.dtype != "float32":
        flags.append(f"--dtype {args.dtype}")
    if args.no_torch:
        flags.append("--no-torch")
    if args.no_scale:
        flags.append("--no-scale")
    return flags


def write(result: dict, out: pathlib.Path) -> dict:
    """report.json, report.md and the plots in `out`; prints and returns the headline."""
    from jaxformer.bench import report

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(report.markdown(result))
    report.plots(result, out)
    headline = {"device": result["machine"]["device"], "report": str(out / "report.md")}
    for r in result["workloads"]:
        headline[r["workload"]] = {
            "jit_speedup": _round(r["ratios"]["eager / jit"]),
            "jit_break_even": r["break_even"]["jit"]["verdict"],
            "jit_break_even_calls": r["break_even"]["jit"]["calls"],
        }
        if "torch / jit" in r["ratios"]:
            headline[r["workload"]]["torch_over_jit"] = _round(r["ratios"]["torch / jit"])
    print(json.dumps(headline))
    return headline


def _round(ci: dict) -> list[float]:
    return [round(ci[k], 2) for k in ("median", "low", "high")]


def _machine(device: str | None) -> dict:
    import platform
    from importlib.metadata import version

    d = jax.devices()[0]
    info = {
        "device": f"{d.device_kind} ({jax.default_backend()})",
        "jax": jax.__version__,
        "flax": version("flax"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "xla_intra_op_threads": xla_threads(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    if device is not None:
        import torch

        info |= {
            "torch": torch.__version__,
            "torch_device": device,
            "torch_threads": torch.get_num_threads(),
        }
    return info
