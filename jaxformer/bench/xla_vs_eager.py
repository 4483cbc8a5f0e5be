"""The XLA-vs-eager lab: when compiling pays off, why, what it costs, and how JAX compares
with PyTorch, for the same model, batch and data (`jaxformer bench xla-vs-eager`).

Modes, per workload (workloads.py: attention, one layer, the forward pass, a train step):

    eager               the pure function f(state, *inputs) = nnx.merge(...)(*inputs), not
                        compiled: JAX dispatches each primitive on its own (op by op)
    disable_jit         the same under jax.disable_jit(), which also unrolls the jits
                        inside library code (jax.nn, optax)
    jit                 jax.jit(f): jax.jit over nnx.split / nnx.merge (the state donated
                        where the call changes it), as jaxformer's trainer runs
    nnx.jit             nnx.jit over the module object: NNX traverses its graph each call
    nnx.cached_partial  nnx.jit with the module's graph traversal cached
    torch               the torch.nn equivalent with the same weights, eager
    torch.compile       the same under torch.compile (default mode)

Every mode's first two outputs are compared with jit's (the train step's are the losses of
two steps); a mode that disagrees is flagged in the report. Then the modes are timed in
interleaved rounds (median, 95% interval). Costs: trace, lower and compile seconds of a
fresh jax.jit (persistent compilation cache cold, then warm) and torch.compile's first call;
break-even calls = compile cost / per-call saving ("never" where not faster). Why: jaxpr
equations, HLO ops before and after optimisation, fusions, XLA's memory plan against eager's
measured peak, the dispatch cost of one primitive, and on a GPU the kernels launched and
the device time per call from the profiler.
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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.bench import programs, stats
from jaxformer.bench.workloads import WORKLOADS, Workload, bench_config, build
from jaxformer.checks import BadValue

JAX_MODES = ("eager", "disable_jit", "jit", "nnx.jit", "nnx.cached_partial")
TORCH_MODES = ("torch", "torch.compile")


def torch_device() -> str | None:
    """Where torch runs beside JAX ("cuda" on an NVIDIA GPU, else "cpu"); None without torch."""
    try:
        import torch
    except ImportError:
        return None
    if jax.default_backend() == "gpu" and torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default on a GPU
        return "cuda"
    torch.set_float32_matmul_precision("highest")
    return "cpu"


def pure_function(w: Workload):
    """(f, state): f(state, *inputs) -> output (and the new state where the call changes
    the module), the module's call as a function of its split state."""
    graphdef, state = nnx.split(w.module)

    def f(state, *inputs):
        module = nnx.merge(graphdef, state)
        out = module(*inputs)
        return (out, nnx.state(module)) if w.stateful else out

    return f, state


def mode_calls(
    w: Workload, device: str | None, modes: tuple[str, ...] = JAX_MODES + TORCH_MODES
) -> dict[str, Callable[[], Any]]:
    """Mode name -> a call of the workload in that mode that waits for its output and
    returns it, for `modes` (jit always; torch's where `device` is not None). Each mode
    has its own copy of the state."""
    f, state = pure_function(w)
    calls = {
        "eager": _threaded(f, state, w),
        "disable_jit": _threaded(f, state, w, jax.disable_jit),
        "jit": _threaded(jax.jit(f, donate_argnums=0 if w.stateful else ()), state, w),
    }
    module = nnx.clone(w.module)
    step = nnx.jit(lambda m, *a: m(*a))
    calls["nnx.jit"] = lambda: jax.block_until_ready(step(module, *w.inputs))
    cached = nnx.cached_partial(nnx.jit(lambda m, *a: m(*a)), nnx.clone(w.module))
    calls["nnx.cached_partial"] = lambda: jax.block_until_ready(cached(*w.inputs))
    calls = {m: c for m, c in calls.items() if m in modes or m == "jit"}
    if device is not None and "torch" in modes:
        import torch

        calls["torch"] = _torch_call(*w.torch(device), device)
        torch.compiler.reset()  # compile for these shapes alone, not dynamic ones
        module_t, inputs_t, call_t = w.torch(device)
        calls["torch.compile"] = _torch_call(torch.compile(module_t), inputs_t, call_t, device)
    return calls


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
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def compile_costs(w: Workload) -> dict:
    """Seconds to trace, lower and compile a fresh jax.jit of the workload with the
    persistent compilation cache cold, then warm (a second fresh function: a cache hit);
    the compiled program's counts and memory plan."""
    f, state = pure_function(w)
    out = {}
    for cache in ("cold", "warm"):

        def fresh(*a):  # a new function object: JAX's in-memory caches do not apply
            return f(*a)

        t0 = time.perf_counter()
        traced = jax.jit(fresh, donate_argnums=0 if w.stateful else ()).trace(state, *w.inputs)
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2 = time.perf_counter()
        compiled = lowered.compile()
        t3 = time.perf_counter()
        out[cache] = {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2}
        out[cache]["total_s"] = t3 - t0
    out["jaxpr_equations"] = programs.jaxpr_equations(f, state, *w.inputs)
    out |= programs.hlo_counts(lowered, compiled)
    out["memory_plan"] = programs.memory_plan(compiled)
    return out


def measure_workload(
    w: Workload, device: str | None, rounds: int, tolerance: float, modes=JAX_MODES + TORCH_MODES
) -> dict:
    """Agreement, interleaved timings and every cost of one workload (see the module doc)."""
    costs = compile_costs(w)
    calls = mode_calls(w, device, modes)
    first, first_call_s = {}, {}
    for mode, call in calls.items():
        t0 = time.perf_counter()
        out1 = call()
        first_call_s[mode] = time.perf_counter() - t0
        first[mode] = [_numpy(out1), _numpy(call())]
    agree = agreement(first, tolerance)
    times = stats.time_interleaved(calls, rounds, warmup=1)
    timing = {mode: stats.median_ci(t) for mode, t in times.items()}
    row = {
        "workload": w.name, "batch": w.batch, "length": w.length,
        "d_model": w.config.d_model, "layers": w.config.num_encoder_layers,
        "timing": timing, "agreement": agree, "first_call_s": first_call_s, "costs": costs,
    }  # fmt: skip
    row["break_even"] = {
        "jit": stats.break_even(costs["cold"]["total_s"], timing["eager"], timing["jit"]),
        "jit_warm_cache": stats.break_even(
            costs["warm"]["total_s"], timing["eager"], timing["jit"]
        ),
    }
    if "torch.compile" in timing:
        compile_s = first_call_s["torch.compile"] - timing["torch.compile"]["median"]
        row["costs"]["torch_compile_s"] = compile_s
        row["break_even"]["torch.compile"] = stats.break_even(
            compile_s, timing["torch"], timing["torch.compile"]
        )
    gpu = jax.default_backend() == "gpu" and modes == JAX_MODES + TORCH_MODES
    row["gpu_profile"] = gpu_profiles(calls) if gpu else None
    return row


def gpu_profiles(calls: dict, n: int = 5) -> dict:
    """Kernels launched and device milliseconds per call (GPU only), from jax.profiler's
    trace of the device, which records torch's kernels as well as JAX's (one profiler:
    CUPTI takes a single subscriber per process). Wall time minus device time is the
    host's share (dispatch, Python)."""
    out = {}
    for mode in ("eager", "jit", *TORCH_MODES):
        if mode in calls:
            try:
                out[mode] = _device_profile(calls[mode], n)
            except Exception as e:  # a profiler that fails here is reported, not fatal
                out[mode] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _device_profile(call, n: int) -> dict:
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            for _ in range(n):
                call()
        (path,) = list(pathlib.Path(tmp).rglob("*.xplane.pb"))
        data = ProfileData.from_file(str(path))
    kernels = []
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    kernels += [(e.start_ns, e.end_ns) for e in line.events]
    return {"kernels_per_call": len(kernels) / n, "device_ms_per_call": _busy_ns(kernels) / n / 1e6}


def _busy_ns(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans: time the device was busy."""
    busy, end = 0.0, -np.inf
    for s, e in sorted(spans):
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy


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
        name: {k: v * 1e6 / calls_per_round if k != "n" else v for k, v in ci.items()}
        for name, ci in ((n, stats.median_ci(t)) for n, t in times.items())
    }


def memory(w_args: dict) -> dict:
    """Each mode's measured memory for one call in a fresh process (eager and jit): the rise
    of the device's peak bytes in use on a GPU, of the process's resident peak on a CPU.
    The process reads this one's persistent compilation cache (eager's primitives too)."""
    out = {}
    for mode in ("eager", "jit"):
        probe = f"from jaxformer.bench.xla_vs_eager import _memory_probe; _memory_probe({mode!r}, {w_args!r})"
        env = dict(
            os.environ,
            XLA_PYTHON_CLIENT_PREALLOCATE="false",
            JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
        )
        lines = result.stdout.strip().splitlines()
        if result.returncode == 0 and lines:
            out[mode] = json.loads(lines[-1])
        else:  # reported, not dropped
            out[mode] = {"error": (result.stderr.strip().splitlines() or ["no output"])[-1]}
    return out


def _memory_probe(mode: str, w_args: dict) -> None:
    config = bench_config(w_args.pop("d_model"), w_args.pop("layers"))
    w = build(config=config, **w_args)
    f, state = pure_function(w)
    fn = jax.jit(f).lower(state, *w.inputs).compile() if mode == "jit" else f
    if mode == "eager":
        jax.block_until_ready(f(state, *w.inputs))  # JAX compiles each primitive once
    gpu = jax.default_backend() == "gpu"
    before = jax.devices()[0].memory_stats()["bytes_in_use"] if gpu else _resident(reset=True)
    jax.block_until_ready(fn(state, *w.inputs))
    after = jax.devices()[0].memory_stats()["peak_bytes_in_use"] if gpu else _resident("VmHWM")
    print(json.dumps({"peak_rise_bytes": max(0, after - before)}))


def _resident(field: str = "VmRSS", reset: bool = False) -> int:
    """The process's resident bytes (VmRSS) or their peak (VmHWM) from /proc/self/status;
    reset=True first resets the peak to the current size (Linux >= 4.0)."""
    if reset:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


SCALE_MODES = ("eager", "jit", "torch", "torch.compile")


def scale_sweep(axes: dict, center: dict, layers: int, rounds: int, device, tolerance) -> list:
    """The forward pass in SCALE_MODES at `center` (d_model, batch, length) with one of
    them moved along each axis in `axes`: rows as measure_workload's, one per point."""
    rows, seen = [], {}
    for axis, values in axes.items():
        for value in values:
            point = center | {axis: value}
            key = tuple(sorted(point.items()))
            if key not in seen:
                config = bench_config(point["d_model"], layers)
                w = build("forward", config, point["batch"], point["length"])
                seen[key] = measure_workload(w, device, rounds, tolerance, SCALE_MODES)
                _say(f"scale {axis}={value}", seen[key])
            rows.append(seen[key] | {"axis": axis, "value": value})
    return rows


def _say(label: str, row: dict) -> None:
    t = {m: f"{v['median'] * 1e3:.3g}" for m, v in row["timing"].items()}
    first = row["first_call_s"]["eager"]
    print(f"{label:24s} ms/call " + "  ".join(f"{m} {v}" for m, v in t.items())
          + f"  (eager's first call {first:.1f} s)", flush=True)  # fmt: skip


def run(args) -> dict:
    """The whole lab (`jaxformer bench xla-vs-eager` options in args): every workload in
    every mode, dispatch costs, memory, the scale sweep; writes <out>/report.md,
    report.json, modes.png, scale.png; returns the headline."""
    if args.rounds < 6:
        raise BadValue(f"--rounds must be >= 6 for a 95% interval of the median, got {args.rounds}")
    if pathlib.Path(args.out).exists() and not pathlib.Path(args.out).is_dir():
        raise BadValue(f"--out {args.out} is a file; the report needs a folder")
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    cache = tempfile.TemporaryDirectory()  # a fresh persistent cache: cold, then warm
    jax.config.update("jax_compilation_cache_dir", cache.name)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    device = None if args.no_torch else torch_device()
    point = (
        dict(d_model=64, layers=1, batch=4, length=16)
        if args.quick
        else dict(d_model=256, layers=2, batch=16, length=64)
    )
    config = bench_config(point["d_model"], point["layers"])
    tolerance = 2e-2 if jax.default_backend() == "gpu" else 1e-4  # TF32 products on a GPU
    rows = []
    for name in WORKLOADS:
        w = build(name, config, point["batch"], point["length"])
        row = measure_workload(w, device, args.rounds, tolerance)
        row["memory"] = memory(dict(name=name, **point))
        rows.append(row)
        _say(name, row)
    dispatch = dispatch_costs(args.rounds, device)
    axes = (
        {"d_model": [64, 128, 256], "batch": [1, 8, 32], "length": [16, 32, 64]}
        if args.quick
        else {"d_model": [64, 128, 256, 512], "batch": [1, 4, 16, 64], "length": [16, 64, 256]}
    )
    center = dict(d_model=128, batch=8, length=32)
    scale = (
        None
        if args.no_scale
        else scale_sweep(axes, center, point["layers"], args.rounds, device, tolerance)
    )
    result = {
        "command": "jaxformer bench xla-vs-eager" + (" --quick" if args.quick else ""),
        "model": f"d_model {point['d_model']}, {point['layers']}+{point['layers']} layers, "
        f"d_ff {4 * point['d_model']}, {config.num_heads} heads, vocabulary "
        f"{config.vocab_size}, batch {point['batch']} x {point['length']} tokens, float32",
        "point": point, "rounds": args.rounds, "tolerance": tolerance,
        "workloads": rows, "dispatch_us": dispatch, "scale": scale, "scale_center": center,
        "memory_measure": "device's peak bytes in use" if jax.default_backend() == "gpu"
        else "process's resident peak",
        "machine": _machine(device) | {"load_before": load_before, "load_after": os.getloadavg()[0]},
        "wall_s": time.perf_counter() - start,
    }  # fmt: skip
    return write(result, pathlib.Path(args.out))


def write(result: dict, out: pathlib.Path) -> dict:
    from jaxformer.bench import report

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(report.markdown(result))
    report.plots(result, out)
    headline = {"device": result["machine"]["device"], "report": str(out / "report.md")}
    for r in result["workloads"]:
        t = r["timing"]
        headline[r["workload"]] = {
            "jit_speedup": round(t["eager"]["median"] / t["jit"]["median"], 1),
            "jit_break_even_calls": r["break_even"]["jit"],
            "nnx_jit_over_jit": round(t["nnx.jit"]["median"] / t["jit"]["median"], 2),
        }
        if "torch" in t:
            headline[r["workload"]]["torch_over_jit"] = round(
                t["torch"]["median"] / t["jit"]["median"], 2
            )
    print(json.dumps(headline))
    return headline


def _machine(device: str | None) -> dict:
    import platform
    from importlib.metadata import version

    d = jax.devices()[0]
    info = {
        "device": f"{d.device_kind} ({jax.default_backend()})", "jax": jax.__version__,
        "flax": version("flax"), "python": platform.python_version(), "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }  # fmt: skip
    if device is not None:
        import torch

        info |= {"torch": torch.__version__, "torch_device": device}
    return info
