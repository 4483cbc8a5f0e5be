"""The sweep's verdict rule by simulation (`jaxformer sweep calibrate [--repetitions 1000]
[--out docs/results/verdict_calibration.json]`): how often it calls a variant better or
worse when every variant equals the baseline (the familywise false-positive rate of a
4-variant sweep), and how often it finds a real gain (power), through the library's own
functions (jaxformer_lab.sweep.stats: t_test, bootstrap, verdicts).

Every run scores the same N dev sentences; run (system s, seed j) scores sentence i at

    x = 20 + d_i + effect_s + b_si + u_sj + e_sji

(the sentence's difficulty, the system's true gain, a sentence-specific effect of the
system of SD `sentence_effect_sd`, the run's seed effect of SD `seed_sd`, noise of SD 5).
A run's corpus score is the mean of its sentences'; the verdicts are read over the family
of the sweep's variants. `record` is the power table as a results file. The model in full:
docs/research.md, "How often the rule errs, and what it finds"."""

from __future__ import annotations

import json
import math
import time

import numpy as np

from jaxformer_lab.results import Record, Table, capture
from jaxformer_lab.sweep import stats

NOISE_SD = 5.0  # per sentence and run
DIFFICULTY_SD = 10.0
SEEDS = (2, 3, 5, 8)
SEED_SDS = (0.5, 1.0, 1.5)
EFFECTS = (1.0, 2.0)


def simulate(
    seeds: int,
    seed_sd: float,
    *,
    effect: float = 0.0,
    sentence_effect_sd: float = 0.0,
    variants: int = 4,
    sentences: int = 400,
    repetitions: int = 1000,
    samples: int = stats.BOOTSTRAP_SAMPLES,
    rng_seed: int = 0,
) -> dict:
    """Counts over `repetitions` simulated sweeps of `variants` variants against one
    baseline, the first variant `effect` better and the others equal: "false" (a sweep
    where any equal variant was called better or worse), "unadjusted" (where any equal
    variant's unadjusted t p was below 0.05: what the rule would do without Holm or the
    bootstrap) and "found" (the first variant called better)."""
    rng, score = np.random.default_rng(rng_seed), stats.scorer("exact_match")
    counts = {"repetitions": repetitions, "false": 0, "unadjusted": 0, "found": 0}
    for r in range(repetitions):
        difficulty = rng.normal(0, DIFFICULTY_SD, sentences)
        base = _runs(rng, difficulty, seeds, seed_sd, 0.0)
        family, null_p = [], []
        for v in range(variants):
            gain = effect if v == 0 else 0.0
            specific = difficulty + rng.normal(0, sentence_effect_sd, sentences)
            runs = _runs(rng, specific, seeds, seed_sd, gain)
            differences = [
                float(score(a.sum(0)) - score(b.sum(0))) for a, b in zip(runs, base, strict=True)
            ]
            test = stats.t_test(differences)
            boot = stats.bootstrap("exact_match", base, runs, samples=samples, seed=r * 97 + v)
            family.append((test, boot))
            if gain == 0:
                null_p.append(test.p)
        read = [v.verdict for v in stats.verdicts(family)]
        null = read[1:] if effect else read
        counts["false"] += any(word in ("better", "worse") for word in null)
        counts["unadjusted"] += any(p < stats.ALPHA for p in null_p)
        counts["found"] += bool(effect) and read[0] == "better"
    return counts


def _runs(rng, mean_i: np.ndarray, seeds: int, seed_sd: float, gain: float) -> list:
    """One system's runs: per seed, [N, 2] statistics (sentence score, 1)."""
    out = []
    for _ in range(seeds):
        x = 20 + mean_i + gain + rng.normal(0, seed_sd) + rng.normal(0, NOISE_SD, len(mean_i))
        out.append(np.column_stack([x, np.ones_like(x)]))
    return out


def binomial_bound(repetitions: int, rate: float, tail: float) -> int:
    """The least k with P(Binomial(repetitions, rate) > k) <= tail: a rule whose true
    rate is `rate` exceeds k false positives with probability at most `tail`."""
    total, k = 0.0, 0
    while True:
        total += math.comb(repetitions, k) * rate**k * (1 - rate) ** (repetitions - k)
        if 1 - total <= tail:
            return k
        k += 1


def wilson(count: int, n: int) -> str:
    """ "4.6% [3.4, 6.1]": a rate with its 95% Wilson interval, in percent."""
    z, p = 1.959963984540054, count / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{100 * p:.1f}% [{100 * (centre - half):.1f}, {100 * (centre + half):.1f}]"


def table(repetitions: int, samples: int, say=print) -> tuple[list[list[str]], dict]:
    """The power table's rows (one per seed count) and the raw counts of every cell; each
    seed count's counts are said (`say`) as they are made."""
    rows, raw = [], {}
    for i, seeds in enumerate(SEEDS):
        cells = {}
        for j, sd in enumerate(SEED_SDS):
            cells[f"false, seed SD {sd:g}"] = simulate(
                seeds, sd, repetitions=repetitions, samples=samples, rng_seed=100 * i + j
            )
        for sd in (0.5, 1.0):
            for k, effect in enumerate(EFFECTS):
                cells[f"power +{effect:g}, seed SD {sd:g}"] = simulate(
                    seeds, sd, effect=effect, repetitions=repetitions, samples=samples,
                    rng_seed=100 * i + 10 + 2 * SEED_SDS.index(sd) + k,
                )  # fmt: skip
        cells["false, sentence effects SD 7"] = simulate(
            seeds, 0.5, sentence_effect_sd=7.0, repetitions=repetitions, samples=samples,
            rng_seed=100 * i + 20,
        )  # fmt: skip
        raw[str(seeds)] = cells
        rows.append([str(seeds)] + [_rate(name, c) for name, c in cells.items()])
        say(json.dumps({"seeds": seeds} | cells))
    return rows, raw


def _rate(name: str, counts: dict) -> str:
    return wilson(counts["found" if name.startswith("power") else "false"], counts["repetitions"])


def record(repetitions: int = 1000, samples: int = stats.BOOTSTRAP_SAMPLES, say=print) -> Record:
    """The power table as a results record (its device, versions and date this process's)."""
    started = time.perf_counter()
    rows, raw = table(repetitions, samples, say)
    columns = ["seeds"]
    columns += [f"false better/worse, seed SD {sd:g}" for sd in SEED_SDS]
    columns += [f"power at +{e:g}, seed SD {sd:g}" for sd in (0.5, 1.0) for e in EFFECTS]
    columns += ["false, sentence effects SD 7 (seed SD 0.5)"]
    made = Table(
        columns=columns, rows=rows, align="r" * len(columns), caption=caption(repetitions, samples)
    )
    made.notes.append(f"{time.perf_counter() - started:.0f} s of simulation.")
    source = "simulated sweeps through jaxformer_lab.sweep.stats (t_test, bootstrap, verdicts)"
    return capture([made], source=source, data=raw)


def caption(repetitions: int, samples: int) -> str:
    return (
        f"The verdict rule on {repetitions:,} simulated sweeps a cell (4 variants against one "
        f"baseline, 400 dev sentences, sentence noise SD {NOISE_SD:g}, bootstrap "
        f"{samples:,} resamples), each rate with its 95% Wilson interval over the "
        "repetitions: how often some variant was called better or worse when all 4 equal "
        "the baseline (the familywise false-positive rate), at a seed SD (the spread of a "
        "configuration's score between training runs) of 0.5, 1 and 1.5 BLEU; how often "
        "one variant that is 1 or 2 BLEU better was called better (its power; the other "
        "3 equal); and the false-positive rate when each variant helps some sentences and "
        "hurts others by SD 7 in every seed, with no gain on average:"
    )
