"""The fitted model of eager time (eager_model.py), scored on points it was not fitted to,
with bootstrap intervals on every figure derived from it.

What varies: the timing rounds. Each replicate resamples, within every point, its rounds
with replacement (a round's eager, Python and jit times together: they were timed in the
same round), takes the medians, refits and recomputes every figure; the 95% interval is
the 2.5th-97.5th percentile of the replicates. The counts, bytes and FLOPs are exact.

Scored out of sample: by point (each held out in turn), by program (each held out whole:
does the model carry over to a program it never saw?) and by extrapolation (each scale
axis's largest value held out). A held-out prediction "holds" where its error's interval
lies within +-TOLERANCE, "fails" where it lies wholly outside, and is "uncertain"
otherwise (docs/xla-vs-eager.md, "How it measures").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxformer_lab.bench import eager_model

REPLICATES = 1000
TOLERANCE = 0.2
LEVEL = 2.0  # the crossover: jit's speed-up over eager falls through 2
RESAMPLED = (
    "timing rounds, resampled within each point (1,000 replicates; 95% percentile intervals)"
)


@dataclass
class Points:
    """The model's points; arrays [R + 1, n]: row 0 the data, rows 1.. the replicates."""

    labels: list[str]
    keys: list[tuple]  # (d_model, batch, length, layers)
    programs: list[str]
    axes: list[tuple[str, float] | None]
    X: np.ndarray  # [n, 3]: eager_model.TERMS
    fused: np.ndarray  # [n]
    eager: np.ndarray
    python: np.ndarray
    jit: np.ndarray
    gap: np.ndarray  # median per-round eager - jit
    speedup: np.ndarray  # median per-round eager / jit


def dispatch_count(counts: dict) -> tuple[int, str]:
    """(the dispatches the model uses, which): the profiler's launches + host-to-device
    transfers where measured, else the static estimate from the jaxpr."""
    measured = counts.get("launched", {}).get("eager")
    if measured and measured.get("launches") is not None:
        return measured["launches"] + measured["transfers"], "measured"
    return counts["dispatches"]["total"], "estimated"


def points_of(rows: list[dict], scale: list[dict] | None, seed: int = 0) -> Points:
    """The workloads' rows and the scale sweep's distinct points, resampled."""
    distinct = {point_key(r): r for r in scale or []}
    everything = [(r, None) for r in rows] + [
        (r, (r["axis"], r["value"])) for r in distinct.values()
    ]
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("eager", "python", "jit", "gap", "speedup")}
    for r, _ in everything:
        t = {k: np.asarray(r["times"][k]) for k in ("eager", "python", "jit")}
        idx = resample_index(len(t["jit"]), rng)
        for k in ("eager", "python", "jit"):
            cols[k].append(np.median(t[k][idx], axis=1))
        cols["gap"].append(np.median((t["eager"] - t["jit"])[idx], axis=1))
        cols["speedup"].append(np.median((t["eager"] / t["jit"])[idx], axis=1))
    c = [r["counts"] for r, _ in everything]
    return Points(
        labels=[_label(r, axis, scale) for r, axis in everything],
        keys=[point_key(r) if axis else None for r, axis in everything],
        programs=[r["workload"] for r, _ in everything],
        axes=[axis for _, axis in everything],
        X=np.array([[dispatch_count(k)[0], k["bytes_unfused"], k["flops"]] for k in c], float),
        fused=np.array([k["bytes_fused"] for k in c], float),
        **{k: np.stack(v, axis=1) for k, v in cols.items()},
    )


def point_key(r: dict) -> tuple:
    """A scale point's identity (the sweep's center lies on every axis)."""
    return (r["d_model"], r["batch"], r["length"], r.get("layers"))


def resample_index(n: int, rng) -> np.ndarray:
    """[R + 1, n] indices: row 0 the samples themselves, then R resamples of them."""
    return np.vstack([np.arange(n), rng.integers(0, n, (REPLICATES, n))])


def resampled_median(ci: dict, seed: int = 1) -> np.ndarray:
    """[R + 1] medians of a measured figure's samples (row 0: the samples' own); where the
    report kept no samples (an earlier lab version), the corners of its interval, low or
    high at random, so that its interval is carried at its full width."""
    rng = np.random.default_rng(seed)
    if "samples" not in ci:
        corners = np.where(rng.random(REPLICATES) < 0.5, ci["low"], ci["high"])
        return np.concatenate([[ci["median"]], corners])
    x = np.asarray(ci["samples"])
    return np.median(x[resample_index(len(x), rng)], axis=1)


def _label(r: dict, axis, scale) -> str:
    """A point's name: its workload, or its scale axis and value (the sweep's center,
    on every axis, is named so)."""
    if axis is None:
        return r["workload"]
    if sum(point_key(s) == point_key(r) for s in scale) > 1:
        return "forward, the sweep's center"
    return f"forward, {axis[0]} {axis[1]:g}"


def fit(P: Points, train: np.ndarray) -> np.ndarray | None:
    """The coefficients [R + 1, 3] fitted to the points `train` (a boolean mask), per
    replicate; None with fewer points than terms."""
    if train.sum() < len(eager_model.TERMS):
        return None
    X = P.X[train]
    return np.stack(
        [
            eager_model.fit_arrays(X, e[train], p[train])
            for e, p in zip(P.eager, P.python, strict=True)
        ]
    )


def predicted(P: Points, coef: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Point j's predicted eager and jit seconds [R + 1] (its Python as measured)."""
    a, b, c = coef.T
    compute = c * P.X[j, 2]
    eager = P.python[:, j] + a * P.X[j, 0] + b * P.X[j, 1] + compute
    return eager, a + b * P.fused[j] + compute


def interval(values: np.ndarray) -> dict:
    """The estimate (row 0) with the replicates' 95% percentile interval."""
    rest = values[1:][np.isfinite(values[1:])]
    low, high = np.percentile(rest, [2.5, 97.5]) if len(rest) else (np.nan, np.nan)
    if len(rest) < len(values) - 1:  # replicates with no finite value: unbounded
        high = np.inf
    return {
        "median": float(values[0]),
        "low": float(low),
        "high": float(high),
        "n": len(values) - 1,
        "confidence": 0.95,
    }


def verdict(error: dict) -> str:
    """ "holds", "fails" or "uncertain" for a held-out relative error's interval."""
    if -TOLERANCE <= error["low"] and error["high"] <= TOLERANCE:
        return "holds"
    if error["low"] > TOLERANCE or error["high"] < -TOLERANCE:
        return "fails"
    return "uncertain"


def held_out(P: Points, hold: np.ndarray) -> dict:
    """Fit to the points outside `hold`, score each point in it: relative error of the
    predicted eager time (predicted / measured - 1) with its interval and verdict."""
    coef = fit(P, ~hold)
    if coef is None:
        return {"fitted_on": int((~hold).sum()), "error": "fewer points than constants"}
    rows = []
    for j in np.flatnonzero(hold):
        err = interval(predicted(P, coef, j)[0] / P.eager[:, j] - 1)
        rows.append({"point": P.labels[j], "error": err, "verdict": verdict(err)})
    return {"fitted_on": int((~hold).sum()), "points": rows}


def validate(rows: list[dict], scale: list[dict] | None, roofs: dict, dispatch_us: dict) -> dict:
    """Everything the report says about why: the constants fitted to every point, checked
    against the run's measured roofs and dispatch cost; each workload's gap split; the
    model scored out of sample; the crossovers; and, in plain words, where it fails."""
    P = points_of(rows, scale)
    n = len(P.labels)
    coef = fit(P, np.ones(n, bool))
    with np.errstate(divide="ignore"):
        constants = {
            "a_us": interval(coef[:, 0] * 1e6),
            "bandwidth_gb_s": interval(1e-9 / coef[:, 1]),
            "rate_gflop_s": interval(1e-9 / coef[:, 2]),
        }
    cost = {k: resampled_median(dispatch_us[k], i) for i, k in enumerate(dispatch_us)}
    errors = np.stack([predicted(P, coef, j)[0] / P.eager[:, j] - 1 for j in range(n)], 1)
    largest = _largest_per_axis(P)
    why = {
        "resampled": RESAMPLED,
        "dispatches": dispatch_count(rows[0]["counts"])[1],
        "points": n,
        "constants": constants,
        "in_sample_error": interval(np.median(np.abs(errors), axis=1)),
        "checks": checks(constants, roofs, dispatch_us),
        "gaps": {P.labels[j]: gap_split(P, coef, j, rows[j], cost) for j in range(len(rows))},
        "held_out": {
            "by_point": [held_out(P, np.arange(n) == j)["points"][0] for j in range(n)],
            "by_program": {g: held_out(P, np.array(P.programs) == g) for g in _programs(P)},
            "extrapolation": held_out(P, largest) if largest.any() else None,
        },
        "crossovers": crossovers(P, coef, scale or []),
    }
    why["failures"] = failures(why)
    return why


def _programs(P: Points) -> list[str]:
    return list(dict.fromkeys(P.programs))


def _largest_per_axis(P: Points) -> np.ndarray:
    """The points at each scale axis's largest value."""
    top = {}
    for j, axis in enumerate(P.axes):
        if axis is not None and axis[1] > top.get(axis[0], (None, -np.inf))[1]:
            top[axis[0]] = (j, axis[1])
    return np.isin(np.arange(len(P.labels)), [j for j, _ in top.values()])


def gap_split(P: Points, coef: np.ndarray, j: int, row: dict, cost: dict) -> dict:
    """Workload j's eager-jit gap (median per-round saving) split by the fitted model into
    Python, a x (dispatches - 1), b x (unfused - fused bytes) and the residual, seconds and
    shares of the gap; beside it, the dispatches at the measured cost of one trivial
    eager primitive (see `dispatch_seconds`), and the eager call split into Python,
    measured dispatch, the compiled program (jit's call) and the rest."""
    a, b, _ = coef.T
    gap = P.gap[:, j]
    terms = {
        "python": P.python[:, j],
        "dispatch": a * (P.X[j, 0] - 1),
        "unfused_bytes": b * (P.X[j, 1] - P.fused[j]),
    }
    terms["residual"] = gap - sum(terms.values())
    measured = dispatch_seconds(row["counts"], cost)
    out = {"gap_s": interval(gap)}
    for k, v in (terms | {"dispatch_at_measured_cost": measured}).items():
        out[k] = {"s": interval(v), "share": interval(v / gap)}
    rest = P.eager[:, j] - P.python[:, j] - measured - P.jit[:, j]
    out["eager_call"] = {
        "eager_s": interval(P.eager[:, j]),
        "python_s": interval(P.python[:, j]),
        "dispatch_s": interval(measured),
        "compiled_s": interval(P.jit[:, j]),
        "rest_s": interval(rest),
    }
    return out


def dispatch_seconds(counts: dict, cost: dict) -> np.ndarray:
    """[R + 1] seconds of eager's dispatches at the measured costs of trivial calls: the
    profiler's launches x one eager primitive + its transfers x one host-to-device put
    where measured; else the static estimate, primitives x one eager primitive + inner
    jits x one jitted call."""
    measured = counts.get("launched", {}).get("eager")
    if measured and measured.get("launches") is not None and "host-to-device put" in cost:
        us = measured["launches"] * cost["eager primitive"]
        us = us + measured["transfers"] * cost["host-to-device put"]
    else:
        d = counts["dispatches"]
        us = d["primitives"] * cost["eager primitive"] + d["jit_calls"] * cost["jit call"]
    return us * 1e-6


def checks(constants: dict, roofs: dict, dispatch_us: dict) -> list[dict]:
    """Each fitted constant beside what the same run measured: 1/b against the memory
    bandwidth roof, 1/c against the GEMM roof, a against one trivial eager primitive."""
    measured = {
        "bandwidth_gb_s": _scaled(roofs["bandwidth_bytes"], 1e-9),
        "rate_gflop_s": _scaled(roofs["gemm_flops"], 1e-9),
        "a_us": dispatch_us["eager primitive"],
    }
    names = {
        "bandwidth_gb_s": "memory bandwidth roof",
        "rate_gflop_s": "float32 GEMM roof",
        "a_us": "one trivial eager primitive",
    }
    out = []
    for key, m in measured.items():
        fitted = constants[key]
        if not np.isfinite(fitted["median"]):
            relation = "fitted at 0 (no such term)"
        elif fitted["low"] > m["high"]:
            relation = "exceeds" if key != "a_us" else "above"
        elif fitted["high"] < m["low"]:
            relation = "below"
        else:
            relation = "overlaps"
        out.append(
            {
                "constant": key,
                "fitted": fitted,
                "measured": m,
                "what": names[key],
                "relation": relation,
            }
        )
    return out


def _scaled(ci: dict, factor: float) -> dict:
    return {k: ci[k] * factor for k in ("median", "low", "high")}


def crossovers(P: Points, coef: np.ndarray, scale: list[dict]) -> dict:
    """Per scale axis: where jit's speed-up over eager falls through LEVEL, measured (the
    per-round speed-ups) and predicted (the model fitted to every point), each with its
    interval where it is established (see `crossing`), and the predicted speed-ups."""
    out = {}
    for axis in dict.fromkeys(r["axis"] for r in scale):
        mine = sorted((r for r in scale if r["axis"] == axis), key=lambda r: r["value"])
        xs = [r["value"] for r in mine]
        cols = [P.keys.index(point_key(r)) for r in mine]
        measured = P.speedup[:, cols]
        pred = np.stack([np.divide(*predicted(P, coef, j)) for j in cols], axis=1)
        measured_ci = [r["ratios"]["eager / jit"] for r in mine]
        predicted_ci = [interval(pred[:, i]) for i in range(len(cols))]
        out[axis] = {
            "values": xs,
            "measured": crossing(axis, xs, measured, measured_ci),
            "predicted": crossing(axis, xs, pred, predicted_ci),
            "predicted_speedups": predicted_ci,
        }
    return out


def crossing(axis: str, xs: list, speedups: np.ndarray, cis: list[dict]) -> dict:
    """The crossover of speed-ups [R + 1, k] along `xs`. Established only where the two
    points around it have intervals wholly on either side of LEVEL and at least 97.5% of
    the replicates cross within the sweep; else refused, saying why (a crossing whose
    neighbour at the sweep's edge has an interval containing LEVEL is not shown)."""
    estimate = eager_model.crossover(xs, list(speedups[0]))
    if estimate is None:
        return {"established": False, "why": f"no crossing within {axis} {xs[0]}-{xs[-1]}"}
    i = eager_model.crossing_segment(list(speedups[0]))
    for k in (i, i + 1):
        if cis[k]["low"] <= LEVEL <= cis[k]["high"]:
            edge = " (the sweep's edge)" if k in (0, len(xs) - 1) else ""
            return {
                "established": False,
                "estimate": estimate,
                "why": f"at {axis} {xs[k]}{edge} the speed-up is {_ci(cis[k])}, "
                f"an interval containing {LEVEL:g}",
            }
    reps = [eager_model.crossover(xs, list(s)) for s in speedups[1:]]
    found = np.array([np.nan if r is None else r for r in reps])
    missing = float(np.isnan(found).mean())
    if missing > 0.025:
        why = f"{missing:.0%} of the replicates do not cross within {axis} {xs[0]}-{xs[-1]}"
        return {"established": False, "estimate": estimate, "why": why}
    return {"established": True, "value": interval(np.concatenate([[estimate], found]))}


def _ci(ci: dict) -> str:
    return f"{ci['median']:.2f} ({ci['low']:.2f}-{ci['high']:.2f})"


def failures(why: dict) -> list[str]:
    """Where the model fails, in plain words: held-out predictions that fail, constants
    beyond the machine's measured roofs, crossovers refused."""
    out = []
    held = why["held_out"]
    groups = [("left out alone", held["by_point"])]
    groups += [
        (f"with all of {g} left out", h.get("points", []))
        for g, h in held["by_program"].items()
        if len(h.get("points", [])) > 1  # a one-point program is its point left out alone
    ]
    if held["extrapolation"]:
        groups.append(("extrapolated from smaller scales", held["extrapolation"]["points"]))
    for how, rows in groups:
        bad = [f"{r['point']} {_pct(r['error'])}" for r in rows if r["verdict"] == "fails"]
        if bad:
            out.append(
                f"Predicting eager time {how}, it misses by more than "
                f"{TOLERANCE:.0%}: " + "; ".join(bad) + "."
            )
    for c in why["checks"]:
        if c["relation"] in ("exceeds", "above"):
            out.append(
                f"Its {CONSTANT_NAMES[c['constant']]} {_ci(c['fitted'])} is above the "
                f"{c['what']} measured in the same run, {_ci(c['measured'])}: the "
                "term absorbs costs other than the one it names."
            )
    for axis, c in why["crossovers"].items():
        for kind in ("measured", "predicted"):
            if not c[kind]["established"] and "estimate" in c[kind]:
                out.append(
                    f"The {kind} crossover along {axis} is not established: {c[kind]['why']}."
                )
    return out


CONSTANT_NAMES = {
    "a_us": "a, us per dispatch",
    "bandwidth_gb_s": "1/b, bandwidth in GB/s",
    "rate_gflop_s": "1/c, compute rate in GFLOP/s",
}


def _pct(ci: dict) -> str:
    return f"{ci['median']:+.0%} ({ci['low']:+.0%} to {ci['high']:+.0%})"
