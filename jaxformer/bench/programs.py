"""What a JAX program is made of, read from the program itself: jaxpr equations (the
primitives eager mode dispatches one by one), HLO instructions before and after XLA's
optimisation, fusions, and XLA's memory plan."""

from __future__ import annotations

import re

import jax

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+ = \S")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OPCODE = re.compile(r"([a-z][\w\-]*)\(")  # after the shape: "f32[8]{0} fusion(%p), ..."


def jaxpr_equations(fn, *args) -> int:
    """Primitive applications in fn's jaxpr with nested calls (pjit, custom_jvp, ...)
    inlined: what op-by-op execution dispatches. A loop body counts once."""
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
