"""The report's why and its summary: what each program is (counted, and launched as the
profiler saw), where an eager call's time goes, and the fitted model of eager time with its
out-of-sample scores, checks against the machine and crossovers (validate.py's figures);
every figure with its interval."""

from __future__ import annotations

from jaxformer_lab.bench.fmt import figure, g, mark, ms, part_of, pct, share, x
from jaxformer_lab.bench.validate import CONSTANT_NAMES
from jaxformer_lab.markdown import table


def summary(result: dict) -> list[str]:
    """The verdicts in a few sentences, each figure with its interval (a page quotes these)."""
    rows = result["workloads"]
    if not rows:
        return []
    lines = ["", "## Summary", ""]
    lines.append(
        "- **jit over eager JAX** (paired per-round ratios): "
        + "; ".join(f"{_named(result, r)} {x(r['ratios']['eager / jit'])}" for r in rows)
        + "."
    )
    firsts = [
        f"{r['workload']}{mark(result, *part_of(r['workload'], 'jit'))}: "
        f"{r['break_even']['jit']['verdict']} (eager's first call "
        f"{r['fresh']['eager']['first_call_s']['median']:.2f} s, jit's "
        f"{r['fresh']['jit']['first_call_s']['median']:.2f} s)"
        for r in rows
        if "jit" in r.get("break_even", {})
    ]
    if firsts:
        lines.append(
            "- **jit's first call** against eager's (fresh processes): " + "; ".join(firsts) + "."
        )
    lines += _torch_summary(result, rows, result.get("lab", 1) >= 2)
    why = result.get("why")
    if why:
        held = [p["error"] for p in why["held_out"]["by_point"]]
        fails = sum(p["verdict"] == "fails" for p in why["held_out"]["by_point"])
        lines.append(
            f"- **The fitted model** misses its own points by a median "
            f"{share(why['in_sample_error'])} in sample; left out one at a time, its errors "
            f"range {min(h['median'] for h in held):+.0%} to {max(h['median'] for h in held):+.0%} "
            f"and {fails} of {len(held)} points fail (error beyond +-20% with 95% confidence); "
            "see *Where the model fails*."
        )
    if result.get("load", {}).get("loaded_parts"):
        lines.append(
            "- **Measured under load**: see the marked sections; these are not quiet timings."
        )
    return lines


def _torch_summary(result: dict, rows: list[dict], op_by_op: bool) -> list[str]:
    """torch eager against jit, and each torch.compile mode against torch eager, in words
    (an earlier lab's 'torch' was torch's default path, fused where it applies)."""
    out = []
    said = [
        f"{_named(result, r)} {x(r['ratios']['torch / jit'])} "
        f"({_faster(r['ratios']['torch / jit'], 'jit', 'torch')})"
        for r in rows
        if "torch / jit" in r["ratios"]
    ]
    if said:
        what = "op by op" if op_by_op else "torch's default path, fused where it applies"
        out.append(f"- **torch eager ({what}) / jit**: " + "; ".join(said) + ".")
    compiled = [
        f"{_named(result, r)} {name.split(' / ')[1]} {x(ci)} "
        f"({_faster(ci, name.split(' / ')[1], 'torch')})"
        for r in rows
        for name, ci in r["ratios"].items()
        if name.startswith("torch / ") and name != "torch / jit"
    ]
    if compiled:
        out.append("- **torch eager / its other modes**: " + "; ".join(compiled) + ".")
    return out


def _named(result: dict, r: dict) -> str:
    """A workload's name, marked where its part ran under load."""
    return r["workload"] + mark(result, r["workload"])


def _faster(ci: dict, second: str, first: str) -> str:
    """Which side of a paired ratio first / second is faster, if either is."""
    if ci["low"] > 1:
        return f"{second} faster"
    if ci["high"] < 1:
        return f"{first} faster"
    return "no significant difference"


def programs(result: dict) -> list[str]:
    rows = result["workloads"]
    roofs = result.get("roofs")
    if not rows or not roofs:
        return []
    lines = [
        "",
        "## Why: what each program is and does",
        "",
        "Dispatches, estimated: the jaxpr with inner jits kept (primitives + jitted calls, "
        "custom_jvp/vjp bodies counted inside). Launched and puts: what one warm eager call "
        "launched (compiled executables) and put on the device from the host (DevicePut), "
        "counted from JAX's profiler (exact for that call). FLOPs and bytes: XLA's cost "
        "analysis before optimisation (unfused: eager's traffic) and after (fused). jit's "
        "rates: over jit's median time (interval from its interval). " + _roofs_line(result),
        "",
        *figure(result, "roofline.png"),
    ]
    table_rows = []
    for r in rows:
        c, jit = r["counts"], r["timing"]["jit"]
        d, launched = c["dispatches"], c.get("launched", {})
        table_rows.append(
            [
                _named(result, r),
                f"{d['total']:,} ({d['primitives']:,} + {d['jit_calls']})",
                _launched(launched.get("eager")),
                _launched(launched.get("eager, functional")),
                _launched(launched.get("jit")),
                f"{c['jaxpr_equations']:,}",
                f"{c['hlo_ops_before']:,} / {c['hlo_ops_after']:,} / {c['fusions']:,}",
                f"{c['flops'] / 1e6:.3g}",
                f"{c['bytes_unfused'] / 1e6:.3g} / {c['bytes_fused'] / 1e6:.3g}",
                _rate(c["flops"], jit),
                _rate(c["bytes_fused"], jit),
            ]
        )
    columns = ["workload", "dispatches, estimated", "eager: launched, puts"]
    columns += ["eager functional: launched, puts", "jit: launched, puts", "equations"]
    columns += ["HLO before / after / fusions", "MFLOP", "MB unfused / fused"]
    columns += ["jit GFLOP/s", "jit GB/s"]
    return lines + table(columns, table_rows, "l" + "r" * 10)


def _launched(m: dict | None) -> str:
    if not m:
        return ""
    if m["launches"] is None:
        return f"not recognised ({', '.join(m['events'])})"
    return f"{m['launches']:,}, {m['transfers']:,}"


def _rate(amount: float, t: dict) -> str:
    return g(
        {"median": amount / t["median"], "low": amount / t["high"], "high": amount / t["low"]}, 1e-9
    )


def _roofs_line(result: dict) -> str:
    roofs = result["roofs"]
    gemm = roofs["gemm_flops"]
    cores = (result.get("machine") or {}).get("xla_intra_op_threads") or 1
    clocks = "; ".join(
        f"{g(gemm, 1e-9 / cores / f)} GHz at {f} FLOP per cycle per core ({isa})"
        for f, isa in ((32, "two 256-bit FMA units"), (64, "two 512-bit FMA units"))
    )
    return (
        f"The machine, measured in the run{mark(result, 'host')}: GEMM ({roofs['gemm_n']}^3) "
        f"{g(gemm, 1e-9)} GFLOP/s, memory {g(roofs['bandwidth_bytes'], 1e-9)} GB/s (median, "
        f"95% interval); the GEMM rate needs {clocks} on {cores} cores."
    )


def eager_call(result: dict) -> list[str]:
    why = result.get("why")
    if not why:
        return []
    d = result["dispatch_us"]
    lines = [
        "",
        "## Where an eager call's time goes (ms per call)",
        "",
        "Python: nnx.merge (and nnx.state) alone, timed in the same rounds. Dispatch: the "
        "launches x one trivial eager primitive "
        f"({g(d['eager primitive'])} us) + the puts x one host-to-device put, where the "
        "profiler counted them (else the estimate: primitives x one primitive + inner jits x "
        "one jitted call). Compiled: jit's whole call. Rest: eager minus the three (unfused "
        "compute, and Python the first two do not hold: NNX's own split/merge inside "
        "nnx.value_and_grad and the optimizer). Intervals: " + why["resampled"] + ".",
        "",
    ]
    rows = []
    for name, gap in why["gaps"].items():
        e = gap["eager_call"]
        keys = ("eager_s", "python_s", "dispatch_s", "compiled_s", "rest_s")
        rows.append([name + mark(result, name), *(ms(e[k]) for k in keys)])
    columns = ["workload", "eager", "Python", "dispatch", "compiled (jit)", "rest"]
    return lines + table(columns, rows, "lrrrrr")


def model(result: dict) -> list[str]:
    why = result.get("why")
    if not why:
        missing = result.get("why_missing")
        return ["", f"The fitted model is not shown: {missing}."] if missing else []
    c = why["constants"]
    lines = [
        "",
        "## A fitted model of eager time, and where it fails"
        + mark(result, "host", "scale", *(r["workload"] for r in result["workloads"])),
        "",
        "eager = Python + a x dispatches + b x unfused bytes + c x FLOPs, fitted by "
        f"non-negative least squares (relative errors) to {why['points']} points (the "
        f"workloads and the scale sweep's distinct points), dispatches {why['dispatches']} "
        f"(see above): a = {_unit(c['a_us'], 'us per dispatch')}, 1/b = "
        f"{_unit(c['bandwidth_gb_s'], 'GB/s')}, 1/c = {_unit(c['rate_gflop_s'], 'GFLOP/s')}; "
        "median error on its own points "
        f"{share(why['in_sample_error'])}. Intervals: {why['resampled']}.",
        "",
    ]
    rows = [
        [CONSTANT_NAMES[k["constant"]], g(k["fitted"]), g(k["measured"]), k["what"], k["relation"]]
        for k in why["checks"]
    ]
    lines += table(
        ["constant", "fitted", "measured in this run", "what", "fitted is"], rows, "lrrll"
    )
    return lines + _held_out(why) + _gaps(why) + _crossovers(why) + _failures(why)


def _unit(ci: dict, unit: str) -> str:
    text = g(ci)
    return text if text.startswith("none") else f"{text} {unit}"


def _held_out(why: dict) -> list[str]:
    h = why["held_out"]
    lines = [
        "",
        "Scored on points it was not fitted to (relative error of the predicted eager time; "
        "'holds' within +-20% with 95% confidence, 'fails' beyond it, else 'uncertain'):",
        "",
    ]
    rows = [["left out alone", p["point"], pct(p["error"]), p["verdict"]] for p in h["by_point"]]
    for prog, res in h["by_program"].items():
        if res.get("error"):
            rows.append([f"all of {prog} left out", prog, res["error"], ""])
        elif len(res["points"]) > 1:
            rows += [
                [
                    f"all of {prog} left out ({res['fitted_on']} points fitted)",
                    p["point"],
                    pct(p["error"]),
                    p["verdict"],
                ]
                for p in res["points"]
            ]
    if h["extrapolation"]:
        e = h["extrapolation"]
        rows += [
            [
                f"fitted to the smaller scales ({e['fitted_on']} points)",
                p["point"],
                pct(p["error"]),
                p["verdict"],
            ]
            for p in e["points"]
        ]
    return lines + table(["held out", "point", "error (95% interval)", "verdict"], rows, "llrl")


def _gaps(why: dict) -> list[str]:
    lines = [
        "",
        "The gap eager - jit (median per-round saving) split by the fitted model: Python, "
        "a x (dispatches - 1), b x (unfused - fused bytes), and what is left; beside it the "
        "dispatches at the measured cost of a trivial primitive. Shares of the gap:",
        "",
    ]
    parts = ("python", "dispatch", "unfused_bytes", "residual", "dispatch_at_measured_cost")
    rows = [
        [name, ms(gp["gap_s"]), *(share(gp[k]["share"]) for k in parts)]
        for name, gp in why["gaps"].items()
    ]
    columns = ["workload", "gap ms", "Python", "dispatch (fitted a)", "unfused bytes", "residual"]
    return lines + table(columns + ["dispatch (measured cost)"], rows, "lrrrrrr")


def _crossovers(why: dict) -> list[str]:
    if not why["crossovers"]:
        return []
    lines = [
        "",
        "Crossover along each scale axis: where jit's speed-up over eager falls through 2, "
        "measured and predicted; given only where the points on either side have intervals "
        "wholly on either side of 2 and 97.5% of the replicates cross within the sweep.",
        "",
    ]
    rows = [
        [axis, _crossing(c["measured"]), _crossing(c["predicted"])]
        for axis, c in why["crossovers"].items()
    ]
    return lines + table(["axis", "measured", "predicted"], rows, "lll")


def _crossing(c: dict) -> str:
    if c["established"]:
        return g(c["value"])
    return f"not established: {c['why']}"


def _failures(why: dict) -> list[str]:
    lines = ["", "### Where the model fails", ""]
    if not why["failures"]:
        return lines + ["Nowhere in these points: every held-out prediction holds or is uncertain."]
    return lines + [f"- {f}" for f in why["failures"]]


def predicted_by_point(result: dict) -> dict:
    """(axis, value) -> the model's predicted speed-up there, with its interval."""
    why = result.get("why") or {}
    out = {}
    for axis, c in why.get("crossovers", {}).items():
        out |= {(axis, v): x(s) for v, s in zip(c["values"], c["predicted_speedups"], strict=True)}
    return out
