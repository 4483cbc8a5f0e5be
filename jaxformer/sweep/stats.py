"""The statistics of a sweep, every comparison paired by seed (a variant's seed k against
the baseline's seed k: the same initialisation seed and data order):

- `mean_ci`: a mean and the half-width of its 95% t-interval (over seeds);
- `bootstrap`: the two-level bootstrap of a corpus metric's difference (resample the
  seeds, then the sentences within each seed), with its 95% interval and p-value;
  with `resample_seeds=False` the sentence-level paired bootstrap alone, which ignores
  the variance between training runs;
- `holm`: Holm's step-down adjustment of the p-values of one sweep's variants;
- `verdict`: better / worse / no detectable difference, read from those.

Corpus BLEU and chrF come from sacrebleu's per-sentence sufficient statistics, summed
over the resampled sentences, as sacrebleu's own paired test does.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxformer.checks import BadValue

# Student's t, 97.5% quantile, by degrees of freedom; between entries the smaller degrees
# of freedom's (a slightly wider interval) is used.
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    60: 2.000,
    120: 1.980,
}
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default
ALPHA = 0.05
METRICS = ("bleu", "chrf", "exact_match")


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% t-interval); the half-width is None for one value."""
    n = len(values)
    if n == 0:
        raise BadValue("mean_ci needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    t = T_975[max(df for df in T_975 if df <= n - 1)] if n - 1 <= 120 else 1.960
    return mean, t * sd / math.sqrt(n)


def _sacrebleu(metric: str):
    from sacrebleu.metrics import BLEU, CHRF

    return {"bleu": BLEU, "chrf": CHRF}[metric]()


def sentence_stats(metric: str, hypotheses: list[str], references: list[str]) -> np.ndarray:
    """[N, K] per-sentence sufficient statistics of `metric` (one of METRICS): sacrebleu's
    for BLEU and chrF, (match, 1) for exact match. Their column sums give `corpus_score`."""
    if metric not in METRICS:
        raise BadValue(f"metric must be one of {METRICS}, got {metric!r}")
    if len(hypotheses) != len(references) or not hypotheses:
        raise BadValue(
            f"sentence_stats needs as many hypotheses as references (>= 1), got "
            f"{len(hypotheses)} and {len(references)}"
        )
    if metric == "exact_match":
        return np.array(
            [[h == r, 1] for h, r in zip(hypotheses, references, strict=True)], np.float64
        )
    rows = _sacrebleu(metric)._extract_corpus_statistics(hypotheses, [references])
    return np.asarray(rows, np.float64)


def scorer(metric: str):
    """The corpus score of summed statistics [K] (BLEU and chrF 0-100, exact match 0-1)."""
    if metric == "exact_match":
        return lambda total: float(total[0] / total[1])
    scoring = _sacrebleu(metric)
    return lambda total: float(scoring._compute_score_from_stats(list(total)).score)


class Bootstrap(NamedTuple):
    """A bootstrap of the mean over seeds of (variant - baseline) in a corpus metric."""

    difference: float  # observed, on all sentences of every paired seed
    low: float  # 2.5% and 97.5% quantiles of the resampled differences
    high: float
    p: float  # two-sided, for "no difference"; at least 1 / (samples + 1)
    at_floor: bool  # no resample was as extreme: the true p may be smaller
    samples: int
    seeds: int
    sentences: int  # summed over the paired seeds


def bootstrap(
    metric: str,
    baseline: list[np.ndarray],
    variant: list[np.ndarray],
    *,
    resample_seeds: bool = True,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Bootstrap:
    """Resample the seeds (with replacement), then within each drawn seed its sentences,
    and score both systems on the same draw. baseline[i], variant[i]: [N_i, K] statistics
    of seed i's two runs on the same N_i sentences. The p-value counts centred resampled
    differences at least as far from 0 as the observed one (identical systems: p = 1)."""
    if len(baseline) != len(variant) or not baseline:
        raise BadValue(f"bootstrap needs paired seeds, got {len(baseline)} and {len(variant)}")
    for b, v in zip(baseline, variant, strict=True):
        if b.shape != v.shape or b.shape[0] == 0:
            raise BadValue(f"a seed's two runs need the same sentences, got {b.shape}, {v.shape}")
    score, n = scorer(metric), len(baseline)
    observed = np.mean(
        [score(v.sum(0)) - score(b.sum(0)) for b, v in zip(baseline, variant, strict=True)]
    )
    rng = np.random.default_rng(seed)
    diffs = np.empty(samples)
    for r in range(samples):
        drawn = rng.integers(0, n, n) if resample_seeds else range(n)
        total = 0.0
        for i in drawn:
            idx = rng.integers(0, len(baseline[i]), len(baseline[i]))
            total += score(variant[i][idx].sum(0)) - score(baseline[i][idx].sum(0))
        diffs[r] = total / n
    low, high = np.percentile(diffs, [2.5, 97.5])
    extreme = int(np.sum(np.abs(diffs - diffs.mean()) >= abs(observed) - 1e-12))
    return Bootstrap(
        difference=float(observed),
        low=float(low),
        high=float(high),
        p=(extreme + 1) / (samples + 1),
        at_floor=extreme == 0,
        samples=samples,
        seeds=n,
        sentences=sum(len(b) for b in baseline),
    )


def holm(p_values: list[float], at_floor: list[bool]) -> list[tuple[float, bool]]:
    """Holm's step-down adjustment: (adjusted p, whether it is an upper bound because it
    comes from a p at the bootstrap floor and no exact p ties it), in the order given."""
    if len(p_values) != len(at_floor):
        raise BadValue(f"holm needs a floor flag per p, got {len(p_values)} and {len(at_floor)}")
    m, out = len(p_values), [(1.0, False)] * len(p_values)
    running, bound = 0.0, False
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        candidate = min(1.0, (m - rank) * p_values[i])
        if candidate > running or (candidate == running and not at_floor[i]):
            running, bound = candidate, at_floor[i]
        out[i] = (running, bound)
    return out


def verdict(
    result: Bootstrap,
    p_adjusted: float,
    seed_interval: tuple[float, float] | None = None,
    alpha: float = ALPHA,
) -> str:
    """ "better" / "worse" (the variant against the baseline) when the adjusted p is below
    `alpha`, the 95% interval excludes 0 on that side and so does `seed_interval`, the
    (low, high) t-interval of the seed-by-seed differences, where given: with a few seeds
    the two-level bootstrap can only redraw those few, so it can understate the spread
    between training runs, and a verdict needs both. Else "no detectable difference"; one
    paired seed gives no verdict (the variance between training runs is unknown)."""
    if result.seeds < 2:
        return "no verdict (one seed)"
    low, high = seed_interval or (result.low, result.high)
    if p_adjusted < alpha and result.low > 0 and low > 0:
        return "better"
    if p_adjusted < alpha and result.high < 0 and high < 0:
        return "worse"
    return "no detectable difference"


def format_p(p: float, bound: bool) -> str:
    """ "0.042", or "< 0.001" for a p at the bootstrap floor 1 / (samples + 1)."""
    return f"< {p:.2g}" if bound else f"{p:.3f}"
