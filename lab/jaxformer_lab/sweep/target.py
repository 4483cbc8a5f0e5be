"""How soon a sweep's runs reach its target, a held-out figure (`target` in the spec):

    target: {metric: eval_nll, below: 4.0}

Each finished run's metrics.jsonl gives two figures, nothing interpolated: steps_to_target,
the step of its first evaluation (in-run or final) at or below the target; and
seconds_to_target, its training seconds to that step (the wall clock of that step's record,
compilation included, less the seconds of the evaluations before it). A run that never
reaches it has neither, and the report names it. Against the baseline, seed by seed: each
figure's ratio (variant / baseline), the geometric mean over the paired seeds with the 95%
t-interval of the mean log ratio, and that t-test's p, which joins the report's family of
verdicts (Holm); there is no bootstrap (no sentences to redraw). A verdict needs every
paired seed to reach the target in both runs. `curves` draws the metric against steps and
against training seconds, each seed a thin line."""

from __future__ import annotations

import dataclasses
import math
import pathlib

from jaxformer.checks import BadValue
from jaxformer.files import read_metrics
from jaxformer_lab.sweep import stats

METRICS = {"eval_nll": "NLL", "eval_loss": "loss", "eval_perplexity": "perplexity"}  # lower: better
FIGURES = ("steps_to_target", "seconds_to_target")
WORDS = {"lower": "faster", "higher": "slower"}  # a verdict on a ratio of steps or seconds


@dataclasses.dataclass(frozen=True)
class Target:
    """The first evaluation whose `metric` is at or below `below`."""

    metric: str
    below: float

    @classmethod
    def read(cls, value, path) -> Target:
        """The spec's `target: {metric: NAME, below: NUMBER}`, checked."""
        if not isinstance(value, dict) or sorted(value) != ["below", "metric"]:
            raise BadValue(f"{path}: target must be {{metric: NAME, below: NUMBER}}, got {value!r}")
        metric, below = value["metric"], value["below"]
        if metric not in METRICS:
            raise BadValue(
                f"{path}: target: metric must be one of {tuple(METRICS)}, got {metric!r}"
            )
        if (
            isinstance(below, bool)
            or not isinstance(below, int | float)
            or not math.isfinite(below)
        ):
            raise BadValue(f"{path}: target: below must be a finite number, got {below!r}")
        return cls(metric, float(below))

    def describe(self) -> str:
        return f"held-out {METRICS[self.metric]} <= {self.below:g}"


def reach(folder: pathlib.Path, target: Target) -> dict:
    """{steps_to_target, seconds_to_target} of a finished run, or {"not_reached": the
    step of its last evaluation} when none reached `target`."""
    path = folder / "metrics.jsonl"
    points = _points(path, target.metric)
    if not points:
        raise BadValue(f"{path}: no evaluation logged {target.metric}")
    for step, seconds, value in points:
        if value <= target.below:
            if seconds is None:
                raise BadValue(
                    f"{path}: no step record at step {step}, whose evaluation reached the "
                    "target: log_every must divide eval_every"
                )
            return {"steps_to_target": step, "seconds_to_target": round(seconds, 2)}
    return {"not_reached": points[-1][0]}


def paired(reached: dict[int, dict], base: dict[int, dict]) -> dict:
    """Each figure's seed-paired ratio (variant / baseline) over the seeds both runs
    reached the target in, its t-test on the log ratio, and the seeds either run did not
    reach it in (`reached`, `base`: seed -> `reach`'s result, of the finished seeds)."""
    seeds = [s for s in reached if s in base]
    missed = {
        s: [
            who for who, r in (("variant", reached[s]), ("baseline", base[s])) if "not_reached" in r
        ]
        for s in seeds
    }
    missed = {s: who for s, who in missed.items() if who}
    both = [s for s in seeds if s not in missed]
    out = {}
    for key in FIGURES if both else ():
        logs = [math.log(reached[s][key] / base[s][key]) for s in both]
        test = stats.t_test(logs)
        half = test.half_width
        out[key] = {
            "ratio": math.exp(test.difference),
            "low": None if half is None else math.exp(test.difference - half),
            "high": None if half is None else math.exp(test.difference + half),
            "values": [reached[s][key] / base[s][key] for s in both],
            "log_ratios": logs,
            "seeds": both,
            "tested": not missed,
        }
        if missed:  # a verdict on the seeds left would leave out the slowest runs
            out[key]["verdict"] = "no verdict (not reached in every seed)"
    return {"figures": out, "not_reached": missed}


def family(comparisons: list[dict]) -> list[tuple[dict, stats.SeedTest]]:
    """(result, its t-test) of every target figure that a verdict may read: those whose
    paired seeds all reached the target in both runs."""
    return [
        (r, stats.t_test(r["log_ratios"]))
        for p in comparisons
        for r in p.get("targets", {}).get("figures", {}).values()
        if r["tested"]
    ]


def reversed_(targets: dict) -> dict:
    """The comparison read the other way round: each ratio inverted, each verdict turned."""
    turn = {"faster": "slower", "slower": "faster", "variant": "baseline", "baseline": "variant"}

    def one(r: dict) -> dict:
        flipped = {"ratio": 1 / r["ratio"], "values": [1 / v for v in r["values"]]}
        flipped |= {"low": r["high"] and 1 / r["high"], "high": r["low"] and 1 / r["low"]}
        flipped |= {"log_ratios": [0.0 - x for x in r["log_ratios"]]}
        return r | flipped | {"verdict": turn.get(r["verdict"], r["verdict"])}

    return {
        "figures": {k: one(r) for k, r in targets["figures"].items()},
        "not_reached": {s: [turn[w] for w in who] for s, who in targets["not_reached"].items()},
    }


def table(results: dict) -> dict:
    """The target's table (the format of docs/results): each variant's steps and seconds
    to it, then its ratios to the baseline's with their verdicts."""
    base, n = results["baseline"], results["comparisons"]
    head = ["variant", "reached", "steps to target", "seconds to target"]
    for title in ("steps", "seconds"):
        head += [f"{title} ratio [95% t]", f"t p / Holm ({title})", f"verdict ({title})"]
    rows, missed = [], []
    for name, v in results["variants"].items():
        reached = v["target"]
        row = [name + (" (baseline)" if name == base else ""), _reached(reached)]
        row += [_mean(v["figures"].get(key), reached) for key in FIGURES]
        for key in FIGURES:
            r = v.get("paired", {}).get("targets", {}).get("figures", {}).get(key)
            row += _ratio_cells(r)
        rows.append(row)
        missed += [
            f"{name} seed {s} (last evaluated at step {r['not_reached']})"
            for s, r in reached.items()
            if "not_reached" in r
        ]
    caption = (
        f"Time to the target, {Target(**results['target']).describe()} (the first evaluation "
        "at or below it): how many of each variant's finished seeds reached it, and their "
        "steps and training seconds (evaluations excluded, compilation included), the mean "
        f"± half-width of the 95% t-interval over those seeds; against {base}, seed by seed (same seed, same data order): the "
        "ratio variant / baseline, its geometric mean over the seeds both runs reached it in "
        "with the 95% t-interval of the mean log ratio, and the t-test's exact p beside its "
        f"Holm adjustment over the {n} comparisons reported from these runs. The verdict, "
        f"faster or slower, needs the adjusted p below {stats.ALPHA} and every paired seed "
        "reaching the target in both runs."
    )
    notes = [f"Not reached: {'; '.join(missed)}."] if missed else []
    align = "llrr" + "rrl" * len(FIGURES)
    return {"caption": caption, "columns": head, "rows": rows, "align": align, "notes": notes}


def _reached(reached: dict) -> str:
    return f"{sum('not_reached' not in r for r in reached.values())}/{len(reached)}"


def _mean(figure: dict | None, reached: dict) -> str:
    if figure is None:
        return "not reached" if reached else ""  # (no finished seed: nothing to say)
    half = figure["ci95"]
    return f"{figure['mean']:.0f}" + ("" if half is None else f" ± {half:.0f}")


def _ratio_cells(r: dict | None) -> list[str]:
    if r is None:
        return ["", "", ""]
    interval = "" if r["low"] is None else f" [{r['low']:.2f}, {r['high']:.2f}]"
    tested = "t_p" in r and len(r["seeds"]) > 1  # one seed: no t-test to show
    p = f"{stats.format_p(r['t_p'])} / {stats.format_p(r['t_p_holm'])}" if tested else ""
    return [f"{r['ratio']:.2f}{interval}", p, r["verdict"]]


def curves(spec, out_png: pathlib.Path) -> None:
    """The target's metric against steps and against training seconds (as `reach`
    counts them), each seed a thin line in its variant's colour, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = spec.target
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained", sharey=True)
    for i, name in enumerate(spec.variants):
        for k, seed in enumerate(spec.seeds):
            path = spec.folder(name, seed) / "metrics.jsonl"
            points = _points(path, target.metric) if path.exists() else []
            points = [p for p in points if p[1] is not None]
            if not points:
                continue
            steps, seconds, values = zip(*points, strict=True)
            label = name if k == 0 else None
            for ax, x in zip(axes, (steps, seconds), strict=True):
                ax.plot(x, values, color=f"C{i}", lw=0.9, alpha=0.8, label=label)
    for ax, xlabel in zip(axes, ("step", "training seconds (evaluations excluded)"), strict=True):
        ax.axhline(target.below, color="k", ls="--", lw=0.8)
        ax.set(xlabel=xlabel, ylabel=f"held-out {METRICS[target.metric]}")
    top = max(target.below * 1.6, target.below + 1.5)
    axes[0].set_ylim(target.below - 0.3 * (top - target.below), top)
    fig.suptitle(
        f"sweep {spec.out.name}: each seed a line; dashed: the target, {target.describe()}"
    )
    axes[1].legend(fontsize=8, frameon=False)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _points(path: pathlib.Path, metric: str) -> list[tuple[int, float | None, float]]:
    """(step, training seconds, value) of each evaluation of `metric`: the seconds are
    the wall clock of the step's record less the evaluations' before it (None without
    that record)."""
    wall, evals_before, out = {}, 0.0, []
    for r in read_metrics(path):
        if "wall_seconds" in r:
            wall[r["step"]] = r["wall_seconds"]
        if r.get(metric) is not None:
            seconds = wall[r["step"]] - evals_before if r["step"] in wall else None
            out.append((r["step"], seconds, r[metric]))
        evals_before = r.get("eval_seconds", evals_before)  # the evaluations' so far
    return out
