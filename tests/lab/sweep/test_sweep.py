"""Sweeps: the spec's checks, the statistics on known values, and a 2-variant x 2-seed
sweep of a few steps that writes its table and, run again after losing a run, reruns only
that one."""

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxformer import checkpoints
from jaxformer.cli import main
from jaxformer.train.config import load_run
from jaxformer_lab import cores as cores_lib
from jaxformer_lab import records, sweep
from jaxformer_lab.sweep import runner, stats
from tests.test_config import FLAT_DEFAULT_RUN

BASE = dict(
    task="copy",
    steps=4,
    batch_size=8,
    eval_every=2,
    log_every=2,
    checkpoint_every=2,
    eval_examples=8,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
    max_len=48,
)


ROOT = pathlib.Path(__file__).resolve().parents[3]
VARIANT = ROOT / "experiments/variants/squared_relu.py"


def write_spec(tmp_path, **fields):
    """Baseline and a registered variant of our own (squared ReLU), two seeds."""
    spec = dict(
        base=BASE,
        variants={"baseline": {}, "sq": {"activation": "squared_relu"}},
        seeds=2,
        variant_files=[str(VARIANT)],
    )
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec | {"out": str(tmp_path / "sweep")} | fields))
    return path


def test_mean_ci_is_the_t_interval():
    mean, half = stats.mean_ci([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.3027
    assert mean == 2.0 and half == pytest.approx(4.302652729749462 / 3**0.5, rel=1e-12)
    assert stats.mean_ci([5.0]) == (5.0, None)
    assert stats.mean_ci([1.0] * 40)[1] == 0.0
    with pytest.raises(ValueError, match="at least one value"):
        stats.mean_ci([])


# The 97.5% quantiles of Student's t (the t-tables' 12.706, 4.303, ...), to the digits
# scipy.stats.t.ppf(0.975, df) gives.
T_975 = {
    1: 12.706204736174694,
    2: 4.302652729749462,
    3: 3.1824463052837078,
    5: 2.5705818356363146,
    10: 2.228138851986274,
    30: 2.0422724563012378,
    120: 1.9799304050824402,
}


@pytest.mark.parametrize("t", [0.0, 1e-9, 0.3, 1.0, 2.5, 7.0, 60.0, 1e5])
def test_the_t_p_value_is_exact_where_a_closed_form_exists(t):
    """Two-sided p of Student's t with 1, 2 and 3 degrees of freedom, written in closed form."""
    root3 = math.sqrt(3)
    assert stats.t_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-12, abs=1e-15)
    assert stats.t_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10, abs=1e-15)
    three = 1 - 2 / math.pi * (math.atan(t / root3) + root3 * t / (3 + t * t))
    assert stats.t_p(t, 3) == pytest.approx(three, rel=1e-9, abs=1e-14)
    assert stats.t_p(-t, 3) == stats.t_p(t, 3)


def test_the_t_quantiles_are_the_tables_and_invert_the_p_value():
    for df, t in T_975.items():
        assert stats.t_critical(df) == pytest.approx(t, rel=1e-11)
        assert stats.t_p(t, df) == pytest.approx(0.05, rel=1e-11)
    assert stats.t_p(1.959963984540054, 10**6) == pytest.approx(0.05, rel=1e-5)  # the normal
    assert stats.t_p(math.inf, 4) == 0.0
    with pytest.raises(ValueError, match="df >= 1"):
        stats.t_p(1.0, 0)


def test_the_t_test_is_significant_exactly_when_its_interval_excludes_0():
    result = stats.t_test([1.0, 2.0, 3.0])  # t = 2 / (1 / sqrt 3), 2 degrees of freedom
    assert result.p == pytest.approx(1 - 12**0.5 / 14**0.5, rel=1e-12) and result.seeds == 3
    assert stats.t_test([3.0]) == stats.SeedTest(3.0, None, 1.0, 1)
    assert stats.t_test([2.0, 2.0]).p == 0.0 and stats.t_test([0.0, 0.0]).p == 1.0
    rng = np.random.default_rng(0)
    for _ in range(200):
        values = list(rng.normal(0.5, 1.0, rng.integers(2, 9)))
        t = stats.t_test(values)
        assert (t.p < 0.05) == (abs(t.difference) > t.half_width)


WORDS = "the a cat dog sat on mat near house river over under and then".split()
REFS = [" ".join(np.random.default_rng(i).choice(WORDS, 12)) for i in range(150)]


def system(quality: float, seed: int) -> list[str]:
    """REFS with each word dropped with probability 1 - quality (seeded)."""
    rng = np.random.default_rng(seed)
    return [" ".join(w for w in r.split() if rng.random() < quality) or "x" for r in REFS]


def seed_stats(metric, qualities, offset):
    return [
        stats.sentence_stats(metric, system(q, offset + i), REFS) for i, q in enumerate(qualities)
    ]


@pytest.mark.parametrize("metric, corpus", [("bleu", "corpus_bleu"), ("chrf", "corpus_chrf")])
def test_sentence_statistics_reaggregate_to_the_corpus_score(metric, corpus):
    import sacrebleu

    hyps = system(0.7, 0)
    total = stats.sentence_stats(metric, hyps, REFS).sum(0)
    assert stats.scorer(metric)(total) == getattr(sacrebleu, corpus)(hyps, [REFS]).score
    assert (
        stats.scorer("exact_match")(
            stats.sentence_stats("exact_match", REFS[:3] + hyps[3:4], REFS[:4]).sum(0)
        )
        == 0.75
    )


def seed_test(base, variant, metric="bleu"):
    """The seed-paired t-test of two systems' per-seed corpus scores."""
    score = stats.scorer(metric)
    return stats.t_test(
        [float(score(v.sum(0)) - score(b.sum(0))) for b, v in zip(base, variant, strict=True)]
    )


def test_identical_systems_give_p_one():
    same = seed_stats("bleu", [0.6, 0.7, 0.8], 0)
    result = stats.bootstrap("bleu", same, same, samples=200)
    assert result.difference == 0 and result.p == 1 and not result.at_floor
    [read] = stats.verdicts([(seed_test(same, same), result)])
    assert read.verdict == "no detectable difference" and read.t_p_holm == 1.0


def test_a_real_shift_is_detected_with_its_interval():
    base = seed_stats("bleu", [0.6, 0.62, 0.58], 0)
    better = seed_stats("bleu", [0.8, 0.82, 0.78], 10)
    result = stats.bootstrap("bleu", base, better, samples=200)
    assert 10 < result.low < result.difference < result.high and result.at_floor
    assert result.p == 1 / 201 and stats.format_p(result.p, result.at_floor) == "< 0.005"
    assert result.sentences == len(REFS) and result.seeds == 3
    [read] = stats.verdicts([(seed_test(base, better), result)])
    assert read.verdict == "better" and read.t_p_holm < 0.01
    worse = stats.bootstrap("bleu", better, base, samples=200)
    [read] = stats.verdicts([(seed_test(better, base), worse)])
    assert worse.high < 0 and read.verdict == "worse"


def test_a_difference_smaller_than_the_seed_spread_gets_no_verdict():
    """Each seed's two runs differ clearly on its sentences, but in opposite directions
    from seed to seed: the sentence-level test (seeds fixed) calls it, the two-level one
    does not."""
    base = seed_stats("bleu", [0.6, 0.6, 0.6, 0.6], 0)
    variant = seed_stats("bleu", [0.8, 0.8, 0.45, 0.45], 10)
    two_level = stats.bootstrap("bleu", base, variant, samples=300)
    sentence_level = stats.bootstrap("bleu", base, variant, samples=300, resample_seeds=False)
    assert sentence_level.p < 0.05 and sentence_level.low > 0
    assert two_level.low < 0 < two_level.high and two_level.p > 0.2
    [read] = stats.verdicts([(seed_test(base, variant), two_level)])
    assert read.verdict == "no detectable difference"
    one = stats.SeedTest(5.0, None, 1.0, 1)
    assert stats.verdict(one, 0.001, two_level._replace(seeds=1), 0.001) == "no verdict (one seed)"


def test_the_sentence_draw_is_shared_by_the_seeds():
    """Seeds that translate alike add no information about the sentences: with one
    sentence draw for every seed, four identical seeds give the interval of one, where
    drawing each seed's sentences apart would shrink it by about sqrt(4)."""
    rng = np.random.default_rng(0)
    base = np.column_stack([rng.random(400) < 0.5, np.ones(400)]).astype(float)
    variant = np.column_stack([rng.random(400) < 0.5, np.ones(400)]).astype(float)
    one = stats.bootstrap("exact_match", [base], [variant])
    four = stats.bootstrap("exact_match", [base] * 4, [variant] * 4)
    assert four.difference == one.difference
    assert (four.high - four.low) == pytest.approx(one.high - one.low, rel=0.1)
    with pytest.raises(ValueError, match="the same sentences"):
        stats.bootstrap("exact_match", [base, base], [variant, variant[:-1]])


def test_a_verdict_needs_both_tests_each_adjusted_over_the_family():
    """The t-test carries the spread between training runs, the bootstrap the choice of
    sentences: each alone can be clear while the other is not."""
    clear = stats.Bootstrap(2.0, 1.0, 3.0, 0.001, True, 1000, 3, 400)
    unclear = clear._replace(low=-1.0, p=0.3, at_floor=False)
    steady, unsteady = stats.SeedTest(2.0, 0.5, 0.004, 3), stats.SeedTest(2.0, 4.0, 0.2, 3)
    assert [v.verdict for v in stats.verdicts([(steady, clear)])] == ["better"]
    assert stats.verdicts([(unsteady, clear)])[0].verdict == "no detectable difference"
    assert stats.verdicts([(steady, unclear)])[0].verdict == "no detectable difference"
    # 0.004 survives Holm over 12 comparisons (0.048), not over 13 (0.052)
    null = (stats.SeedTest(0.1, 1.0, 0.9, 3), unclear._replace(p=0.9))
    reads = stats.verdicts([(steady, clear)] + [null] * 11)
    assert reads[0].verdict == "better" and reads[0].t_p_holm == pytest.approx(0.048)
    assert reads[0].p_holm == pytest.approx(0.012) and reads[0].p_holm_bound
    assert stats.verdicts([(steady, clear)] + [null] * 12)[0].verdict == "no detectable difference"
    worse = (steady._replace(difference=-2.0), clear._replace(difference=-2, low=-3, high=-1))
    assert stats.verdicts([worse])[0].verdict == "worse"
    assert stats.verdicts([(worse[0], clear)])[0].verdict == "no detectable difference"


def test_holm_adjusts_step_down_and_keeps_the_floor_a_bound():
    adjusted = stats.holm([0.01, 0.04, 0.03], [False] * 3)
    assert [p for p, _ in adjusted] == pytest.approx([0.03, 0.06, 0.06])
    floor = 1 / 1001
    adjusted = stats.holm([floor, 0.5], [True, False])
    assert adjusted == [(pytest.approx(2 * floor), True), (0.5, False)]
    assert stats.format_p(*adjusted[0]) == "< 0.002" and stats.format_p(0.5, False) == "0.500"
    assert stats.format_p(0.000137) == "0.00014"  # an exact p (the t-test's) below 0.001
    # a floor p whose adjusted value an exact p equals: that value is exact, not a bound
    adjusted = stats.holm([floor, floor, floor, 4 / 1001], [True, True, True, False])
    assert adjusted == [(pytest.approx(4 * floor), True)] * 3 + [(pytest.approx(4 * floor), False)]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"variant": {}}, "unknown key 'variant'"),
        ({"variants": {}}, "variants must be a non-empty mapping"),
        (
            {"variants": {"a": {"d_modle": 32}}},
            "variant 'a': unknown field 'd_modle' .*did you mean 'd_model'",
        ),
        ({"variants": {"a": {"activation": "swishy"}}}, "variant 'a': activation must be one of"),
        ({"variants": {"a": {"seed": 3}}}, "'seed' is set by the sweep"),
        ({"seeds": 0}, "seeds must be a count >= 1"),
        ({"seeds": [1, 1]}, "seeds must be a count >= 1 or a list of distinct ints"),
        ({"baseline": "b"}, "baseline 'b' is not one of the variants"),
        (
            {"grid": {"num_haeds": [1, 2]}},
            "grid: unknown field 'num_haeds' .*did you mean 'num_heads'",
        ),
        ({"grid": {"num_heads": 4}}, "grid: num_heads must be a non-empty list"),
        ({"grid": {"num_heads": [1]}, "variants": {"num_heads=1": {}}}, "also a named variant"),
        ({"variants": {"a": {"final_test": True}}}, "'final_test' is set for the whole sweep"),
        ({"stages": {"sq": {}}}, "'sq' is both a stage and a variant"),
        ({"stages": {"pre": {"d_fff": 8}}}, "stage 'pre': unknown field 'd_fff'"),
        (
            {"stages": {"pre": {}}, "variants": {"a": {"init_from": {"stage": "pro"}}}},
            "variant 'a': init_from {'stage': 'pro'} names no stage; .* stages \\['pre'\\]",
        ),
        (
            {"stages": {"pre": {}, "pre2": {"init_from": {"stage": "pre"}}}},
            "stage 'pre2': a stage cannot start from a stage",
        ),
        (
            {"stages": {"pre": {}}, "base": BASE | {"init_from": {"stage": "pre"}}},
            "base: init_from {stage: NAME} is set in a variant",
        ),
    ],
)
def test_bad_specs_are_one_clear_error(tmp_path, capsys, fields, message):
    path = write_spec(tmp_path, **fields)
    with pytest.raises(ValueError, match=message):
        sweep.Spec.load(path)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer sweep: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()  # nothing ran


@pytest.mark.parametrize(
    "name, text",
    [
        (
            "spec.yaml",
            "base: {task: copy}\nvariants:\n  a: {}\n  b: {num_heads: 1}\n  a: {d_ff: 8}\n",
        ),
        ("spec.json", '{"variants": {"a": {}, "a": {"d_ff": 8}}}'),
    ],
)
def test_variants_sharing_a_name_are_one_clear_error(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'a' is given twice in one mapping" in err and len(err.splitlines()) == 1


def test_grid_and_set_make_the_variants(tmp_path, capsys):
    path = write_spec(tmp_path, variants={"base": {}}, grid={"num_heads": [1, 4], "d_ff": [8, 16]})
    spec = sweep.Spec.load(path, overrides=("dropout_rate=0.3", "label_smoothing=0"))
    assert list(spec.variants) == [
        "base",
        "num_heads=1,d_ff=8",
        "num_heads=1,d_ff=16",
        "num_heads=4,d_ff=8",
        "num_heads=4,d_ff=16",
    ]
    model, run = spec.configs("num_heads=4,d_ff=16", 1)
    assert (model.num_heads, model.d_ff, model.dropout_rate, model.label_smoothing) == (
        4,
        16,
        0.3,
        0,
    )
    assert spec.config_hash("base", 0) != spec.config_hash("base", 1)
    assert main(["sweep", str(path), "--set", "d_modle=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "jaxformer sweep: error: --set: unknown field 'd_modle' (not a TransformerConfig field "
        "or RunConfig option); did you mean 'd_model'?"
    )
    assert main(["sweep", str(path), "--set", "d_model"]) == 2
    assert "--set takes key=value, got 'd_model'" in capsys.readouterr().err


def test_predictions_with_any_character_pair_up(tmp_path):
    """A prediction may hold characters that str.splitlines() splits at ("\x1c", "\x85")."""
    from jaxformer.train.report import write_predictions

    (tmp_path / "summary.json").write_text("{}")
    pairs = [("abc", "abc"), ("de", "ed")]
    write_predictions(pairs, ["a\x1cb\x85", "e\td"], tmp_path / "predictions.tsv")
    rows = sweep.report._predictions(tmp_path / "predictions.tsv")
    assert rows == [("abc", "abc", "a\x1cb\x85"), ("de", "ed", "e d")]


def test_curves_keep_each_evaluation_protocol_apart():
    """The in-run greedy sample and the final beam set are different measurements: two series."""
    seed = [
        {"step": 500, "bleu": 3.0, "eval_beam": 1, "eval_pairs": 200},
        {"step": 1000, "bleu": 7.0, "eval_beam": 1, "eval_pairs": 200},
        {"step": 1000, "bleu": 9.0, "eval_beam": 4, "eval_pairs": 416},
    ]
    other = [dict(r, bleu=r["bleu"] + 1) for r in seed]
    series = sweep.report._series([seed, other, [{"step": 10, "eval_loss": 2.0}]], "bleu")
    assert series == {
        "greedy, 200 pairs": {500: [3.0, 4.0], 1000: [7.0, 8.0]},
        "beam 4, 416 pairs": {1000: [9.0, 10.0]},
    }
    assert sweep.report._series([[{"step": 5, "bleu": 1.0}]], "bleu") == {"": {5: [1.0]}}


def test_curves_name_the_seeds_each_variant_finished(tmp_path, monkeypatch):
    """A variant with fewer finished seeds than the spec's says so in its legend."""
    spec = sweep.Spec.load(write_spec(tmp_path))
    for name, seeds in (("baseline", (0, 1)), ("sq", (0,))):
        for seed in seeds:
            finished(spec.folder(name, seed), {"bleu": 1.0})
    labels = []
    monkeypatch.setattr(
        sweep.report, "_band", lambda ax, runs, key, label, *a: labels.append(label)
    )
    sweep.report.curves(spec, tmp_path / "curves.png")
    assert set(labels) == {"baseline (2 of 2 seeds)", "sq (1 of 2 seeds)"}


def finished(folder, summary, predictions=None, file="predictions.tsv"):
    """A run folder as a finished run leaves it: summary.json and its predictions."""
    from jaxformer.train.report import write_predictions

    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    if predictions is not None:
        pairs = [(f"src {i}", ref) for i, ref in enumerate(REFS)]
        write_predictions(pairs, predictions, folder / file)


def test_the_report_pairs_seeds_and_reports_failed_ones(tmp_path):
    """Three seeds: `better` clearly beats the baseline on every seed; `same` translates
    as the baseline; `broken` failed on its first seed (and the others compare);
    `unsteady` beats it on the sentences but its seeds' BLEU differences (+9, -6, +9)
    give a t-interval across 0, so no verdict."""
    names = ("base", "better", "same", "broken", "unsteady")
    spec = sweep.Spec.load(write_spec(tmp_path, variants={n: {} for n in names}, seeds=3))
    for seed in range(3):
        base = system(0.6, seed)
        finished(spec.folder("base", seed), {"bleu": 10.0 + seed, "chrf": 30.0}, base)
        finished(
            spec.folder("better", seed),
            {"bleu": 13.0 + seed, "chrf": 33.0},
            system(0.85, 10 + seed),
        )
        finished(spec.folder("same", seed), {"bleu": 10.0 + seed, "chrf": 30.0}, base)
        unsteady = {"bleu": 10.0 + seed + (9, -6, 9)[seed], "chrf": 33.0}
        finished(spec.folder("unsteady", seed), unsteady, system(0.85, 30 + seed))
        if seed == 0:
            spec.folder("broken", 0).mkdir(parents=True)
            (spec.folder("broken", 0) / "failed.json").write_text(
                json.dumps({"returncode": 3, "message": "MemoryError"})
            )
        else:
            finished(
                spec.folder("broken", seed), {"bleu": 9.0, "chrf": 29.0}, system(0.55, 20 + seed)
            )
    results = sweep.report.summarize(spec)
    v = results["variants"]
    assert results["set"] == "dev" and v["broken"]["problems"] == {0: "failed: MemoryError"}
    assert v["broken"]["paired"]["seeds"] == [1, 2]
    assert v["better"]["paired"]["differences"]["bleu"]["mean"] == pytest.approx(3.0)
    assert v["better"]["paired"]["differences"]["bleu"]["ci95"] == pytest.approx(0.0)
    better, same = v["better"]["paired"]["bootstrap"], v["same"]["paired"]["bootstrap"]
    assert better["bleu"]["verdict"] == "better" and better["bleu"]["at_floor"]
    # one family: 4 variants x 2 metrics, each p Holm-adjusted over the 8
    assert results["comparisons"] == 8 and results["readings"] == {}
    assert better["bleu"]["p_holm"] == pytest.approx(8 / 1001) and better["bleu"]["p_holm_bound"]
    assert better["bleu"]["t_p"] == 0.0  # +3 on every seed: no spread
    assert same["bleu"]["p"] == 1 and same["bleu"]["verdict"] == "no detectable difference"
    unsteady = v["unsteady"]["paired"]["bootstrap"]["bleu"]
    assert unsteady["low"] > 0 and unsteady["p_holm"] < 0.05  # the bootstrap alone: better
    assert unsteady["t_p_holm"] > 0.05 and unsteady["verdict"] == "no detectable difference"
    assert v["unsteady"]["paired"]["bootstrap"]["chrf"]["verdict"] == "better"  # +3 each seed
    text = sweep.report.markdown(results)
    assert "Against base on the dev set" in text and "| Δ dev BLEU [95% t] |" in text
    assert "| better | 3 | 150 | +3.00 [+3.00, +3.00] | 0 / 0 |" in text
    assert "| < 0.001 / < 0.008 | better |" in text and "over the 8 comparisons" in text
    assert "- broken seed 0: failed: MemoryError" in text
    assert "| broken | 2/3, 1 failed |" in text
    assert "Dev BLEU of each run: base 10.00, 11.00, 12.00 (seeds 0, 1, 2);" in text
    assert "broken 9.00, 9.00 (seeds 1, 2); unsteady 19.00, 5.00, 21.00 (seeds 0, 1, 2)." in text
    figures, differences, verdicts = sweep.report.tables(results)
    assert figures["align"] == "llrr" and differences["columns"][:2] == ["variant", "paired seeds"]
    assert [row[0] for row in verdicts["rows"]] == ["better", "same", "broken", "unsteady"]


def test_a_sweep_that_scores_test_keeps_its_verdicts_on_dev(tmp_path):
    """final_test: the test figures are shown beside the dev verdicts, and tested by none."""
    spec = sweep.Spec.load(write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=2))
    spec = dataclasses.replace(spec, base=spec.base | {"final_test": True})
    for seed in range(2):
        for name, quality, test in (("base", 0.6, 2.0), ("other", 0.9, 2.5 + seed)):
            summary = {"bleu": 1.0 + quality, "test_bleu": test, "final_test": True}
            finished(spec.folder(name, seed), summary, system(0.6, seed))
            dev = spec.folder(name, seed) / "predictions.tsv"
            (dev.parent / "test_predictions.tsv").write_text(
                dev.read_text().replace("src", "test")  # unread: tuning never looks at test
            )
    results = sweep.report.summarize(spec)
    other = results["variants"]["other"]["paired"]
    assert results["set"] == "dev" and other["bootstrap"]["bleu"]["difference"] == 0.0
    assert other["differences"]["test_bleu"]["values"] == [0.5, 1.5]
    figures, differences, verdicts = sweep.report.tables(results)
    assert "Δ test BLEU [95% t], no verdict" in verdicts["columns"]
    assert verdicts["rows"][0][-2] == "+1.00 [-5.35, +7.35]"  # +1.00 ± 12.706 * 0.5
    assert "tested by no verdict" in verdicts["caption"]


def test_every_reading_of_the_runs_is_one_family(tmp_path):
    """Read against two baselines, the runs give 3 pairs x 2 metrics = 6 comparisons, and
    a pair read the other way round is the same comparison negated."""
    spec = sweep.Spec.load(
        write_spec(tmp_path, variants={"a": {}, "b": {}, "c": {}}, seeds=2, readings=["b"])
    )
    for seed in range(2):
        for name, quality in (("a", 0.6), ("b", 0.7), ("c", 0.8)):
            summary = {"bleu": 10 * quality + seed, "chrf": 30.0 + 10 * quality}
            finished(spec.folder(name, seed), summary, system(quality, 10 * seed))
    results = sweep.report.summarize(spec)
    assert spec.baselines == ("a", "b") and results["comparisons"] == 6
    ab = results["variants"]["b"]["paired"]["bootstrap"]["bleu"]
    ba = results["readings"]["b"]["a"]["bootstrap"]["bleu"]
    assert ba["difference"] == -ab["difference"] and ba["p_holm"] == ab["p_holm"]
    assert ab["verdict"] == "better" and ba["verdict"] == "worse"
    again = sweep.report.summarize(dataclasses.replace(spec, baseline="b", readings=spec.baselines))
    fresh = again["variants"]["a"]["paired"]["bootstrap"]["bleu"]
    assert fresh == pytest.approx(ba) and again["comparisons"] == 6
    with pytest.raises(ValueError, match="readings: 'd' is not one of the variants"):
        sweep.Spec.load(write_spec(tmp_path, readings=["d"]))
    with pytest.raises(ValueError, match="readings must be a list of variant names"):
        sweep.Spec.load(write_spec(tmp_path, readings="b"))


@pytest.mark.parametrize(
    "damaged, text, match",
    [
        ("summary.json", '{"bleu": 1', r"other/seed1/summary.json: not valid JSON"),
        ("predictions.tsv", "src 0\tref\n", r"other/seed1/predictions.tsv:1: expected source<TAB>"),
        ("failed.json", "[]", r"base/seed0/failed.json: expected a JSON object, got list"),
    ],
)
def test_a_damaged_file_of_a_run_is_an_error_naming_it(tmp_path, damaged, text, match):
    """A sweep's report reads each run's files; a damaged one (a user's edit, a partial
    copy) is one error naming it, not a traceback from deep in the report."""
    spec = sweep.Spec.load(write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=2))
    for seed in range(2):
        for name in ("base", "other"):
            finished(spec.folder(name, seed), {"bleu": 1.0, "chrf": 2.0}, system(0.6, seed))
    if damaged == "failed.json":  # a failed run's record, in place of its summary
        (spec.folder("base", 0) / "summary.json").unlink()
        (spec.folder("base", 0) / damaged).write_text(text)
    else:
        (spec.folder("other", 1) / damaged).write_text(text)
    with pytest.raises(ValueError, match=match):
        sweep.report.summarize(spec)


def test_the_config_hash_reads_the_flat_run_options_and_its_version(tmp_path):
    """The hash of a run's configuration is over its flat options and the hash's version:
    every option counts, set or at its default."""
    spec = sweep.Spec.load(write_spec(tmp_path))
    model, _ = spec.configs("sq", 1)
    run = FLAT_DEFAULT_RUN | {k: v for k, v in BASE.items() if k in FLAT_DEFAULT_RUN}
    run = {k: v for k, v in run.items() if not k.startswith("tracker")}  # not what it computes
    resolved = {
        "model": model.to_dict(),
        "run": run | {"seed": 1, "out": None},
        "variant_files": [str(VARIANT)],
        "hash_version": 2,
    }
    text = json.dumps(resolved, sort_keys=True, default=str)
    assert spec.config_hash("sq", 1) == hashlib.sha256(text.encode()).hexdigest()[:16]
    shared = sweep.Spec.load(write_spec(tmp_path, base=BASE | {"shared_lengths": True}))
    assert shared.config_hash("sq", 1) != spec.config_hash("sq", 1)


def test_the_committed_sweep_runs_are_an_earlier_hash_version_refused_in_one_line(tmp_path):
    """The committed records were made before the hash had a version: a sweep over them
    refuses them as changed, naming --rerun-changed, and runs nothing; their report still
    reads them."""
    spec = sweep.Spec.load(ROOT / "configs/sweeps/wyc_web_speedrun.yaml")
    out = records.tree(ROOT / "records/sweeps/wyc-web-speedrun")  # its archive
    spec = dataclasses.replace(spec, out=out)
    runs = [(v, s) for v in spec.variants for s in spec.seeds]
    recorded = {run: spec.recorded_hash(*run) for run in runs}
    assert len(set(recorded.values()) - {None}) == len(runs) >= 15
    assert not any(recorded[run] == spec.config_hash(*run) for run in runs)
    assert {sweep.status(spec.folder(*run)) for run in runs} == {"done"}
    with pytest.raises(ValueError, match=r"made by another configuration .*--rerun-changed"):
        sweep.run(spec, say=lambda line: None)


def test_each_run_is_an_ordinary_train_command_of_its_resolved_run_file(tmp_path):
    spec = sweep.Spec.load(write_spec(tmp_path))
    args = sweep.train_command(spec, "sq", 1)
    run_file = tmp_path / "sweep" / "sq" / "seed1" / "run.json"
    assert args == ["train", "--config", str(run_file), "--resume", "--variants", str(VARIANT)]
    resolved = json.loads(run_file.read_text())
    assert resolved["model"]["activation"] == "squared_relu" and resolved["run"]["seed"] == 1
    assert load_run(run_file) == spec.configs("sq", 1)  # the command resolves nothing anew
    assert resolved["run"]["out"] == str(spec.folder("sq", 1))
    # W&B groups the sweep's runs: the group is the sweep's folder, the job type the variant
    assert (resolved["run"]["tracker_group"], resolved["run"]["tracker_job"]) == ("sweep", "sq")
    given = sweep.Spec.load(write_spec(tmp_path, base=BASE | {"tracker_group": "mine"}))
    assert given.configs("sq", 1)[1].runtime.tracker_group == "mine"
    assert given.config_hash("sq", 1) == spec.config_hash("sq", 1)  # not what a run computes


def test_vmapped_seeds_group_by_variant_unless_an_option_keeps_them_apart(tmp_path):
    spec = sweep.Spec.load(write_spec(tmp_path, seeds=3))
    pending = [(v, s) for s in spec.seeds for v in spec.variants]
    grouped = [("baseline", (0, 1, 2)), ("sq", (0, 1, 2))]
    assert runner._jobs(spec, pending, vmap_seeds=True) == grouped
    assert runner._jobs(spec, pending, vmap_seeds=False) == [(v, (s,)) for v, s in pending]
    (tmp_path / "pairs.tsv").write_text("a b\tb a\n" * 20)
    tokens = {"task": None, "data_tsv": str(tmp_path / "pairs.tsv"), "batch_tokens": 64}
    spec = sweep.Spec.load(write_spec(tmp_path, seeds=3, base=BASE | tokens))
    assert runner._jobs(spec, pending, vmap_seeds=True) == [(v, (s,)) for v, s in pending]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs/sweeps").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_committed_spec_resolves_each_run(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the specs name their files from the repository
    spec = sweep.Spec.load(path)
    for variant in spec.runs:  # the stages too
        model, run = spec.configs(variant, spec.seeds[0])
        assert run.runtime.seed == spec.seeds[0] and model.vocab_size > 0


def test_a_fine_tuning_sweep_leaves_the_tokenizer_to_the_model(tmp_path):
    """A base with init_from: the tokenizer comes with the model, and the run's file (which
    records the resolved "byte" for it) trains the same configuration."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "text.txt").write_text("hello world\n" * 20)
    base = {"init_from": str(tmp_path / "gpt2"), "data_text": str(tmp_path / "text.txt")}
    spec = sweep.Spec.load(write_spec(tmp_path, base=base, variants={"a": {}}, variant_files=[]))
    args = sweep.train_command(spec, "a", 0)
    assert load_run(args[2]) == spec.configs("a", 0)
    assert spec.configs("a", 0)[1].data.init_from == base["init_from"]


FAKE_TRAIN = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in --config) out="$(dirname "$2")";; esac; shift; done
case "$out" in *"$FAKE_FAIL"*) echo "the fake run failed"; exit "${FAKE_CODE:-3}";; esac
echo '{"exact_match": 0.5, "wall_seconds": 10}' > "$out/summary.json"
"""


def fake_train(tmp_path, monkeypatch, script: str) -> None:
    """`script` (a file's text, with its #! line) stands in for `python -m jaxformer train`."""
    fake = tmp_path / "fake_python"
    fake.write_text(script)
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))


def test_runs_go_seed_major_and_a_changed_or_failed_run_is_never_reused(
    tmp_path, monkeypatch, capsys
):
    """With a stand-in for `python -m jaxformer train` that writes a summary (or fails)."""
    fake_train(tmp_path, monkeypatch, FAKE_TRAIN)
    monkeypatch.setenv("FAKE_FAIL", "/bad/seed1")
    path = write_spec(tmp_path, variants={"base": {}, "bad": {"d_ff": 16}})
    spec = sweep.Spec.load(path)
    lines = []
    results = sweep.run(spec, jobs=1, vmap_seeds=False, say=lines.append)
    assert [line.split(":")[0] for line in lines[1:]] == [
        "[1/4] base seed 0",
        "[2/4] bad seed 0",
        "[3/4] base seed 1",
        "[4/4] bad seed 1",
    ]
    assert lines[-1].startswith("[4/4] bad seed 1: failed: the fake run failed (")
    assert results["variants"]["bad"]["runs"] == {0: "done", 1: "failed"}
    assert spec.recorded_hash("bad", 0) == spec.config_hash("bad", 0)

    lines = []
    sweep.run(spec, retry_failed=True, vmap_seeds=False, say=lines.append)  # still failing
    assert lines[0] == f"bad seed 1: retrying: emptying {spec.folder('bad', 1)}"
    monkeypatch.setenv("FAKE_FAIL", "nothing")
    lines = []
    assert (
        sweep.run(spec, retry_failed=True, vmap_seeds=False, say=lines.append)["variants"]["bad"][
            "runs"
        ][1]
        == "done"
    )
    assert lines[-1].startswith("[4/4] bad seed 1: done")

    edited = write_spec(tmp_path, variants={"base": {}, "bad": {"d_ff": 24}})
    assert main(["sweep", str(edited)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"jaxformer sweep: error: variant 'bad' seed 0: {spec.folder('bad', 0)} was made by "
        "another configuration than the spec's (and 1 other run); pass --rerun-changed"
    )
    lines = []
    sweep.run(sweep.Spec.load(edited), rerun_changed=True, vmap_seeds=False, say=lines.append)
    assert [line.split(":")[0] for line in lines] == [
        "bad seed 0",
        "bad seed 1",
        f"sweep {spec.out}",
        "[3/4] bad seed 0",
        "[4/4] bad seed 1",
    ]


def staged_spec(tmp_path, **fields):
    """A stage of 6 steps on another task, and a variant fine-tuning it 2 steps."""
    return write_spec(
        tmp_path,
        stages={"pre": {"task": "reverse", "steps": 6}},
        variants={"base": {}, "tuned": {"init_from": {"stage": "pre"}, "steps": 2}},
        **fields,
    )


def test_a_stage_runs_before_the_variants_that_start_from_it_seed_by_seed(tmp_path, monkeypatch):
    """With a stand-in for `python -m jaxformer train` (10 wall seconds a run), the stage
    of seed 1 failing: its variant's seed 1 fails naming it; stages are not compared."""
    fake_train(tmp_path, monkeypatch, FAKE_TRAIN)
    monkeypatch.setenv("FAKE_FAIL", "/pre/seed1")
    spec = sweep.Spec.load(staged_spec(tmp_path))
    assert spec.runs == ("pre", "base", "tuned") and spec.stage_of("tuned") == "pre"
    model, run = spec.configs("tuned", 1)
    assert run.data.init_from == str(spec.folder("pre", 1)) and run.optim.steps == 2
    assert run.data.task == "copy" and spec.configs("pre", 1)[1].data.task == "reverse"
    assert sweep.report._stage_length(spec, "pre", per_example=False) == 6  # where it starts
    lines = []
    pending = [(v, s) for s in spec.seeds for v in spec.runs]
    jobs = [("pre", (0, 1)), ("base", (0, 1)), ("tuned", (0,)), ("tuned", (1,))]
    assert runner._jobs(spec, pending, vmap_seeds=True) == jobs  # each its own init_from
    results = sweep.run(spec, jobs=1, vmap_seeds=False, say=lines.append)
    assert [line.split(" (")[0] for line in lines[1:]] == [
        "[1/6] pre seed 0: done: exact_match 0.5",
        "[2/6] base seed 0: done: exact_match 0.5",
        "[3/6] tuned seed 0: done: exact_match 0.5",
        "[4/6] pre seed 1: failed: the fake run failed",
        "[5/6] tuned seed 1: failed: its stage 'pre' seed 1 failed",
        "[6/6] base seed 1: done: exact_match 0.5",
    ]
    assert list(results["variants"]) == ["base", "tuned"]
    tuned = results["variants"]["tuned"]
    assert tuned["runs"] == {0: "done", 1: "failed"} and tuned["stage"] == "pre"
    assert tuned["figures"]["wall_seconds"]["values"] == [20]  # its own 10 and its stage's
    assert results["variants"]["base"]["figures"]["wall_seconds"]["values"] == [10, 10]
    staged = "Started from a stage's runs, seed by seed: tuned from pre's; their wall seconds"
    assert staged in (spec.out / "results.md").read_text()

    monkeypatch.setenv("FAKE_FAIL", "nothing")
    lines = []
    sweep.run(spec, retry_failed=True, vmap_seeds=False, say=lines.append)
    assert [line.split(":")[0] for line in lines if line.startswith("[")] == [
        "[5/6] pre seed 1",
        "[6/6] tuned seed 1",
    ]


def test_a_variant_waits_for_its_stage_run_when_that_was_stopped(tmp_path, monkeypatch):
    fake_train(tmp_path, monkeypatch, FAKE_TRAIN)
    monkeypatch.setenv("FAKE_FAIL", "/pre/seed0")
    monkeypatch.setenv("FAKE_CODE", "143")  # SIGTERM's: the stage run resumes next time
    lines = []
    sweep.run(sweep.Spec.load(staged_spec(tmp_path, seeds=1)), jobs=1, say=lines.append)
    assert [line.split(" (")[0] for line in lines[1:]] == [
        "[1/3] pre seed 0: interrupted",
        "[2/3] base seed 0: done: exact_match 0.5",
        "tuned seed 0: not run: its stage run did not end",
    ]


def test_a_stage_run_without_checkpoints_runs_again_when_a_variant_needs_it(tmp_path, monkeypatch):
    """A stage run copied back from its records (a finished run, its checkpoints left
    out) with its variant's run missing: the stage runs again first; with nothing pending
    it is left as it is. (The stand-in train command writes no checkpoints.)"""
    fake_train(tmp_path, monkeypatch, FAKE_TRAIN)
    monkeypatch.setenv("FAKE_FAIL", "nothing")
    spec = sweep.Spec.load(staged_spec(tmp_path, seeds=1))
    sweep.run(spec, say=lambda line: None)
    shutil.rmtree(spec.folder("tuned", 0))
    lines = []
    sweep.run(spec, say=lines.append)
    why = "a pending variant starts from it, and its checkpoints are gone"
    assert [line.split(" (")[0] for line in lines[:4]] == [
        f"pre seed 0: {why}: emptying {spec.folder('pre', 0)}",
        f"sweep {spec.out}: 3 runs, 1 already ended",
        "[2/3] pre seed 0: done: exact_match 0.5",
        "[3/3] tuned seed 0: done: exact_match 0.5",
    ]
    lines = []
    sweep.run(spec, say=lines.append)
    assert lines[0] == f"sweep {spec.out}: 3 runs, 3 already ended"


FAKE_CORES = """
import json, os, pathlib, sys
a = sys.argv[1:]
folder = pathlib.Path(a[a.index("--config") + 1]).parent
cores = sorted(os.sched_getaffinity(0))
(folder / "summary.json").write_text(json.dumps({"exact_match": 0.5, "cores": cores}))
"""


@pytest.mark.skipif(
    len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
    reason="pinning two runs needs Linux and two cores",
)
def test_cpu_runs_at_once_are_each_pinned_to_their_share_of_the_cores(tmp_path, monkeypatch):
    """With a stand-in for `python -m jaxformer train` that records the cores it may use."""
    fake_train(tmp_path, monkeypatch, f"#!{sys.executable}\n{FAKE_CORES}")
    monkeypatch.setattr(runner, "_gpu_count", lambda: 0)
    cores = sorted(os.sched_getaffinity(0))
    assert cores_lib.shares(2) == [set(cores[: len(cores) // 2]), set(cores[len(cores) // 2 :])]
    assert cores_lib.shares(1) == [set(cores)] and cores_lib.shares(len(cores) + 1) is None
    for jobs, shares in ((2, cores_lib.shares(2)), (1, [set(cores)])):
        spec = sweep.Spec.load(write_spec(tmp_path, out=str(tmp_path / f"jobs{jobs}")))
        sweep.run(spec, jobs=jobs, vmap_seeds=False, say=lambda line: None)
        used = [
            set(json.loads((spec.folder(v, s) / "summary.json").read_text())["cores"])
            for s in spec.seeds
            for v in spec.variants
        ]
        assert all(u in shares for u in used) and (jobs == 1 or len({*map(tuple, used)}) == 2)


def test_a_changed_stage_changes_the_hash_of_the_variants_started_from_it(tmp_path):
    spec = sweep.Spec.load(staged_spec(tmp_path))
    edited = sweep.Spec.load(staged_spec(tmp_path, base=BASE | {"d_ff": 48}))
    other = dataclasses.replace(spec, stages={"pre": {"task": "reverse", "steps": 8}})
    assert other.config_hash("base", 0) == spec.config_hash("base", 0)
    assert other.config_hash("tuned", 0) != spec.config_hash("tuned", 0)
    assert edited.config_hash("tuned", 0) != spec.config_hash("tuned", 0)
    moved = sweep.Spec.load(staged_spec(tmp_path), out=str(tmp_path / "moved"))
    assert moved.config_hash("tuned", 0) == spec.config_hash("tuned", 0)  # its folder aside


FAKE_GROUP = """
import os, pathlib, sys
a = sys.argv[1:]
folders = [pathlib.Path(a[a.index("--config") + 1]).parent]
if "--seeds" in a:  # the last option
    folders = [pathlib.Path(a[a.index("--out") + 1]) / f"seed{s}" for s in a[a.index("--seeds") + 1 :]]
print("the fake run trained", *(f.name for f in folders))
if any(os.environ["FAKE_DIVERGE"] in str(f) for f in folders):
    sys.exit(1)
for f in folders:
    (f / "summary.json").write_text('{"exact_match": 0.5}')
"""


def test_a_variants_seeds_train_as_one_process_and_a_divergence_is_found_apart(
    tmp_path, monkeypatch
):
    """With a stand-in for `python -m jaxformer train` that writes each folder's summary,
    or exits 1 (diverged) when a folder it trains matches FAKE_DIVERGE."""
    fake_train(tmp_path, monkeypatch, f"#!{sys.executable}\n{FAKE_GROUP}")
    monkeypatch.setenv("FAKE_DIVERGE", "/bad/seed1")
    spec = sweep.Spec.load(
        write_spec(tmp_path, variants={"base": {}, "bad": {"d_ff": 16}}, seeds=3)
    )
    lines = []
    results = sweep.run(spec, jobs=1, vmap_seeds=True, say=lines.append)
    assert [line.split(" (")[0] for line in lines[1:]] == [
        "[1/6] base seed 0: done: exact_match 0.5",
        "[2/6] base seed 1: done: exact_match 0.5",
        "[3/6] base seed 2: done: exact_match 0.5",
        "bad seeds 0, 1, 2: a seed diverged; running them apart",
        "[4/6] bad seed 0: done: exact_match 0.5",
        "[5/6] bad seed 1: diverged: the fake run trained seed1",
        "[6/6] bad seed 2: done: exact_match 0.5",
    ]
    assert results["variants"]["bad"]["runs"] == {0: "done", 1: "diverged", 2: "done"}
    group = (spec.folder("base", 2) / "command.txt").read_text()
    assert group.endswith(f"--out {spec.out / 'base'} --vmap-seeds on --seeds 0 1 2\n")
    assert (
        "the fake run trained seed0 seed1 seed2"
        in (spec.folder("base", 0) / "train.log").read_text()
    )
    assert spec.recorded_hash("base", 2) == spec.config_hash("base", 2)


def test_a_run_without_a_config_hash_is_not_reused(tmp_path):
    spec = sweep.Spec.load(write_spec(tmp_path, seeds=1))
    finished(spec.folder("sq", 0), {"exact_match": 0.5})
    with pytest.raises(
        ValueError, match=r"variant 'sq' seed 0: .* holds no config hash .*--rerun-changed"
    ):
        sweep.run(spec, say=lambda line: None)
    assert not (spec.out / "results.md").exists()


@pytest.mark.slow  # five CLI runs: 70 s of a cold quick suite
def test_sweep_writes_its_table_and_reruns_only_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # the runs: one CPU device, not conftest's eight
    spec = sweep.Spec.load(write_spec(tmp_path))
    lines = []
    results = sweep.run(spec, jobs=2, say=lines.append)
    assert lines[0].endswith("4 runs, 0 already ended") and len(lines) == 5
    for name in ("baseline", "sq"):
        r = results["variants"][name]
        assert r["runs"] == {0: "done", 1: "done"}
        assert len(r["figures"]["eval_perplexity"]["values"]) == 2
    table = (spec.out / "results.md").read_text()
    assert "| baseline | 2/2 |" in table and "| sq | 2/2 |" in table
    assert (spec.out / "curves.png").stat().st_size > 0
    assert json.loads((spec.out / "results.json").read_text()) == json.loads(json.dumps(results))

    # A run that did not finish (its summary gone, its checkpoints kept) is the only one rerun.
    kept = {p: p.stat().st_mtime_ns for p in spec.out.glob("*/seed*/summary.json")}
    lost = spec.folder("sq", 1) / "summary.json"
    lost.unlink()
    lines = []
    sweep.run(spec, say=lines.append)
    assert lines[0].endswith("4 runs, 3 already ended") and len(lines) == 2
    assert "sq seed 1: done" in lines[1]
    assert "resumed from step 4" in (spec.folder("sq", 1) / "train.log").read_text()
    for path, mtime in kept.items():
        assert path.stat().st_mtime_ns == mtime or path == lost


@pytest.mark.slow  # three short trainings
def test_a_variant_fine_tunes_its_seeds_stage_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # the runs: one CPU device, not conftest's eight
    spec = sweep.Spec.load(staged_spec(tmp_path, seeds=1, variant_files=[]))
    results = sweep.run(spec, say=lambda line: None)
    assert results["variants"]["tuned"]["runs"] == {0: "done"}
    stage, tuned = (
        json.loads((spec.folder(n, 0) / "summary.json").read_text()) for n in spec.runs[::2]
    )
    assert tuned["params"] == stage["params"] and (tuned["steps"], stage["steps"]) == (2, 6)
    config = json.loads((spec.folder("tuned", 0) / "config.json").read_text())
    assert config["run"]["init_from"] == str(spec.folder("pre", 0))


@pytest.mark.slow
def test_killed_sweep_continues_where_it_stopped(tmp_path):
    """SIGKILL to the whole sweep (runner and run) mid-run; the same command finishes it."""
    path = write_spec(tmp_path, base=BASE | {"steps": 40, "checkpoint_every": 5, "eval_every": 20})
    command = [sys.executable, "-m", "jaxformer", "sweep", str(path), "--jobs", "1"]
    env = dict(os.environ, XLA_FLAGS="")
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    second = tmp_path / "sweep" / "sq" / "seed0" / "checkpoints"  # seed-major: the second run
    deadline = time.time() + 300
    while not (second.is_dir() and any(p.name.isdigit() for p in second.iterdir())):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = tmp_path / "sweep" / "baseline" / "seed0" / "summary.json"
    finished = first.stat().st_mtime_ns
    assert subprocess.run(command, env=env, capture_output=True, text=True).returncode == 0
    assert first.stat().st_mtime_ns == finished
    assert "resumed from step" in (second.parent / "train.log").read_text()
    assert (tmp_path / "sweep" / "results.md").exists()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from Linux's /proc)."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that just ended
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow  # a sweep and its run start: two processes import JAX, one compiles
@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").is_file(), reason="reads /proc")
@pytest.mark.parametrize(
    ("name", "group"),
    [("SIGTERM", False), ("SIGHUP", False), ("SIGINT", False), ("SIGINT", True)],
)
def test_a_stop_reaches_the_sweeps_run_which_saves_and_resumes(tmp_path, name, group):
    """A stop to the sweep alone (`kill`, a scheduler, a closed terminal's hang-up) or, for
    Ctrl-C, to the terminal's whole group reaches its run, which saves its step; the sweep
    exits with the signal's code once the run has ended, naming the command that continues
    it, and leaves no process; that command resumes the run from its step."""
    from tests.stopping import Started

    never = 10**6  # the run is stopped long before its end, evaluation or checkpoint
    base = BASE | dict(steps=never, eval_every=never, checkpoint_every=never, log_every=1)
    path = write_spec(tmp_path, base=base, variants={"baseline": {}}, seeds=1, variant_files=[])
    run, signum = tmp_path / "sweep" / "baseline" / "seed0", getattr(signal, name)
    sweep = Started(["sweep", str(path)], env={"XLA_FLAGS": ""})
    _wait_for(lambda: (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text())
    (child,) = children(sweep.proc.pid)
    code, _ = sweep.stop(signum, timeout=60, group=group)
    assert code == 128 + signum, sweep.err()
    assert sweep.survivors() == [] and not pathlib.Path(f"/proc/{child}").exists()
    assert "[1/1] baseline seed 0: interrupted (resumes next time)" in "".join(sweep.lines["out"])
    why = "interrupted" if name == "SIGINT" else f"terminated by {name}"
    assert sweep.err()[-1] == (
        f"jaxformer sweep: {why}: the runs in flight were stopped, each saving its step "
        f"(above); continue with jaxformer sweep {path}"
    )
    assert f"{why}: saved step" in (run / "train.log").read_text()
    saved = checkpoints.Checkpointer(run).latest_step()
    again = Started(["sweep", str(path)], env={"XLA_FLAGS": ""})
    _wait_for(lambda: f"resumed from step {saved}" in (run / "train.log").read_text())
    assert again.stop(signal.SIGTERM, timeout=60)[0] == 143 and again.survivors() == []


def _wait_for(condition, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline
        time.sleep(0.2)


@pytest.mark.slow  # two short trainings: about 2 min on a loaded 2-core machine
def test_a_resumed_run_adds_its_wall_time_to_the_earlier_processes(tmp_path):
    """Each logged step records the wall time since the run began, summed over processes;
    a resume continues from the time logged at its checkpoint (here made 1000 s)."""
    from jaxformer.config import TransformerConfig
    from jaxformer.train import loop
    from jaxformer.train.config import RunConfig

    model = TransformerConfig.tiny(259).replace(
        d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1
    )
    fields = dict(task="copy", batch_size=8, eval_every=100, log_every=1, schedule="constant")
    fields |= dict(checkpoint_every=2, eval_examples=8, out=str(tmp_path), lr=1e-3)
    loop.train(model, RunConfig.from_options(steps=2, **fields), progress=False)
    metrics = tmp_path / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert 0 < records[0]["wall_seconds"] <= records[1]["wall_seconds"]
    records[1]["wall_seconds"] = 1000.0
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = loop.train(
        model, RunConfig.from_options(steps=4, **fields), resume=True, progress=False
    )
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    walls = [r["wall_seconds"] for r in records if "loss" in r]
    assert walls[1] == 1000.0 and 1000 < walls[2] <= walls[3] <= summary["wall_seconds"]
    assert summary["wall_seconds"] < 1000 + 300


def test_a_sweep_takes_a_users_optimizer_file(tmp_path):
    """The file that `--variants` gives `jaxformer train` also gives a sweep's variant."""
    from jaxformer.functional.registry import import_variants
    from jaxformer.train.optim import OPTIMIZERS
    from jaxformer_lab.sweep.spec import Spec

    lion = ROOT / "experiments" / "variants" / "lion.py"
    import_variants([str(lion)])
    try:
        fields = dict(
            base=dict(task="copy", steps=2), variants={"adam": {}, "lion": {"optimizer": "lion"}}
        )
        spec = tmp_path / "spec.json"
        spec.write_text(
            json.dumps(fields | dict(variant_files=[str(lion)], out=str(tmp_path / "s")))
        )
        _, run = Spec.load(spec).configs("lion", 0)
        assert run.optim.optimizer == "lion"
    finally:
        OPTIMIZERS._variants.pop("lion")
