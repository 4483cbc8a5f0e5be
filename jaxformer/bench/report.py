"""The XLA-vs-eager lab's report: report.md with its tables, modes.png and scale.png."""

from __future__ import annotations

import pathlib

from jaxformer.bench.stats import faster


def _ms(ci: dict | None) -> str:
    if ci is None:
        return ""
    return f"{ci['median'] * 1e3:.3g} ({ci['low'] * 1e3:.3g}-{ci['high'] * 1e3:.3g})"


def _calls(n: int | None) -> str:
    return "never" if n is None else f"{n:,}"


def _mib(n: float | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def _speedup(slow: dict, fast: dict) -> str:
    """slow / fast medians, marked * where the intervals overlap."""
    return f"{slow['median'] / fast['median']:.1f}x" + ("" if faster(slow, fast) else "*")


def markdown(result: dict) -> str:
    m, rows = result["machine"], result["workloads"]
    modes = list(rows[0]["timing"])
    lines = [
        "# XLA vs eager",
        "",
        f"`{result['command']}` on {m['device']}: jax {m['jax']}, flax {m['flax']}, "
        f"torch {m.get('torch', 'not installed')}, {m['cpu_count']} CPU cores, load average "
        f"{m['load_before']:.2f} before and {m['load_after']:.2f} after; {result['wall_s']:.0f} s.",
        f"Model: {result['model']}. Every cell: median ms per call over {result['rounds']} "
        "interleaved calls after warm-up, (95% interval of the median).",
        "",
        "## Modes",
        "",
        "| workload | " + " | ".join(modes) + " | jit speed-up over eager | torch / jit |",
        "|---|" + "---:|" * (len(modes) + 2),
    ]
    for r in rows:
        t = r["timing"]
        ratio = t["torch"]["median"] / t["jit"]["median"] if "torch" in t else None
        lines.append(
            f"| {r['workload']} | " + " | ".join(_ms(t[mode]) for mode in modes)
            + f" | {_speedup(t['eager'], t['jit'])} | "
            + ("" if ratio is None else f"{ratio:.2f}") + " |"
        )  # fmt: skip
    checked = rows + (result.get("scale") or [])
    flagged = [
        f"{r['workload']} {r.get('axis', '')} {r.get('value', '')} {mode} ({a['max_abs_diff']:.2g})"
        for r in checked
        for mode, a in r["agreement"].items()
        if not a["agrees"]
    ]
    worst = max(a["max_abs_diff"] for r in checked for a in r["agreement"].values())
    lines += [
        "",
        "A speed-up marked * is within the noise: the two intervals overlap.",
        "",
        f"Outputs, here and in the scale sweep: every mode agrees with jit within "
        f"{result['tolerance']:g} of the largest output (largest difference {worst:.2g})."
        if not flagged
        else f"**Outputs that disagree with jit** (max abs difference): {', '.join(flagged)}.",
        "",
        "## Costs and break-even",
        "",
        "Eager's first call compiles each primitive it has not met before (JAX caches them).",
        "",
        "| workload | eager's first call s | trace s | lower s | compile s | total, cache warm s "
        "| jit pays off after (calls; cache warm) | torch.compile s | torch.compile pays off after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        c, b = r["costs"], r["break_even"]
        lines.append(
            f"| {r['workload']} | {r['first_call_s']['eager']:.2f} | {c['cold']['trace_s']:.3f} | {c['cold']['lower_s']:.3f} | "
            f"{c['cold']['compile_s']:.3f} | {c['warm']['total_s']:.3f} | {_calls(b['jit'])}; "
            f"{_calls(b['jit_warm_cache'])} | "
            + (f"{c['torch_compile_s']:.1f} | {_calls(b['torch.compile'])}" if "torch_compile_s" in c else " | ")
            + " |"
        )  # fmt: skip
    lines += _why(result)
    lines += _dispatch(result["dispatch_us"])
    if result.get("scale"):
        lines += _scale(result["scale"])
    return "\n".join(lines) + "\n"


def _why(result: dict) -> list[str]:
    lines = [
        "",
        "## Why",
        "",
        "Eager runs each jaxpr equation as its own dispatch; jit runs XLA's optimised program, "
        "whose instructions are mostly fusions. Memory: XLA's plan for the compiled program "
        "(arguments + outputs + temporaries) and each mode's measured rise of the "
        f"{result['memory_measure']} for one call in a fresh process.",
        "",
        "| workload | jaxpr equations | HLO ops before | after | fusions | eager us per "
        "equation | plan MiB | eager peak MiB | jit peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["workloads"]:
        c, plan, mem = r["costs"], r["costs"]["memory_plan"], r["memory"]
        per_eq = r["timing"]["eager"]["median"] * 1e6 / c["jaxpr_equations"]
        planned = (
            None if plan is None else plan["arguments"] + plan["outputs"] + plan["temporaries"]
        )
        peak = {
            k: f"failed: {v['error']}" if "error" in v else _mib(v["peak_rise_bytes"])
            for k, v in mem.items()
        }
        lines.append(
            f"| {r['workload']} | {c['jaxpr_equations']:,} | {c['hlo_ops_before']:,} | "
            f"{c['hlo_ops_after']:,} | {c['fusions']:,} | {per_eq:.1f} | {_mib(planned)} | "
            f"{peak['eager']} | {peak['jit']} |"
        )
    profiled = [r for r in result["workloads"] if r.get("gpu_profile")]
    if profiled:
        lines += [
            "",
            "On the GPU, from the profilers: kernels launched and device ms per call; host ms = "
            "wall minus device time (dispatch, Python).",
            "",
            "| workload | mode | kernels per call | device ms | wall ms | host ms |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in profiled:
            for mode, p in r["gpu_profile"].items():
                if "error" in p:
                    lines.append(
                        f"| {r['workload']} | {mode} | profiler failed: {p['error']} | | | |"
                    )
                    continue
                wall = r["timing"][mode]["median"] * 1e3
                lines.append(
                    f"| {r['workload']} | {mode} | {p['kernels_per_call']:.0f} | "
                    f"{p['device_ms_per_call']:.3f} | {wall:.3f} | {wall - p['device_ms_per_call']:.3f} |"
                )
    return lines


def _dispatch(dispatch: dict) -> list[str]:
    lines = [
        "",
        "## Dispatch: one trivial call (x + 1 on 8 numbers; an 8x8 nnx.Linear for the modules)",
        "",
        "| call | us (95% interval) |",
        "|---|---:|",
    ]
    for name, ci in dispatch.items():
        lines.append(f"| {name} | {ci['median']:.1f} ({ci['low']:.1f}-{ci['high']:.1f}) |")
    return lines


def _scale(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "## Scale: the forward pass as the model, batch and sequence grow",
        "",
        "![scale](scale.png)",
        "",
        "| axis | value | eager ms | jit ms | torch ms | torch.compile ms | jit speed-up | "
        "jit pays off after | torch.compile pays off after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t, b = r["timing"], r["break_even"]
        lines.append(
            f"| {r['axis']} | {r['value']} | {_ms(t['eager'])} | {_ms(t['jit'])} | "
            f"{_ms(t.get('torch'))} | {_ms(t.get('torch.compile'))} | "
            f"{_speedup(t['eager'], t['jit'])} | {_calls(b['jit'])} | "
            f"{_calls(b['torch.compile']) if 'torch.compile' in b else ''} |"
        )
    return lines


COLORS = {
    "eager": "tab:red", "disable_jit": "tab:pink", "jit": "tab:blue", "nnx.jit": "tab:cyan",
    "nnx.cached_partial": "tab:purple", "torch": "tab:orange", "torch.compile": "tab:green",
}  # fmt: skip


def plots(result: dict, out: pathlib.Path) -> list[str]:
    """modes.png (each workload's modes) and scale.png (the scale sweep); their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = result["workloads"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        names = list(r["timing"])
        med = np.array([r["timing"][n]["median"] for n in names]) * 1e3
        err = np.array([[med[i] - r["timing"][n]["low"] * 1e3, r["timing"][n]["high"] * 1e3 - med[i]]
                        for i, n in enumerate(names)]).T  # fmt: skip
        for i, n in enumerate(names):  # points, not bars: a log axis has no zero
            ax.errorbar(i, med[i], yerr=err[:, i : i + 1], fmt="o", color=COLORS[n], capsize=4)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(r["workload"])
        ax.set_ylabel("ms per call (median, 95% interval)")
    fig.suptitle(f"XLA vs eager: {result['machine']['device']}")
    fig.tight_layout()
    fig.savefig(out / "modes.png", dpi=110)
    plt.close(fig)
    names = ["modes.png"]
    if result.get("scale"):
        _scale_plot(result, out / "scale.png", plt)
        names.append("scale.png")
    return names


def _scale_plot(result: dict, path: pathlib.Path, plt) -> None:
    rows = result["scale"]
    axes_names = list(dict.fromkeys(r["axis"] for r in rows))
    fig, axes = plt.subplots(2, len(axes_names), figsize=(4.5 * len(axes_names), 7), squeeze=False)
    for j, axis in enumerate(axes_names):
        mine = [r for r in rows if r["axis"] == axis]
        xs = [r["value"] for r in mine]
        top, bottom = axes[0][j], axes[1][j]
        for mode in mine[0]["timing"]:
            ci = [r["timing"][mode] for r in mine]
            top.plot(xs, [c["median"] * 1e3 for c in ci], "o-", color=COLORS[mode], label=mode)
            top.fill_between(xs, [c["low"] * 1e3 for c in ci], [c["high"] * 1e3 for c in ci],
                             color=COLORS[mode], alpha=0.25)  # fmt: skip
        for key, mode in (("jit", "jit"), ("torch.compile", "torch.compile")):
            calls = [r["break_even"].get(key) for r in mine]
            pts = [(x, n) for x, n in zip(xs, calls, strict=True) if n is not None]
            if pts:
                bottom.plot(
                    *zip(*pts, strict=True),
                    "s-",
                    color=COLORS[mode],
                    label=f"{mode} pays off after",
                )
            for x, n in zip(xs, calls, strict=True):
                if n is None and key in mine[0]["break_even"]:
                    bottom.annotate("never", (x, 1), color=COLORS[mode], ha="center")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(axis)
        top.set_ylabel("forward ms per call (95% band)")
        bottom.set_ylabel("calls until compiling pays off")
        top.set_title(
            f"{axis} ({', '.join(f'{k} {v}' for k, v in result['scale_center'].items() if k != axis)})"
        )
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(f"XLA vs eager as the forward pass grows: {result['machine']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
