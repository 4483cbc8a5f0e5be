"""The XLA-vs-eager lab's report: report.md with its tables (`markdown`; `docs_tables`
renders the same tables from a committed report.json for the documentation), and
modes.png, scale.png, roofline.png."""

from __future__ import annotations

import json
import pathlib

from jaxformer.markdown import table


def _ms(ci: dict | None) -> str:
    if ci is None:
        return ""
    return f"{ci['median'] * 1e3:.3g} ({ci['low'] * 1e3:.3g}-{ci['high'] * 1e3:.3g})"


def _x(ci: dict | None) -> str:
    """A paired ratio: median (95% interval)."""
    return "" if ci is None else f"{ci['median']:.2f} ({ci['low']:.2f}-{ci['high']:.2f})"


def _mib(n: float | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def _first(ci: dict) -> str:
    """A first call's seconds: median and, from several fresh processes, the interval with
    its coverage."""
    if ci["n"] == 1:
        return f"{ci['median']:.2f} (1 process)"
    return (
        f"{ci['median']:.2f} ({ci['low']:.2f}-{ci['high']:.2f}; "
        f"{ci['n']} processes, {ci['confidence']:.0%})"
    )


def _break_even(b: dict) -> str:
    if b["calls"] is None:
        return b["verdict"]
    if b["verdict"] == "from call 1" and b["high"] == 1:
        return "from call 1"
    return f"{b['calls']:,} ({b['low']:,}-{b['high']:,})"


def markdown(result: dict) -> str:
    """The whole report.md."""
    return "# XLA vs eager\n\n" + tables(result)


def docs_tables(report_json: pathlib.Path) -> str:
    """The documentation's XLA-vs-eager tables, rendered from a committed report.json."""
    return tables(json.loads(pathlib.Path(report_json).read_text()))


def tables(result: dict) -> str:
    """Every table of the report, in markdown, from the lab's result dict."""
    sections = [_header, _modes, _ratios, _break_evens, _why, _split, _fit, _memory]
    sections += [_torch_side, _dispatch]
    lines = [line for section in sections for line in section(result)]
    if result.get("scale"):
        lines += _scale(result)
    return "\n".join(lines) + "\n"


def _header(result: dict) -> list[str]:
    m = result["machine"]
    torch = f"torch {m['torch']} ({m['torch_threads']} threads)" if "torch" in m else "no torch"
    label = "**A --quick run** (a tiny model, few repeats). " if result["quick"] else ""
    if result.get("note"):
        label += f"**{result['note']}** "
    return [
        f"{label}`{result['command']}` on {m['device']}: jax {m['jax']}, flax {m['flax']}, "
        f"{torch}, XLA's intra-op threads {m['xla_intra_op_threads']}, {m['cpu_count']} CPU "
        f"cores, load average {m['load_before']:.2f} before and {m['load_after']:.2f} after; "
        f"{result['wall_s']:.0f} s.",
        "",
        f"Model: {result['model']}. Times: median ms per call over {result['rounds']} "
        "interleaved rounds after warm-up (95% interval of the median). Ratios: the median "
        "of per-round ratios (each round is a pair; 95% order-statistic interval).",
    ]


def _modes(result: dict) -> list[str]:
    rows = [
        [r["workload"], mode, _ms(ci)]
        for r in result["workloads"]
        for mode, ci in r["timing"].items()
        if mode != "python"
    ]
    lines = ["", "## Modes: ms per call", "", *table(["workload", "mode", "ms"], rows, "llr")]
    checked = result["workloads"] + (result.get("scale") or [])
    flagged = [
        f"{r['workload']} {r.get('axis', '')} {r.get('value', '')} {mode} ({a['max_abs_diff']:.2g})"
        for r in checked
        for mode, a in r["agreement"].items()
        if not a["agrees"]
    ]
    worst = max(a["max_abs_diff"] for r in checked for a in r["agreement"].values())
    lines += [
        "",
        f"Outputs, here and in the scale sweep: every mode agrees with jit within "
        f"{result['tolerance']:g} of the largest output (largest difference {worst:.2g})."
        if not flagged
        else f"**Outputs that disagree with jit** (max abs difference): {', '.join(flagged)}.",
    ]
    return lines


def _ratios(result: dict) -> list[str]:
    lines = [
        "",
        "## Paired ratios (slower / faster per round; > 1: the second is faster)",
        "",
    ]
    rows = [
        [r["workload"], name, _x(ci), "no" if ci["low"] <= 1 <= ci["high"] else "yes"]
        for r in result["workloads"]
        for name, ci in r["ratios"].items()
    ]
    columns = ["workload", "ratio", "median (95% interval)", "significant"]
    return lines + table(columns, rows, "llrl")


def _break_evens(result: dict) -> list[str]:
    lines = [
        "",
        "## First calls and break-even",
        "",
        f"First calls (compiling included) in fresh processes, each with an empty JAX "
        f"persistent cache and Inductor cache; {result['repeats']} per mode (the interval's "
        "coverage beside it). Break-even: calls until the compiled mode's total time, from "
        "its first call, is below the other's, from its first call; 'not significant' where "
        "the per-call saving's 95% interval contains 0.",
        "",
    ]
    rows = []
    for r in result["workloads"]:
        for fast, b in r["break_even"].items():
            slow = "eager" if fast == "jit" else "torch"
            first = {mode: _first(r["fresh"][mode]["first_call_s"]) for mode in (slow, fast)}
            rows.append(
                [
                    r["workload"],
                    f"{fast} vs {slow}",
                    first[slow],
                    first[fast],
                    _ms(b["saving_s"]),
                    _break_even(b),
                ]
            )
    columns = [
        "workload",
        "compiled",
        "other's first call s",
        "compiled's first call s",
        "saving ms per call",
        "pays off after (calls)",
    ]
    return lines + table(columns, rows, "llrrrr")


def _why(result: dict) -> list[str]:
    roofs = result["roofs"]
    lines = [
        "",
        "## Why: what each program is and does",
        "",
        "Dispatches: what eager runs, from the jaxpr with inner jits kept (primitives + "
        "jitted calls, custom_jvp/vjp bodies counted inside). Equations: the same jaxpr with "
        "every inner jit inlined. FLOPs and bytes: XLA's cost analysis of the program before "
        "optimisation (unfused: eager's traffic) and after (fused). Achieved: over jit's "
        f"median. The machine: GEMM ({roofs['gemm_n']}^3) "
        f"{_rate(roofs['gemm_flops'], 1e9)} GFLOP/s, memory "
        f"{_rate(roofs['bandwidth_bytes'], 1e9)} GB/s (median, 95% interval).",
        "",
        "![roofline](roofline.png)",
        "",
    ]
    rows = []
    for r in result["workloads"]:
        c, jit_s = r["counts"], r["timing"]["jit"]["median"]
        d = c["dispatches"]
        rows.append(
            [
                r["workload"],
                f"{d['total']:,} ({d['primitives']:,} + {d['jit_calls']})",
                f"{c['jaxpr_equations']:,}",
                f"{c['hlo_ops_before']:,}",
                f"{c['hlo_ops_after']:,}",
                f"{c['fusions']:,}",
                f"{c['flops'] / 1e6:.3g}",
                f"{c['bytes_unfused'] / 1e6:.3g}",
                f"{c['bytes_fused'] / 1e6:.3g}",
                f"{c['flops'] / max(c['bytes_fused'], 1):.2f}",
                f"{c['flops'] / jit_s / 1e9:.3g}",
                f"{c['bytes_fused'] / jit_s / 1e9:.3g}",
            ]
        )
    columns = [
        "workload",
        "dispatches (primitives + jits)",
        "equations",
        "HLO before",
        "after",
        "fusions",
        "MFLOP",
        "MB unfused",
        "MB fused",
        "FLOP/byte",
        "jit GFLOP/s",
        "jit GB/s",
    ]
    return lines + table(columns, rows, "l" + "r" * 11)


def _rate(ci: dict, unit: float) -> str:
    return f"{ci['median'] / unit:.3g} ({ci['low'] / unit:.3g}-{ci['high'] / unit:.3g})"


def _split(result: dict) -> list[str]:
    """Eager's call split into measured parts."""
    d = result["dispatch_us"]
    prim, jit_call = d["eager primitive"]["median"], d["jit call"]["median"]
    lines = [
        "",
        "## Where an eager call's time goes (ms per call)",
        "",
        "Python: nnx.merge (and nnx.state) alone, timed in the same rounds. Dispatch: "
        f"primitives x {prim:.1f} us + jitted calls x {jit_call:.1f} us (one trivial call "
        "of each, measured below). Compiled: jit's whole call. Rest: eager minus the three "
        "(its unfused compute, and Python the first two do not hold, such as NNX's own "
        "split/merge inside nnx.value_and_grad and the optimizer).",
        "",
    ]
    rows = []
    for r in result["workloads"]:
        t, dis = r["timing"], r["counts"]["dispatches"]
        eager, python = t["eager"]["median"] * 1e3, t["python"]["median"] * 1e3
        dispatch = (dis["primitives"] * prim + dis["jit_calls"] * jit_call) / 1e3
        compiled = t["jit"]["median"] * 1e3
        rest = eager - python - dispatch - compiled
        ms = (eager, python, dispatch, compiled, rest)
        rows.append([r["workload"], *(f"{x:.3g}" for x in ms)])
    columns = ["workload", "eager", "Python", "dispatch", "compiled (jit)", "rest"]
    return lines + table(columns, rows, "lrrrrr")


def _fit(result: dict) -> list[str]:
    why = result["why"]
    m = why["model"]
    lines = [
        "",
        "## A fitted model of eager time",
        "",
        "eager = Python + a x dispatches + b x unfused bytes + c x FLOPs, fitted by "
        f"non-negative least squares (relative errors) over {m['rows']} points (the "
        f"workloads and the scale sweep): a = {m['a'] * 1e6:.3g} us per dispatch, "
        f"1/b = {_inverse(m['b'], 'GB/s')}, 1/c = {_inverse(m['c'], 'GFLOP/s')}; median "
        f"error of the fitted eager times {m['rel_error']:.0%}. The gap eager - jit (median per-round saving) split by the "
        "model: Python, a x (dispatches - 1), b x (unfused - fused bytes), and what is left.",
        "",
    ]
    parts = ("python", "dispatch", "unfused_bytes", "residual")
    rows = [
        [
            name,
            f"{g['gap'] * 1e3:.3g}",
            *(f"{g[k] * 1e3:.3g} ({g[k] / g['gap']:.0%})" for k in parts),
        ]
        for name, g in why["gaps"].items()
    ]
    columns = ["workload", "gap ms", "Python", "dispatch", "unfused bytes", "residual"]
    lines += table(columns, rows, "lrrrrr")
    if why["crossovers"]:
        lines += [
            "",
            "Crossover along each scale axis: where jit's speed-up over eager falls through "
            "2 (eager's overhead equals the device work), measured (per-round medians, "
            "interpolated) and predicted by the model (marked on scale.png).",
            "",
        ]
        rows = [
            [axis, _where(c["measured"]), _where(c["predicted"])]
            for axis, c in why["crossovers"].items()
        ]
        lines += table(["axis", "measured", "predicted"], rows, "lrr")
    return lines


def _inverse(v: float, unit: str) -> str:
    return "none (the term was fitted at 0)" if v == 0 else f"{1 / v / 1e9:.3g} {unit}"


def _where(x: float | None) -> str:
    return "not within the sweep" if x is None else f"{x:.3g}"


def _memory(result: dict) -> list[str]:
    lines = [
        "",
        "## Memory: one call's rise, each mode in a fresh process",
        "",
        f"Every mode alike: first call, one warm-up call, the arguments resident, then the "
        f"peak reset and one call measured: the rise of the {result['memory_measure']} "
        "(arguments excluded on every side). jit donates the state of the train step, as the "
        "trainer does; the nnx modes and 'jit, no donation' do not; torch updates in place. "
        "XLA's plan: temporaries + outputs - aliased bytes of the jit program.",
        "",
    ]
    rows = []
    for r in result["workloads"]:
        plan = r["counts"]["memory_plan"]
        if plan is not None:
            planned = plan["temporaries"] + plan["outputs"] - plan["aliased"]
            rows.append([r["workload"], "XLA's plan (jit)", _mib(planned), ""])
        for mode, f in r["fresh"].items():
            if "error" in f:
                rows.append([r["workload"], mode, f"failed: {f['error']}", ""])
            else:
                first = f"{f['first_call_s']['median']:.2f}"
                rows.append([r["workload"], mode, _mib(f["peak_rise_bytes"]), first])
    return lines + table(["workload", "mode", "MiB", "first call s"], rows, "llrr")


def _torch_side(result: dict) -> list[str]:
    m = result["machine"]
    if "torch" not in m:
        return ["", "torch was not run (--no-torch or not installed)."]
    graphs = (
        "torch.compile reduce-overhead ran (CUDA graphs)."
        if m["torch_device"] == "cuda"
        else "torch.compile mode reduce-overhead is not run on a CPU: it relies on CUDA graphs."
    )
    lines = [
        "",
        "## PyTorch, made comparable",
        "",
        f"torch's intra-op threads are set to XLA's ({m['xla_intra_op_threads']}; torch "
        f"reports {m['torch_threads']}). torch.compile (module) compiles the module alone; "
        "'torch.compile step' compiles the whole train step (zero_grad, loss, backward, "
        f"Adam) as jax.jit does. Inductor's cache is fresh in every process. {graphs}",
        "",
    ]
    rows = [
        [r["workload"], r["attention_path"]["jax"], ", ".join(r["attention_path"].get("torch", []))]
        for r in result["workloads"]
    ]
    columns = ["workload", "JAX attention", "torch attention (aten ops run)"]
    return lines + table(columns, rows, "lll")


def _dispatch(result: dict) -> list[str]:
    lines = [
        "",
        "## Dispatch: one trivial call (x + 1 on 8 numbers; an 8x8 nnx.Linear for the modules)",
        "",
    ]
    rows = [
        [name, f"{ci['median']:.1f} ({ci['low']:.1f}-{ci['high']:.1f})"]
        for name, ci in result["dispatch_us"].items()
    ]
    return lines + table(["call", "us (95% interval)"], rows, "lr")


def _scale(result: dict) -> list[str]:
    lines = [
        "",
        "## Scale: the forward pass as the model, batch and sequence grow",
        "",
        "![scale](scale.png)",
        "",
    ]
    predicted = _predicted_by_point(result)
    rows = []
    for r in result["scale"]:
        t = r["timing"]
        times = [_ms(t.get(mode)) for mode in ("eager", "jit", "torch", "torch.compile")]
        ratio = _x(r["ratios"]["eager / jit"])
        rows.append(
            [r["axis"], r["value"], *times, ratio, f"{predicted[(r['axis'], r['value'])]:.2f}"]
        )
    columns = ["axis", "value", "eager ms", "jit ms", "torch ms", "torch.compile ms"]
    columns += ["jit speed-up (paired)", "predicted"]
    return lines + table(columns, rows, "l" + "r" * 7)


def _predicted_by_point(result: dict) -> dict:
    out = {}
    for axis, c in result["why"]["crossovers"].items():
        values = [r["value"] for r in result["scale"] if r["axis"] == axis]
        out |= {(axis, v): s for v, s in zip(values, c["predicted_speedups"], strict=True)}
    return out


COLORS = {
    "eager": "tab:red",
    "disable_jit": "tab:pink",
    "jit": "tab:blue",
    "jit, no donation": "tab:gray",
    "jit, auto attention": "navy",
    "nnx.jit": "tab:cyan",
    "nnx.cached_partial": "tab:purple",
    "torch": "tab:orange",
    "torch.compile": "tab:green",
    "torch.compile step": "tab:olive",
    "torch.compile reduce-overhead": "tab:brown",
}


def plots(result: dict, out: pathlib.Path) -> list[str]:
    """modes.png (each workload's modes), roofline.png and scale.png; their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _modes_plot(result, out / "modes.png", plt)
    _roofline_plot(result, out / "roofline.png", plt)
    names = ["modes.png", "roofline.png"]
    if result.get("scale"):
        _scale_plot(result, out / "scale.png", plt)
        names.append("scale.png")
    return names


def _modes_plot(result: dict, path: pathlib.Path, plt) -> None:
    rows = result["workloads"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4.5), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        names = [n for n in r["timing"] if n != "python"]
        for i, n in enumerate(names):  # points, not bars: a log axis has no zero
            ci = r["timing"][n]
            err = [[(ci["median"] - ci["low"]) * 1e3], [(ci["high"] - ci["median"]) * 1e3]]
            ax.errorbar(i, ci["median"] * 1e3, yerr=err, fmt="o", color=COLORS[n], capsize=4)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(r["workload"])
        ax.set_ylabel("ms per call (median, 95% interval)")
    fig.suptitle(f"XLA vs eager: {result['machine']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _roofline_plot(result: dict, path: pathlib.Path, plt) -> None:
    """Achieved GFLOP/s against arithmetic intensity (FLOPs per byte: fused for jit,
    unfused for eager) under the measured GEMM peak and memory bandwidth."""
    import numpy as np

    peak = result["roofs"]["gemm_flops"]["median"] / 1e9
    bandwidth = result["roofs"]["bandwidth_bytes"]["median"] / 1e9
    rows = result["workloads"]
    intensities = [
        r["counts"]["flops"] / max(r["counts"][k], 1)
        for r in rows
        for k in ("bytes_fused", "bytes_unfused")
    ]
    x = np.logspace(np.log10(min(intensities) / 4), np.log10(max(intensities) * 4 + 100), 200)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(x, np.minimum(peak, bandwidth * x), "k-", label="measured roofs")
    for r in rows:
        c = r["counts"]
        for mode, key, marker in (("jit", "bytes_fused", "o"), ("eager", "bytes_unfused", "s")):
            achieved = c["flops"] / r["timing"][mode]["median"] / 1e9
            ax.plot(c["flops"] / max(c[key], 1), achieved, marker, color=COLORS[mode])
            ax.annotate(
                f"{r['workload']} {mode}",
                (c["flops"] / max(c[key], 1), achieved),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte accessed)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roofline: {peak:.3g} GFLOP/s GEMM, {bandwidth:.3g} GB/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scale_plot(result: dict, path: pathlib.Path, plt) -> None:
    """Per axis: ms per call of each mode (top); jit's paired speed-up with its interval,
    the model's prediction and both crossovers (bottom)."""
    rows = result["scale"]
    axes_names = list(dict.fromkeys(r["axis"] for r in rows))
    fig, axes = plt.subplots(2, len(axes_names), figsize=(4.5 * len(axes_names), 7), squeeze=False)
    for j, axis in enumerate(axes_names):
        mine = [r for r in rows if r["axis"] == axis]
        xs = [r["value"] for r in mine]
        top, bottom = axes[0][j], axes[1][j]
        for mode in [m for m in mine[0]["timing"] if m != "python"]:
            ci = [r["timing"][mode] for r in mine]
            top.plot(xs, [c["median"] * 1e3 for c in ci], "o-", color=COLORS[mode], label=mode)
            top.fill_between(
                xs,
                [c["low"] * 1e3 for c in ci],
                [c["high"] * 1e3 for c in ci],
                color=COLORS[mode],
                alpha=0.25,
            )
        speedup = [r["ratios"]["eager / jit"] for r in mine]
        bottom.plot(
            xs,
            [s["median"] for s in speedup],
            "o-",
            color="tab:blue",
            label="jit speed-up (paired)",
        )
        bottom.fill_between(
            xs,
            [s["low"] for s in speedup],
            [s["high"] for s in speedup],
            color="tab:blue",
            alpha=0.25,
        )
        cross = result["why"]["crossovers"][axis]
        bottom.plot(xs, cross["predicted_speedups"], "k--", label="fitted model")
        bottom.axhline(2, color="gray", lw=0.8)
        for key, style in (("measured", "tab:blue"), ("predicted", "k")):
            if cross[key] is not None:
                bottom.axvline(cross[key], color=style, ls=":", label=f"crossover, {key}")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(axis)
        top.set_ylabel("forward ms per call (95% band)")
        bottom.set_ylabel("eager / jit")
        others = ", ".join(f"{k} {v}" for k, v in result["scale_center"].items() if k != axis)
        top.set_title(f"{axis} ({others})")
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(f"XLA vs eager as the forward pass grows: {result['machine']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
