"""What a JAX program is made of, read from the program itself: what eager mode dispatches
(primitive binds, each inner jit one call), jaxpr equations with inner jits inlined, HLO
instructions before and after XLA's optimisation, fusions, XLA's cost analysis (FLOPs,
bytes accessed unfused and fused) and its memory plan; and what one call really launched,
read from JAX's profiler (`launched`)."""

from __future__ import annotations

import collections
import pathlib
import re
import tempfile
from collections.abc import Callable

import jax

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+ = \S")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OPCODE = re.compile(r"([a-z][\w\-]*)\(")  # after the shape: "f32[8]{0} fusion(%p), ..."


# Equations whose body eager mode runs op by op (their bodies are counted); every other
# equation, an inner jit (`jit`, `pjit`), `cond`, `while` and `scan` included, is one call.
_EAGER_INLINES = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "closed_call")


def dispatches(fn, *args) -> dict:
    """What calling fn(*args) eagerly dispatches, from its jaxpr (make_jaxpr keeps inner
    jits as single equations): {"primitives": binds of single primitives, "jit_calls":
    inner jits and control-flow calls, each one compiled call, "total": their sum}.
    custom_jvp / custom_vjp bodies are counted inside, as eager runs them op by op. A
    gradient counts the forward and backward equations of its jaxpr, which eager runs."""
    counts = {"primitives": 0, "jit_calls": 0}
    _count_calls(jax.make_jaxpr(fn)(*args).jaxpr, counts)
    return counts | {"total": counts["primitives"] + counts["jit_calls"]}


def _count_calls(jaxpr, counts: dict) -> None:
    for eqn in jaxpr.eqns:
        inner = list(_sub_jaxprs(eqn.params))
        if not inner:
            counts["primitives"] += 1
        elif eqn.primitive.name in _EAGER_INLINES:
            for j in inner:
                _count_calls(j, counts)
        else:
            counts["jit_calls"] += 1


def jaxpr_equations(fn, *args) -> int:
    """Primitive applications in fn's jaxpr with every nested call (jit, custom_jvp, ...)
    inlined: the program's size, not what eager dispatches (see `dispatches`). A loop body
    counts once."""
    return _count(jax.make_jaxpr(fn)(*args).jaxpr)


def _count(jaxpr) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        inner = [_count(j) for j in _sub_jaxprs(eqn.params)]
        total += sum(inner) if inner else 1
    return total


def _sub_jaxprs(params: dict):
    for value in params.values():
        for v in value if isinstance(value, tuple | list) else (value,):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def hlo_counts(lowered, compiled) -> dict:
    """HLO instructions before optimisation (all), after it (those of the computations the
    program runs, not of the fusions', wrappers' or reducers' bodies they call), and the
    fusions among those. A loop body would count as such a called region: the lab's
    workloads have none (no scan_layers)."""
    before = _instructions(lowered.as_text(dialect="hlo"))
    after = _instructions(compiled.as_text())
    return {
        "hlo_ops_before": sum(len(ops) for ops in before.values()),
        "hlo_ops_after": sum(len(ops) for name, ops in after.items() if not _fused(name)),
        "fusions": sum(
            op == "fusion" for name, ops in after.items() if not _fused(name) for op in ops
        ),
    }


def _fused(computation: str) -> bool:
    return "fused" in computation or computation.startswith(("wrapped_", "region_"))


def _instructions(text: str) -> dict[str, list[str]]:
    """HLO text -> {computation name: the opcodes of its instructions}."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            m = _COMPUTATION.match(line)
            if m and "HloModule" not in line:
                current = m.group(2)
                out[current] = []
        elif line.strip() == "}":
            current = None
        elif _INSTRUCTION.match(line):
            out[current].append(_OPCODE.search(line.split(" = ", 1)[1]).group(1))
    return out


def cost(lowered, compiled) -> dict:
    """XLA's cost analysis: FLOPs, and bytes accessed by the program before optimisation
    (every op reads its inputs from memory and writes its output: eager's traffic) and
    after it (fused: what the compiled program moves)."""
    before, after = _cost_dict(lowered.cost_analysis()), _cost_dict(compiled.cost_analysis())
    return {
        "flops": float(after.get("flops", before.get("flops", 0.0))),
        "bytes_unfused": float(before.get("bytes accessed", 0.0)),
        "bytes_fused": float(after.get("bytes accessed", 0.0)),
    }


def _cost_dict(analysis) -> dict:
    return (analysis[0] if isinstance(analysis, list | tuple) else analysis) or {}


def memory_plan(compiled) -> dict | None:
    """XLA's plan for the compiled program, in bytes (None where the backend has none)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return {
        "arguments": stats.argument_size_in_bytes,
        "outputs": stats.output_size_in_bytes,
        "aliased": stats.alias_size_in_bytes,
        "temporaries": stats.temp_size_in_bytes,
    }


# Profiler events, one per compiled executable launched (PJRT's execute helper, by client:
# CPU and the common client, then the StreamExecutor GPU client), and one per array put
# on the device from the host (jax's DevicePut, on every backend).
LAUNCH_EVENTS = (
    "CommonPjRtLoadedExecutable::ExecuteHelperOnSingleDevice",
    "PjRtStreamExecutorLoadedExecutable::ExecuteHelper",
)
TRANSFER_EVENTS = ("DevicePut",)


def launched(call: Callable[[], object]) -> dict:
    """What one call of `call` (warm: compiled already) launched, counted from a trace of
    JAX's profiler (host events only, no Python tracing): {"launches": executables run,
    "transfers": host-to-device puts, "events": the counted event names and counts}.
    launches is None where no known launch event was seen (a backend whose client names
    its events otherwise: "events" then lists what was seen, for a new LAUNCH_EVENTS)."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder, profiler_options=options)
        try:
            call()
        finally:
            jax.profiler.stop_trace()
        counts = collections.Counter()
        for path in pathlib.Path(folder).rglob("*.xplane.pb"):
            data = jax.profiler.ProfileData.from_file(str(path))
            for plane in data.planes:
                counts.update(e.name for line in plane.lines for e in line.events)
    launch = next((name for name in LAUNCH_EVENTS if counts[name]), None)
    known = {name: counts[name] for name in (*LAUNCH_EVENTS, *TRANSFER_EVENTS) if counts[name]}
    if launch is None:
        known = {k: v for k, v in counts.items() if "Execut" in k or "Transfer" in k}
    return {
        "launches": counts[launch] if launch else None,
        "transfers": sum(counts[name] for name in TRANSFER_EVENTS),
        "events": known,
    }
