"""The parts of an XLA-vs-eager run (plan.py names them), each a function of a `Context`
returning its JSON result: the host, one workload in every mode, first calls in fresh
processes, the train step in bfloat16, the scale sweep, compile times, and recompilation
under variable lengths."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from jaxformer_lab.bench import compile_costs, fresh, host, modes, programs, stats, torch_side
from jaxformer_lab.bench.plan import TORCH_PAIRS, Profile
from jaxformer_lab.bench.workloads import Workload, bench_config, build

# The modes whose eager launches the profiler counts (and jit's, to show it launches one).
PROFILED = ("eager", "eager, functional", "jit")


@dataclass
class Context:
    """What every part needs: the plan's sizes, rounds and repeats, the compute dtype,
    torch's device (None: no torch), the agreement tolerance, a progress printer, and
    torch's interpreter (pythons.describe) where torch runs in another one (torch_side)."""

    profile: Profile
    rounds: int
    repeats: int
    dtype: str
    device: str | None
    tolerance: float
    say: Callable[[str], None]
    torch_python: dict | None = None

    @property
    def remote(self) -> str | None:
        """The interpreter that runs torch's modes in a worker (None: this process)."""
        return self.torch_python["path"] if self.torch_python else None


def part_function(name: str) -> Callable[[Context], dict]:
    """The function that measures part `name`."""
    if name == "host":
        return measure_host
    if name.startswith("first-calls-"):
        return lambda ctx: measure_first_calls(ctx, name)
    fixed = {
        "bf16-train_step": measure_bf16,
        "scale": measure_scale,
        "compile": measure_compile,
        "recompile": measure_recompile,
    }
    return fixed.get(name) or (lambda ctx: measure_workload_part(ctx, name))


def measure_host(ctx: Context) -> dict:
    """The machine, its roofs, trivial calls' costs and NNX's overheads by graph size; a
    torch in another interpreter runs its trivial op in a worker (torch_side)."""
    p = ctx.profile
    ctx.say("  roofs, dispatch costs, NNX overheads")
    machine = host.machine_info(None if ctx.remote else ctx.device)
    remote = None
    if ctx.remote and ctx.device:
        remote = torch_side.Remote(ctx.remote, ctx.device, {"primitive": host.DISPATCH_CALLS})
        said = remote.ready["programs"][torch_side.PRIMITIVE]
        machine |= {"torch": said["torch"], "torch_device": said["device"]}
        machine |= {"torch_threads": said["torch_threads"], "torch_python": ctx.torch_python}
    try:
        extra = remote.calls() if remote else {}
        dispatch = host.dispatch_costs(ctx.rounds, None if ctx.remote else ctx.device, extra)
    finally:
        if remote:
            remote.close()
    return {
        "machine": machine,
        "roofs": host.machine_roofs(ctx.rounds, **p.roofs),
        "dispatch_us": dispatch,
        "nnx_overheads": host.nnx_overheads(ctx.rounds, p.overhead_sizes),
    }


def measure_workload_part(ctx: Context, name: str, dtype: str | None = None) -> dict:
    """One workload of the plan in every mode (modes.modes_of) at the plan's point."""
    p = ctx.profile
    config = bench_config(p.point["d_model"], p.point["layers"], dtype=dtype or ctx.dtype)
    w = build(name, config, p.point["batch"], p.point["length"])
    names = modes.modes_of(w, ctx.device, p.torch_compiled[name])
    explained = set(p.torch_compiled[name]) | ({"torch.compile step"} if w.stateful else set())
    explained = tuple(sorted(explained - set(modes.unavailable(ctx.device))))
    with torch_side.serving(ctx.remote, ctx.device, w, names, explained) as remote:
        row = measure_workload(ctx, w, names, remote)
        row["attention_path"] = {"jax": jax_attention_path(w)}
        if ctx.device is not None:
            ctx.say("  torch's graphs and breaks (torch._dynamo.explain)")
            row["torch_ops"] = remote.ask("ops") if remote else torch_ops(w, ctx.device)
            graphs = (
                remote.ask("graphs") if remote else modes.torch_graphs(w, ctx.device, explained)
            )
            row["torch_graphs"] = graphs
    if ctx.device is not None:
        row["attention_path"]["torch"] = {m: o["attention"] for m, o in row["torch_ops"].items()}
        wanted = set(p.torch_compiled[name])
        row["unavailable"] = {
            m: why for m, why in modes.unavailable(ctx.device).items() if m in wanted
        }
    return row


def measure_workload(
    ctx: Context, w: Workload, names: tuple[str, ...], remote: torch_side.Remote | None = None
) -> dict:
    """Agreement with jit, paired interleaved timings (with the Python of nnx.merge alone),
    the program's counts and the launches the profiler saw; `remote` serves the torch
    modes where torch runs in another interpreter."""
    ctx.say(f"  building {len(names)} modes (compiling)")
    here = tuple(m for m in names if remote is None or m not in remote.modes)
    calls = modes.mode_calls(w, ctx.device, here)
    first, built = {}, {}
    for m, call in calls.items():  # the first two calls: compiling, warming caches
        started = time.perf_counter()
        first[m] = [modes.to_numpy(call()), modes.to_numpy(call())]
        built[m] = round(time.perf_counter() - started, 2)
    if remote is not None:
        remote_first, remote_built = remote.first_outputs()
        first, built = first | remote_first, built | remote_built
        calls |= remote.calls()
    slowest = ", ".join(f"{m} {built[m]:.1f} s" for m in sorted(built, key=built.get)[-3:])
    ctx.say(f"  built in {sum(built.values()):.0f} s (longest: {slowest})")
    ctx.say(f"  timing {len(calls)} modes x {ctx.rounds} rounds")
    times = stats.time_interleaved(calls | {"python": modes.python_call(w)}, ctx.rounds, warmup=1)
    counts = program_counts(w)
    counts["launched"] = {m: programs.launched(calls[m]) for m in PROFILED if m in calls}
    return {
        "workload": w.name,
        "batch": w.batch,
        "length": w.length,
        "d_model": w.config.d_model,
        "layers": w.config.num_encoder_layers,
        "dtype": w.config.dtype,
        "times": times,
        "timing": {mode: stats.median_ci(t) for mode, t in times.items()},
        "ratios": paired_ratios(times),
        "agreement": modes.agreement(first, ctx.tolerance),
        "build_s": built,  # each mode's first two calls, compiling included
        "tolerance": ctx.tolerance,
        "counts": counts,
    }


def paired_ratios(times: dict[str, list[float]]) -> dict:
    """Every mode against jit ("eager / jit" is jit's speed-up over eager), torch against
    each of its other modes, and eager NNX against eager functional JAX: medians of
    per-round ratios with 95% intervals."""
    out = {f"{m} / jit": stats.paired_ratio(t, times["jit"]) for m, t in times.items()}
    del out["jit / jit"], out["python / jit"]
    pairs = TORCH_PAIRS + (("eager", "eager, functional"),)
    for slow, fast in pairs:
        if slow in times and fast in times:
            out[f"{slow} / {fast}"] = stats.paired_ratio(times[slow], times[fast])
    return out


def program_counts(w: Workload) -> dict:
    """What the workload's program is made of (programs.py): what eager dispatches by the
    jaxpr, jaxpr equations, HLO ops and fusions, FLOPs and bytes, XLA's memory plan of the
    jit program (donated as the jit mode; a stateful workload's also without donation)."""
    f, state = modes.pure_function(w)
    lowered = jax.jit(f, donate_argnums=0 if w.stateful else ()).lower(state, *w.inputs)
    compiled = lowered.compile()
    out = {
        "dispatches": programs.dispatches(f, state, *w.inputs),
        "jaxpr_equations": programs.jaxpr_equations(f, state, *w.inputs),
        **programs.hlo_counts(lowered, compiled),
        **programs.cost(lowered, compiled),
        "memory_plan": programs.memory_plan(compiled),
    }
    if w.stateful:
        plain = jax.jit(f).lower(state, *w.inputs).compile()
        out["memory_plan_no_donation"] = programs.memory_plan(plain)
    return out


def torch_ops(w: Workload, device: str) -> dict:
    """Per torch eager mode: the aten operators one call dispatched (their number, and the
    attention-related ones by name)."""
    out = {}
    for mode in ("torch", "torch, fast path")[: 1 if w.stateful else 2]:
        ops = modes.torch_ops(modes.mode_call(w, device, mode))
        out[mode] = {"ops": sum(ops.values()), "attention": modes.attention_ops(ops)}
    return out


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


def measure_first_calls(ctx: Context, part: str) -> dict:
    """The part's workload's first calls in fresh processes (fresh.first_calls), in the
    modes the plan names that this machine runs."""
    _, name, wanted = next(f for f in ctx.profile.first_calls if f[0] == part)
    args = dict(name=name, dtype=ctx.dtype, **ctx.profile.point)
    skip = modes.unavailable(ctx.device)
    chosen = tuple(m for m in wanted if (ctx.device or "torch" not in m) and m not in skip)
    fresh_calls = fresh.first_calls(args, chosen, ctx.repeats, ctx.say, torch_python=ctx.remote)
    return {"workload": name, "fresh": fresh_calls}


def measure_bf16(ctx: Context) -> dict:
    """The train step with bfloat16 compute in eager, jit (donated and not), torch under
    autocast, with XLA's memory plans, and the memory of the jit modes from fresh
    processes."""
    p = ctx.profile
    config = bench_config(p.point["d_model"], p.point["layers"], dtype="bfloat16")
    w = build("train_step", config, p.point["batch"], p.point["length"])
    names = ("eager", "jit", "jit, no donation") + (("torch",) if ctx.device else ())
    with torch_side.serving(ctx.remote, ctx.device, w, names) as remote:
        row = measure_workload(ctx, w, names, remote)
    args = dict(name="train_step", dtype="bfloat16", **p.point)
    row["fresh"] = fresh.first_calls(args, ("jit", "jit, no donation"), ctx.repeats, ctx.say)
    return row


def measure_scale(ctx: Context) -> dict:
    """The forward pass in the plan's scale modes at its center with one of d_model,
    batch, length, layers moved along each axis: rows as measure_workload's (no fresh
    processes), one per distinct point, each with its axis and value."""
    p = ctx.profile
    names = p.scale_modes if ctx.device else tuple(m for m in p.scale_modes if "torch" not in m)
    rows, seen = [], {}
    for axis, values in p.scale_axes.items():
        for value in values:
            point = p.scale_center | {axis: value}
            key = tuple(sorted(point.items()))
            if key not in seen:
                ctx.say(f"  scale {axis} = {value}")
                config = bench_config(point["d_model"], point["layers"], dtype=ctx.dtype)
                w = build("forward", config, point["batch"], point["length"])
                with torch_side.serving(ctx.remote, ctx.device, w, names) as remote:
                    seen[key] = measure_workload(ctx, w, names, remote)
            rows.append(seen[key] | {"axis": axis, "value": value})
    return {"rows": rows, "center": p.scale_center}


def measure_compile(ctx: Context) -> dict:
    """Compile times of the train step against depth and width (compile_costs)."""
    p = ctx.profile
    points = [
        q | {"batch": p.point["batch"], "length": p.point["length"]} for q in p.compile_points
    ]
    caches = p.compile_caches
    ctx.say(f"  {len(points)} sizes x {ctx.repeats} repeats x cache {' / '.join(caches)}")
    return {"rows": compile_costs.compile_times(points, ctx.repeats, ctx.dtype, caches)}


def measure_recompile(ctx: Context) -> dict:
    """The variable-length workload (compile_costs.variable_lengths); its torch strategies
    only where torch runs in this process."""
    p = ctx.profile
    ctx.say(f"  lengths {list(p.lengths)}, each strategy's first pass x {ctx.repeats}")
    out = compile_costs.variable_lengths(
        p.recompile_size["d_model"],
        p.recompile_size["batch"],
        list(p.lengths),
        ctx.repeats,
        ctx.rounds,
        None if ctx.remote else ctx.device,
    )
    if ctx.remote and ctx.device:
        out["torch_left_out"] = f"torch runs in another interpreter ({ctx.remote})"
    return out
