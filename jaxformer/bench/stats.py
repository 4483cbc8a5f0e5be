"""Timing statistics: calls of several modes interleaved so that machine noise hits them
alike, medians with distribution-free confidence intervals, and break-even call counts."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from jaxformer.checks import BadValue


def median_ci(samples: list[float], confidence: float = 0.95) -> dict:
    """The median of `samples` and an interval [low, high] that holds the true median with
    probability >= `confidence`: order statistics x_(a), x_(n+1-a) with a from the binomial
    distribution Bin(n, 1/2), which assumes nothing about how the times are distributed."""
    if not 0 < confidence < 1:
        raise BadValue(f"confidence must be in (0, 1), got {confidence}")
    x = sorted(samples)
    n = len(x)
    if n == 0 or 1 - 2 * 0.5**n < confidence:
        raise BadValue(f"{n} samples cannot give a {confidence:.0%} interval of the median")
    pmf = [math.comb(n, i) / 2**n for i in range(n + 1)]
    a = 1  # the widest interval [x_(1), x_(n)] covers with 1 - 2 / 2^n
    while sum(pmf[a + 1 : n - a]) >= confidence:  # coverage of [x_(a+1), x_(n-a)]
        a += 1
    mid = (x[(n - 1) // 2] + x[n // 2]) / 2
    return {"median": mid, "low": x[a - 1], "high": x[n - a], "n": n}


def break_even(compile_s: float, slow: dict, fast: dict) -> int | None:
    """Calls after which compiling (compile_s seconds, once) has paid for itself: compile_s
    / (slow - fast per call, medians of median_ci). None ("never") where the compiled
    program is not faster."""
    saved = slow["median"] - fast["median"]
    return math.ceil(compile_s / saved) if saved > 0 else None


def faster(slow: dict, fast: dict) -> bool:
    """Whether `fast` is faster beyond doubt: the two intervals do not overlap."""
    return fast["high"] < slow["low"]


def time_interleaved(
    calls: dict[str, Callable[[], object]], rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds of each call over `rounds` rounds, every round calling each mode once, in
    an order rotated by one each round. Each callable must wait for its own result."""
    if rounds < 1 or warmup < 0:
        raise BadValue(f"rounds must be >= 1 and warmup >= 0, got {rounds} and {warmup}")
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - t0)
    return times
