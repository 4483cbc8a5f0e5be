"""The statistics of a sweep: a 95% confidence interval of a mean over seeds, and paired
bootstrap p-values of a variant against the baseline on the same test sentences."""

from __future__ import annotations

import math

import numpy as np

from jaxformer.checks import BadValue

# Student's t, 97.5% quantile, by degrees of freedom; between entries the smaller degrees
# of freedom's (a slightly wider interval) is used.
T_975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980,
}  # fmt: skip
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default


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


def paired_bleu_chrf(baseline: list[str], variant: list[str], references: list[str]) -> dict:
    """sacrebleu's paired bootstrap resampling test (1000 resamples, its seed): the
    p-values of BLEU and chrF differences, {"bleu": p, "chrf": p}. Identical outputs get
    p = 1: sacrebleu's count of resampled differences above the observed one is strict,
    so with no difference at all it would report its smallest p."""
    if baseline == variant:
        return {"bleu": 1.0, "chrf": 1.0}
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("baseline", baseline), ("variant", variant)],
        {"bleu": BLEU(), "chrf": CHRF()},
        [references],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, scores = test()  # keyed by sacrebleu's own names ("BLEU", "chrF2"), in metric order
    columns = [column for name, column in scores.items() if name != "System"]
    return {
        name: float(column[1].p_value)
        for name, column in zip(("bleu", "chrf"), columns, strict=True)
    }


def paired_exact_match(baseline: list[bool], variant: list[bool]) -> float:
    """The same paired bootstrap test as sacrebleu's, for exact match (which it lacks):
    resample the sentences, centre the resampled absolute differences, and count how
    often they exceed the observed one. Identical outputs get p = 1."""
    a, b = np.asarray(baseline, float), np.asarray(variant, float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise BadValue(
            f"paired_exact_match needs two equal, non-empty lists, got {a.shape}, {b.shape}"
        )
    if np.array_equal(a, b):
        return 1.0
    observed = abs(a.mean() - b.mean())
    idx = np.random.default_rng(BOOTSTRAP_SEED).integers(0, a.size, (BOOTSTRAP_SAMPLES, a.size))
    diffs = np.abs(a[idx].mean(1) - b[idx].mean(1))
    return float((np.sum(diffs - diffs.mean() > observed) + 1) / (BOOTSTRAP_SAMPLES + 1))
