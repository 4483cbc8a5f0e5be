"""Timing statistics: calls of several modes interleaved so that machine noise hits them
alike, medians with distribution-free confidence intervals, paired per-round ratios and
savings, and break-even call counts with their intervals."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from jaxformer.checks import BadValue


def median_ci(samples: list[float], confidence: float = 0.95) -> dict:
    """The median of `samples` and an interval [low, high] that holds the true median with
    probability >= `confidence`: order statistics x_(a), x_(n+1-a) with a from the binomial
    distribution Bin(n, 1/2), which assumes nothing about how the values are distributed.
    Returns {median, low, high, n, confidence}."""
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
    return {"median": mid, "low": x[a - 1], "high": x[n - a], "n": n, "confidence": confidence}


def best_median_ci(samples: list[float]) -> dict:
    """median_ci at 95%, or, for fewer than 6 samples (fresh processes are costly), at the
    coverage of [min, max]: 1 - 2^(1-n) (50% for 2, 75% for 3); the key "confidence" says
    which; one sample is its own median, with no interval (confidence 0)."""
    if len(samples) == 1:
        return {
            "median": samples[0],
            "low": samples[0],
            "high": samples[0],
            "n": 1,
            "confidence": 0.0,
        }
    return median_ci(samples, min(0.95, 1 - 0.5 ** (len(samples) - 1)))


def paired_ratio(slow: list[float], fast: list[float]) -> dict:
    """The median over rounds of slow_i / fast_i (a speed-up when `fast` is the compiled
    mode) with its 95% order-statistic interval: each interleaved round is a pair, so noise
    that hits a whole round cancels."""
    _check_pairs(slow, fast)
    return median_ci([s / f for s, f in zip(slow, fast, strict=True)])


def best_paired_ratio(slow: list[float], fast: list[float]) -> dict:
    """paired_ratio for rounds too few (or too costly) for a 95% interval: the per-round
    ratios' best_median_ci (the key "confidence" says which coverage)."""
    _check_pairs(slow, fast)
    return best_median_ci([s / f for s, f in zip(slow, fast, strict=True)])


def paired_saving(slow: list[float], fast: list[float]) -> dict:
    """The median over rounds of slow_i - fast_i (seconds saved per call), 95% interval."""
    _check_pairs(slow, fast)
    return median_ci([s - f for s, f in zip(slow, fast, strict=True)])


def _check_pairs(slow: list[float], fast: list[float]) -> None:
    if len(slow) != len(fast):
        raise BadValue(f"paired series need equal lengths, got {len(slow)} and {len(fast)}")


def break_even(first_slow: dict, first_fast: dict, saving: dict) -> dict:
    """Calls after which the compiled mode has paid for itself, counted from the first call
    of each mode: the smallest n >= 1 with first_fast + (n - 1) fast <= first_slow + (n - 1)
    slow, i.e. n = 1 + ceil((first_fast - first_slow) / saving), clipped at 1.

    first_slow, first_fast: first-call seconds (median_ci of fresh processes; the compiled
    one includes compiling); saving: paired_saving per later call. Returns {verdict, calls,
    low, high}: verdict "not significant" where the saving's interval contains 0, "never"
    where the compiled mode is slower beyond its interval, "from call 1" where it is ahead
    at once, else "pays off"; low and high from the corners of both intervals."""
    if saving["low"] <= 0 <= saving["high"]:
        return {"verdict": "not significant", "calls": None, "low": None, "high": None}
    if saving["high"] < 0:
        return {"verdict": "never", "calls": None, "low": None, "high": None}

    def calls(extra: float, saved: float) -> int:
        return 1 + max(0, math.ceil(extra / saved))

    extra = first_fast["median"] - first_slow["median"]
    corners = [
        calls(e, s)
        for e in (first_fast["low"] - first_slow["high"], first_fast["high"] - first_slow["low"])
        for s in (saving["low"], saving["high"])
    ]
    n = calls(extra, saving["median"])
    verdict = "from call 1" if n == 1 else "pays off"
    return {"verdict": verdict, "calls": n, "low": min(corners), "high": max(corners)}


class Elapsed(float):
    """Seconds a call measured itself (a worker process, by its own clock): returned by a
    call, `time_interleaved` takes them instead of its clock's, which would add the round
    trip of the messages."""


def time_interleaved(
    calls: dict[str, Callable[[], object]], rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds of each call over `rounds` rounds, every round calling each mode once, in
    an order rotated by one each round (so entry i of every list is one round: a pair).
    Each callable must wait for its own result; one that returns an `Elapsed` gives its
    own seconds."""
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
            out = calls[name]()
            seconds = time.perf_counter() - t0
            times[name].append(float(out) if isinstance(out, Elapsed) else seconds)
    return times
