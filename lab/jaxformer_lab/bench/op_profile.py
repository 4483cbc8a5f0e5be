"""Where a jitted step spends its time on a CPU, operation by operation, in a form that
two JAX releases can be compared in.

`trace_steps(steps, n)` traces n steps with jax.profiler, each waited for inside a trace
annotation (MARK and its number); `per_step` gives each of XLA's operations
(profile_step.xla_events) to the step whose annotation it starts in. An operation is named
by its `label`, as stable across releases as JAX's naming is: its HLO instruction's
op_name (the JAX code it came from, jit's name dropped; or the instruction's name without
its number) and its result's shape. `summarise` gives per label and per kind (profile_step.kind_of) the ms per
step, medians over the steps with their intervals (stats.best_median_ci); `differences`
names the labels and kinds whose intervals on two lines do not overlap, the largest first.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import tempfile

from jaxformer_lab.bench import hlo_profile, stats
from jaxformer_lab.bench.profile_step import kind_of, xla_events

MARK = "profiled step "


def trace_steps(steps, n: int) -> tuple[list[dict], list[dict]]:
    """(XLA's operations, the n step annotations) of n calls of `steps(1)` traced with
    jax.profiler; each call waits for its step, so its operations fall inside it."""
    import jax

    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        for i in range(n):
            with jax.profiler.TraceAnnotation(f"{MARK}{i}"):
                steps(1)
        jax.profiler.stop_trace()
        trace = next(pathlib.Path(tmp).rglob("perfetto_trace.json.gz"))
        events = json.load(gzip.open(trace))
        ops = xla_events(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    marks = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith(MARK)]
    return ops, sorted(marks, key=lambda e: e["ts"])


def per_step(ops: list[dict], marks: list[dict]) -> list[list[dict]]:
    """The operations of each step: those that start inside its annotation."""
    steps = [[] for _ in marks]
    for op in ops:
        for i, m in enumerate(marks):
            if m["ts"] <= op["ts"] <= m["ts"] + m["dur"]:
                steps[i].append(op)
                break
    return steps


def labels(hlo_text: str) -> dict[str, str]:
    """Each instruction of an optimized HLO module by name: its `label`."""
    hlo, _ = hlo_profile.parse_hlo(hlo_text)
    return {name: label(name, i.op_name, i.shapes) for name, i in hlo.items()}


def label(name: str, op_name: str, shapes: tuple) -> str:
    """ "code [shape]": the op_name without its leading jit(...) (the JAX code it came from,
    which a release fuses or calls differently: a dot in one is a ynn_fusion in another),
    else the name without its number (copy.1063: copy); and the first result's dimensions."""
    code = re.sub(r"^jit\([^/]*\)/", "", op_name) or re.sub(r"\.\d+$", "", name)
    return code + (f" [{','.join(map(str, shapes[0]))}]" if shapes else "")


def summarise(steps: list[list[dict]], names: dict[str, str], marks: list[dict]) -> dict:
    """Per step its wall (the annotation) and busy (the operations' summed) ms, per kind
    and per label its ms; each a median over the steps with its interval, labels sorted
    by their median, the largest first."""

    def ci(values: list[float]) -> dict:
        out = stats.best_median_ci(values)
        return {k: round(out[k], 4) for k in ("median", "low", "high", "confidence")}

    by_kind, by_label = [], []
    for ops in steps:
        k_ms, l_ms = collections.Counter(), collections.Counter()
        for op in ops:
            k_ms[kind_of(op["name"])] += op["dur"] / 1e3
            l_ms[names.get(op["name"], re.sub(r"\.\d+$", "", op["name"]))] += op["dur"] / 1e3
        by_kind.append(k_ms)
        by_label.append(l_ms)

    def each(counters: list[collections.Counter]) -> dict[str, dict]:
        keys = set().union(*counters)
        out = {key: ci([c[key] for c in counters]) for key in keys}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["median"]))

    return dict(
        steps=len(steps),
        wall_ms=ci([m["dur"] / 1e3 for m in marks]),
        busy_ms=ci([sum(op["dur"] for op in s) / 1e3 for s in steps]),
        kinds=each(by_kind),
        ops=each(by_label),
    )


def differences(a: dict, b: dict, top: int = 8) -> dict:
    """Where two summaries (`summarise`) differ beyond their intervals: the kinds and the
    labels (at most `top`, the largest difference first) whose intervals do not overlap,
    each with both medians and b - a; and the sum of those labels' differences beside
    the difference of the busy times."""

    def apart(x: dict | None, y: dict | None) -> bool:
        x, y = x or _ZERO, y or _ZERO
        return x["low"] > y["high"] or y["low"] > x["high"]

    def row(key: str, x: dict | None, y: dict | None) -> dict:
        x, y = x or _ZERO, y or _ZERO
        return dict(key=key, a=x, b=y, delta_ms=round(y["median"] - x["median"], 4))

    kinds = [
        row(k, a["kinds"].get(k), b["kinds"].get(k))
        for k in sorted(set(a["kinds"]) | set(b["kinds"]))
    ]
    kinds = [r for r in kinds if apart(r["a"], r["b"])]
    keys = set(a["ops"]) | set(b["ops"])
    ops = [
        row(k, a["ops"].get(k), b["ops"].get(k))
        for k in keys
        if apart(a["ops"].get(k), b["ops"].get(k))
    ]
    ops.sort(key=lambda r: -abs(r["delta_ms"]))
    busy = b["busy_ms"]["median"] - a["busy_ms"]["median"]
    return dict(
        kinds=kinds,
        ops=ops[:top],
        ops_apart=len(ops),
        delta_of_ops_apart_ms=round(sum(r["delta_ms"] for r in ops), 3),
        delta_busy_ms=round(busy, 3),
    )


_ZERO = {"median": 0.0, "low": 0.0, "high": 0.0}
