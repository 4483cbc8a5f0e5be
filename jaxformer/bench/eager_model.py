"""A small model of eager time, fitted to the lab's measurements:

    eager s  =  python s  +  a * dispatches  +  b * unfused bytes  +  c * FLOPs

`python` (nnx.merge / nnx.state and the Python around them) is measured; a is seconds per
dispatch, 1/b the bandwidth eager's unfused ops reach, 1/c its compute rate. The compiled
program is predicted as one dispatch plus b * fused bytes + c * FLOPs, so the eager-jit gap
splits into python + a * (dispatches - 1) + b * (unfused - fused bytes) and a residual."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls

from jaxformer.checks import BadValue

TERMS = ("dispatches", "bytes_unfused", "flops")


def fit(rows: list[dict]) -> dict:
    """Non-negative least squares of `eager_s - python_s` on TERMS over `rows` (each a dict
    with those keys). Relative errors: each row is weighted by 1 / eager_s, so a 1 ms and a
    1 s workload count alike. Returns {a, b, c, rel_error (the median of |predicted -
    measured| / measured eager time), rows}."""
    if len(rows) < len(TERMS):
        raise BadValue(f"fitting {len(TERMS)} terms needs >= {len(TERMS)} rows, got {len(rows)}")
    X = np.array([[r[t] for t in TERMS] for r in rows], np.float64)
    y = np.array([r["eager_s"] - r["python_s"] for r in rows], np.float64)
    w = 1 / np.array([r["eager_s"] for r in rows], np.float64)
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(X / scale * w[:, None], y * w)
    coef = coef / scale
    rel_error = float(np.median(np.abs(X @ coef - y) * w))
    a, b, c = (float(v) for v in coef)
    return {"a": a, "b": b, "c": c, "rel_error": rel_error, "rows": len(rows)}


def predict(model: dict, row: dict) -> dict:
    """Predicted eager and jit seconds for `row` (TERMS, bytes_fused, python_s)."""
    compute = model["c"] * row["flops"]
    eager = row["python_s"] + model["a"] * row["dispatches"] + model["b"] * row["bytes_unfused"]
    jit = model["a"] + model["b"] * row["bytes_fused"] + compute
    return {"eager_s": eager + compute, "jit_s": jit}


def explain_gap(model: dict, row: dict, gap_s: float) -> dict:
    """The measured eager-jit gap (seconds) split into the model's terms and what is left."""
    terms = {
        "python": row["python_s"],
        "dispatch": model["a"] * (row["dispatches"] - 1),
        "unfused_bytes": model["b"] * (row["bytes_unfused"] - row["bytes_fused"]),
    }
    return terms | {"residual": gap_s - sum(terms.values()), "gap": gap_s}


def crossover(xs: list[float], speedups: list[float], level: float = 2.0) -> float | None:
    """The first x (interpolated on log axes) where `speedups` crosses `level` between
    neighbouring points of the increasing `xs`; None where it does not cross."""
    for i in range(len(xs) - 1):
        (x0, x1), (s0, s1) = xs[i : i + 2], speedups[i : i + 2]
        if (s0 - level) * (s1 - level) <= 0 and s0 != s1:
            t = (math.log(level) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))
    return None
