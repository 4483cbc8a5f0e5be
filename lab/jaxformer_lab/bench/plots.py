"""The XLA-vs-eager report's PNGs: modes.png (each workload's modes), roofline.png and
scale.png, drawn from the lab's result dict."""

from __future__ import annotations

import pathlib

COLORS = {
    "eager": "tab:red",
    "eager, functional": "salmon",
    "disable_jit": "tab:pink",
    "jit": "tab:blue",
    "jit, no donation": "tab:gray",
    "jit, auto attention": "navy",
    "nnx.jit": "tab:cyan",
    "nnx.jit(graph=False)": "teal",
    "nnx.cached_partial": "tab:purple",
    "torch": "tab:orange",
    "torch, fast path": "gold",
    "torch.compile": "tab:green",
    "torch.compile step": "tab:olive",
    "torch.compile reduce-overhead": "tab:brown",
    "torch.compile max-autotune": "darkgreen",
    "torch.compile functional step": "lime",
}


def plots(result: dict, out: pathlib.Path) -> list[str]:
    """modes.png (each workload's modes), roofline.png and scale.png; their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    if result["workloads"]:
        _modes_plot(result, out / "modes.png", plt)
        names.append("modes.png")
    if result["workloads"] and result.get("roofs"):
        _roofline_plot(result, out / "roofline.png", plt)
        names.append("roofline.png")
    if result.get("scale") and result.get("why"):
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
            ax.errorbar(
                i, ci["median"] * 1e3, yerr=err, fmt="o", color=COLORS.get(n, "k"), capsize=4
            )
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(r["workload"])
        ax.set_ylabel("ms per call (median, 95% interval)")
    fig.suptitle(f"XLA vs eager: {(result.get('machine') or {}).get('device', '')}")
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
        mine = sorted((r for r in rows if r["axis"] == axis), key=lambda r: r["value"])
        xs = [r["value"] for r in mine]
        top, bottom = axes[0][j], axes[1][j]
        for mode in [m for m in mine[0]["timing"] if m != "python"]:
            ci = [r["timing"][mode] for r in mine]
            top.plot(
                xs, [c["median"] * 1e3 for c in ci], "o-", color=COLORS.get(mode, "k"), label=mode
            )
            top.fill_between(
                xs,
                [c["low"] * 1e3 for c in ci],
                [c["high"] * 1e3 for c in ci],
                color=COLORS.get(mode, "k"),
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
        predicted = dict(zip(cross["values"], cross["predicted_speedups"], strict=True))
        pred = [predicted[v] for v in xs]
        bottom.plot(xs, [p["median"] for p in pred], "k--", label="fitted model")
        bottom.fill_between(
            xs, [p["low"] for p in pred], [p["high"] for p in pred], color="k", alpha=0.1
        )
        bottom.axhline(2, color="gray", lw=0.8)
        for key, style in (("measured", "tab:blue"), ("predicted", "k")):
            if cross[key]["established"]:
                bottom.axvline(
                    cross[key]["value"]["median"], color=style, ls=":", label=f"crossover, {key}"
                )
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(axis)
        top.set_ylabel("forward ms per call (95% band)")
        bottom.set_ylabel("eager / jit")
        others = ", ".join(
            f"{k} {v}" for k, v in (result.get("scale_center") or {}).items() if k != axis
        )
        top.set_title(f"{axis} ({others})")
    axes[0][0].legend(fontsize=8)
    axes[1][0].legend(fontsize=8)
    fig.suptitle(
        f"XLA vs eager as the forward pass grows: {(result.get('machine') or {}).get('device', '')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
