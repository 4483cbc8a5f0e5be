"""The statistics of a sweep, every comparison paired by seed (a variant's seed k against
the baseline's seed k: the same initialisation seed and data order):

- `mean_ci`: a mean and the half-width of its 95% t-interval (over seeds);
- `t_test`: the seed-paired t-test of a difference, its exact p with n - 1 degrees of
  freedom (`t_p`; `t_critical` inverts it);
- `bootstrap`: the crossed two-level bootstrap of a corpus metric's difference (the seeds
  drawn with replacement, and one draw of sentences that every drawn seed shares), its
  95% interval and p; `resample_seeds=False`: the sentence-level paired bootstrap alone;
- `holm`: Holm's step-down adjustment of the p-values of one family of comparisons;
- `verdicts`: better / worse only when the t-test's and the bootstrap's p, each
  Holm-adjusted over the family, are both below alpha on the same side; `verdict` reads
  one comparison from its adjusted p's (`t_verdict` one without a bootstrap).

BLEU and chrF sum sacrebleu's per-sentence statistics (docs/research.md, "The verdict")."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from jaxformer.checks import BadValue

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default
ALPHA = 0.05
METRICS = ("bleu", "chrf", "exact_match")


def t_p(t: float, df: int) -> float:
    """Two-sided p of Student's t with `df` degrees of freedom, P(|T| >= |t|): the
    regularized incomplete beta function I_x(df/2, 1/2) at x = df / (df + t^2)."""
    if df < 1:
        raise BadValue(f"t_p needs df >= 1, got {df}")
    if math.isinf(t):
        return 0.0
    x, y = df / (df + t * t), t * t / (df + t * t)  # y = 1 - x without the cancellation
    return _beta_regularized(df / 2, 0.5, x, y)


@functools.cache
def t_critical(df: int, alpha: float = ALPHA) -> float:
    """The t whose two-sided p is `alpha` (the 97.5% quantile for 0.05), by bisection."""
    low, high = 0.0, 1.0
    while t_p(high, df) > alpha:
        low, high = high, 2 * high
    while high - low > 1e-13 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if t_p(middle, df) > alpha else (low, middle)
    return (low + high) / 2


def _beta_regularized(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b) with y = 1 - x: the continued fraction where it converges fast (x below
    (a + 1) / (a + b + 2)), else 1 - I_y(b, a) (Numerical Recipes, section 6.4)."""
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    log_front += a * math.log(x) + b * math.log(y)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by Lentz's method."""

    def guard(v: float) -> float:  # keeps a partial denominator off zero
        return v if abs(v) > 1e-300 else 1e-300

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1))
    fraction = d
    for m in range(1, 10_000):
        for term in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 / guard(1.0 + term * d)
            c = guard(1.0 + term / c)
            fraction *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return fraction
    raise BadValue(f"the incomplete beta function's fraction did not converge ({a}, {b}, {x})")


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% t-interval); the half-width is None for one value."""
    mean, se = _mean_se(values)
    return mean, None if se is None else t_critical(len(values) - 1) * se


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    """The mean and its standard error, sd / sqrt(n) (None for one value)."""
    n = len(values)
    if n == 0:
        raise BadValue("mean_ci needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)


class SeedTest(NamedTuple):
    """The seed-paired t-test of (variant - baseline): one difference per paired seed."""

    difference: float  # the mean of the differences
    half_width: float | None  # of its 95% t-interval; None for one seed
    p: float  # two-sided, Student's t with seeds - 1 degrees of freedom; 1 for one seed
    seeds: int


def t_test(differences: list[float]) -> SeedTest:
    """t = mean / (sd / sqrt(n)) with its exact p (n - 1 degrees of freedom), so p < 0.05
    exactly when the 95% t-interval excludes 0. Equal differences (sd 0) give p 0, or 1
    when they are all 0."""
    mean, se = _mean_se(differences)
    n = len(differences)
    if se is None:
        return SeedTest(mean, None, 1.0, n)
    half = t_critical(n - 1) * se
    if se == 0:
        return SeedTest(mean, half, 1.0 if mean == 0 else 0.0, n)
    return SeedTest(mean, half, t_p(mean / se, n - 1), n)


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
    """The corpus score of summed statistics [..., K] -> [...] (BLEU and chrF 0-100,
    exact match 0-1: the first column's sum over the second's, the mean of any
    per-sentence value given as (value, 1) rows)."""
    if metric == "exact_match":
        return lambda total: np.asarray(total)[..., 0] / np.asarray(total)[..., 1]
    scoring = _sacrebleu(metric)

    def score(total) -> np.ndarray:
        total = np.asarray(total)
        rows = total.reshape(-1, total.shape[-1])
        scores = [scoring._compute_score_from_stats(list(row)).score for row in rows]
        return np.array(scores).reshape(total.shape[:-1])

    return score


class Bootstrap(NamedTuple):
    """A bootstrap of the mean over seeds of (variant - baseline) in a corpus metric."""

    difference: float  # observed, on all sentences of every paired seed
    low: float  # 2.5% and 97.5% quantiles of the resampled differences
    high: float
    p: float  # two-sided, for "no difference"; at least 1 / (samples + 1)
    at_floor: bool  # no resample was as extreme: the true p may be smaller
    samples: int
    seeds: int
    sentences: int  # each seed's: the same sentences in every seed


def bootstrap(
    metric: str,
    baseline: list[np.ndarray],
    variant: list[np.ndarray],
    *,
    resample_seeds: bool = True,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Bootstrap:
    """The crossed two-level bootstrap: each resample draws the seeds with replacement and
    one set of sentences (with replacement) that every drawn seed shares, and scores both
    systems of each drawn seed on it. baseline[i], variant[i]: [N, K] statistics of seed
    i's two runs on the same N sentences, in the same order in every seed. The p-value
    counts centred resampled differences at least as far from 0 as the observed one
    (identical systems: p = 1)."""
    if len(baseline) != len(variant) or not baseline:
        raise BadValue(f"bootstrap needs paired seeds, got {len(baseline)} and {len(variant)}")
    shapes = {a.shape for pair in zip(baseline, variant, strict=True) for a in pair}
    if len(shapes) != 1 or baseline[0].shape[0] == 0:
        raise BadValue(f"every seed's two runs need the same sentences, got shapes {shapes}")
    score, n, sentences = scorer(metric), len(baseline), baseline[0].shape[0]
    per_seed = [score(v.sum(0)) - score(b.sum(0)) for b, v in zip(baseline, variant, strict=True)]
    observed = float(np.mean(per_seed))
    rng = np.random.default_rng(seed)
    drawn = (
        rng.integers(0, n, (samples, n)) if resample_seeds else np.tile(np.arange(n), (samples, 1))
    )
    picks = rng.integers(0, sentences, (samples, sentences))
    rows = np.arange(samples)[:, None] * sentences + picks
    counts = np.bincount(rows.ravel(), minlength=samples * sentences).reshape(samples, -1)
    counts = counts.astype(np.float64)  # [R, N]: how often each sentence is drawn
    seed_diffs = np.stack(
        [score(counts @ v) - score(counts @ b) for b, v in zip(baseline, variant, strict=True)], 1
    )  # [R, seeds]
    diffs = np.take_along_axis(seed_diffs, drawn, axis=1).mean(1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    extreme = int(np.sum(np.abs(diffs - diffs.mean()) >= abs(observed) - 1e-12))
    return Bootstrap(
        difference=observed,
        low=float(low),
        high=float(high),
        p=(extreme + 1) / (samples + 1),
        at_floor=extreme == 0,
        samples=samples,
        seeds=n,
        sentences=sentences,
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


class Verdict(NamedTuple):
    """One comparison's verdict and the Holm-adjusted p's it was read from."""

    verdict: str
    t_p_holm: float
    p_holm: float | None  # the bootstrap's (None: the comparison has none)
    p_holm_bound: bool  # the bootstrap's adjusted p is an upper bound (from its floor)


def verdicts(
    family: list[tuple[SeedTest, Bootstrap | None]], alpha: float = ALPHA
) -> list[Verdict]:
    """The rule over one family, every comparison reported from the same runs (each
    variant, metric and reading once): the t-tests' p's and the bootstraps' p's are
    Holm-adjusted over the family, each set apart, and `verdict` reads each comparison.
    A comparison without a bootstrap (a figure of whole runs, with no sentences to
    redraw) is read from its t-test alone (`t_verdict`)."""
    t_adjusted = holm([t.p for t, _ in family], [False] * len(family))
    booted = [i for i, (_, b) in enumerate(family) if b is not None]
    b_adjusted = dict(
        zip(
            booted,
            holm([family[i][1].p for i in booted], [family[i][1].at_floor for i in booted]),
            strict=True,
        )
    )
    out = []
    for i, ((t, b), (tp, _)) in enumerate(zip(family, t_adjusted, strict=True)):
        if b is None:
            out.append(Verdict(t_verdict(t, tp, alpha), tp, None, False))
        else:
            bp, bound = b_adjusted[i]
            out.append(Verdict(verdict(t, tp, b, bp, alpha), tp, bp, bound))
    return out


def t_verdict(seed_test: SeedTest, t_p_adjusted: float, alpha: float = ALPHA) -> str:
    """ "higher" / "lower" (the variant's mean difference) when the seed-paired t-test's
    adjusted p is below `alpha`, else "no detectable difference"; one seed, no verdict."""
    if seed_test.seeds < 2:
        return "no verdict (one seed)"
    if t_p_adjusted >= alpha or seed_test.difference == 0:
        return "no detectable difference"
    return "higher" if seed_test.difference > 0 else "lower"


def verdict(
    seed_test: SeedTest,
    t_p_adjusted: float,
    result: Bootstrap,
    p_adjusted: float,
    alpha: float = ALPHA,
) -> str:
    """ "better" / "worse" (the variant against the baseline) when both the seed-paired
    t-test's and the crossed bootstrap's adjusted p are below `alpha` and both say that
    side (the mean difference, and the bootstrap's 95% interval, on it). The t-test
    carries the spread between training runs, which a bootstrap of a few seeds can only
    redraw; the bootstrap carries the choice of sentences, which the t-test takes as
    fixed. Else "no detectable difference"; one paired seed gives no verdict (the
    variance between training runs is unknown)."""
    if seed_test.seeds < 2 or result.seeds < 2:
        return "no verdict (one seed)"
    if max(t_p_adjusted, p_adjusted) >= alpha:
        return "no detectable difference"
    if seed_test.difference > 0 and result.low > 0:
        return "better"
    if seed_test.difference < 0 and result.high < 0:
        return "worse"
    return "no detectable difference"


def format_p(p: float, bound: bool = False) -> str:
    """ "0.042" ("0.00014" below 0.001), or "< 0.001" for a p at the bootstrap floor
    1 / (samples + 1)."""
    if bound:
        return f"< {p:.2g}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"
