"""A small model of eager time, fitted to the lab's measurements:

    eager s  =  python s  +  a * dispatches  +  b * unfused bytes  +  c * FLOPs

`python` (nnx.merge / nnx.state and the Python around them) is measured; a is seconds per
dispatch, 1/b the bandwidth eager's unfused ops reach, 1/c its compute rate. The compiled
program is predicted as one dispatch plus b * fused bytes + c * FLOPs, so the eager-jit gap
splits into python + a * (dispatches - 1) + b * (unfused - fused bytes) and a residual
(validate.py fits it, scores it on points it was not fitted to, and splits the gaps)."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls

from jaxformer.checks import BadValue

TERMS = ("dispatches", "bytes_unfused", "flops")


def fit_arrays(X: np.ndarray, eager: np.ndarray, python: np.ndarray) -> np.ndarray:
    """The coefficients [a, b, c]: non-negative least squares of eager - python on X [n, 3]
    (TERMS per point) over n points (eager and python seconds [n]), in relative errors:
    each point weighted by 1 / eager, so that a 1 ms and a 1 s workload count alike.
    Raises for fewer points than terms."""
    if len(X) < len(TERMS):
        raise BadValue(f"fitting {len(TERMS)} terms needs >= {len(TERMS)} points, got {len(X)}")
    w = 1 / eager
    scale = X.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(X / scale * w[:, None], (eager - python) * w)
    return coef / scale


def crossover(xs: list[float], speedups: list[float], level: float = 2.0) -> float | None:
    """The first x (interpolated on log axes) where `speedups` crosses `level` between
    neighbouring points of the increasing `xs`; None where it does not cross."""
    i = crossing_segment(speedups, level)
    if i is None:
        return None
    (x0, x1), (s0, s1) = xs[i : i + 2], speedups[i : i + 2]
    t = (math.log(level) - math.log(s0)) / (math.log(s1) - math.log(s0))
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def crossing_segment(speedups: list[float], level: float = 2.0) -> int | None:
    """The first i where speedups[i], speedups[i + 1] lie on either side of `level`."""
    for i in range(len(speedups) - 1):
        s0, s1 = speedups[i], speedups[i + 1]
        if (s0 - level) * (s1 - level) <= 0 and s0 != s1:
            return i
    return None
