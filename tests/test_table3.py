"""experiments/table3.py: the scaling rule on the paper's rows, the paper's training rules,
the verdicts against the paper's findings, the table from hand-made runs, and (slow) a
two-row, two-seed, two-step rerun on wyc-web that writes the table."""

import argparse
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from jaxformer import sweep
from jaxformer.config import TABLE3_ROWS
from jaxformer.train.optim import paper_schedule

PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "table3.py"
spec = importlib.util.spec_from_file_location("table3", PATH)
table3 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table3)


def test_every_row_is_scaled_by_one_rule():
    base = table3.scaled("base")
    assert base == dict(
        d_model=128,
        d_ff=512,
        d_k=16,
        d_v=16,
        num_encoder_layers=3,
        num_decoder_layers=3,
        num_heads=8,
        dropout_rate=0.1,
        label_smoothing=0.1,
        position_embedding="sinusoidal",
    )
    assert table3.scaled("A1") == base | dict(num_heads=1, d_k=128, d_v=128)
    assert table3.scaled("B1") == base | dict(d_k=4)
    assert table3.scaled("C1") == base | dict(num_encoder_layers=1, num_decoder_layers=1)
    assert table3.scaled("C5") == base | dict(d_model=256, d_k=32, d_v=32)
    assert table3.scaled("D3") == base | dict(label_smoothing=0.0)
    assert table3.scaled("E") == base | dict(position_embedding="learned")
    assert set(table3.PAPER_BLEU) == set(TABLE3_ROWS) and set(table3.FINDINGS) < set(TABLE3_ROWS)


def test_the_paper_schedule_peaks_at_the_base_rate_and_scales_with_d_model():
    rules = table3.paper_training(2000)
    assert rules == dict(schedule="paper", warmup_steps=80, lr=rules["lr"], optimizer="adam")
    rates = {}
    for d_model in (128, 256):
        schedule = paper_schedule(d_model, rules["warmup_steps"], rules["lr"])
        rates[d_model] = np.array([float(schedule(c)) for c in range(0, 2000, 1)])
    assert rates[128].argmax() == 79 and rates[128].max() == pytest.approx(3e-3, rel=1e-4)
    assert rates[256].max() == pytest.approx(3e-3 / 2**0.5, rel=1e-4)  # d_model^-0.5
    assert rates[128][-1] == pytest.approx(3e-3 * (80 / 2000) ** 0.5, rel=1e-3)  # step^-0.5
    assert table3.paper_training(500)["warmup_steps"] == 20


def result(verdict, low, high, seeds=3):
    return dict(verdict=verdict, low=low, high=high, seeds=seeds)


@pytest.mark.parametrize(
    "row, found, expected",
    [
        ("A1", result("worse", -3, -1), "reproduces"),
        ("A1", result("better", 1, 3), "contradicts"),
        ("A1", result("no detectable difference", -3, 1), "inconclusive"),
        ("C5", result("better", 1, 3), "reproduces"),
        ("C5", result("better", 1, 3, seeds=1), "inconclusive"),
        ("E", result("no detectable difference", -0.5, 0.4), "reproduces"),
        ("E", result("no detectable difference", -2.0, 0.4), "inconclusive"),
        ("E", result("worse", -2.0, -1.5), "contradicts"),
        ("A2", result("worse", -3, -1), ""),
        ("A1", None, "inconclusive"),
    ],
)
def test_verdicts_against_the_papers_findings(row, found, expected):
    assert table3.verdict(row, found) == expected


def test_quick_runs_on_dates_scored_by_exact_match_with_its_own_margin(tmp_path):
    args = argparse.Namespace(
        quick=True,
        data="dates",
        rows=["base", "E"],
        seeds=2,
        steps=500,
        batch_size=64,
        eval_examples=500,
        out=tmp_path / "t3",
    )
    base = sweep.Spec.load(table3.spec_file(args)).base
    assert base["task"] == "dates" and "dataset" not in base and base["eval_beam"] == 1
    close = result("no detectable difference", -0.004, 0.006)
    assert table3.verdict("E", close, table3.METRICS["dates"][2]) == "reproduces"
    assert table3.verdict("E", close, table3.METRICS["wyc-web"][2]) == "reproduces"
    wide = result("no detectable difference", -0.02, 0.006)
    assert table3.verdict("E", wide, table3.METRICS["dates"][2]) == "inconclusive"


def test_the_table_from_hand_made_runs(tmp_path):
    """Rows base, A1 (clearly worse on every seed) and E (the same translations): A1
    reproduces the paper, E's interval is 0 (equal: reproduces); no perplexity column."""
    from jaxformer.train.report import write_predictions

    args = argparse.Namespace(
        quick=False,
        data="wyc-web",
        rows=["base", "A1", "E"],
        seeds=2,
        steps=100,
        batch_size=8,
        eval_examples=8,
        out=tmp_path / "t3",
    )
    spec = sweep.Spec.load(table3.spec_file(args))
    refs = [f"and he seide to hem {i} that thei schulden go" for i in range(60)]
    pairs = [(f"src {i}", r) for i, r in enumerate(refs)]
    worse = [" ".join(r.split()[:3]) for r in refs]
    for seed in range(2):
        for row, predictions, bleu in (
            ("base", refs, 30.0),
            ("A1", worse, 10.0),
            ("E", refs, 30.0),
        ):
            folder = spec.folder(row, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"bleu": bleu + seed, "params": 4e6}))
            write_predictions(pairs, predictions, folder / "predictions.tsv")
    text = table3.table(sweep.report.summarize(spec), spec, "wyc-web")
    lines = text.splitlines()
    assert "PPL" not in text and "perplexity" not in text
    assert lines[2].startswith(
        "| base | 3 | 128 | 512 | 8 | 16 | 16 | 0.1 | 0.1 | sinusoidal | 4.00 | 25.8 | +0.0 | 30.50 ± 6.35 |"
    )
    assert lines[3].startswith("| A1 | 3 | 128 | 512 | 1 | 128 | 128 |")
    assert "| one head is worse than eight (worse) | reproduces | 2 |" in lines[3]
    assert "| +0.00 [+0.00, +0.00] | 1.000 / 1.000 | learned and sinusoidal" in lines[4]
    assert lines[4].endswith("| reproduces | 2 |")


@pytest.mark.slow  # two wyc-web runs of two steps: several minutes on a loaded 2-core machine
def test_a_two_row_rerun_writes_the_table(tmp_path):
    out = tmp_path / "t3"
    args = ["--rows", "base", "A1", "--steps", "2", "--seeds", "1", "--eval-examples", "8"]
    args += ["--jobs", "2", "--set", "eval_beam=1", "--set", "eval_every=2"]
    headline = table3.main([*args, "--out", str(out)])
    assert headline["rows"] == 2 and headline["base_bleu"] is not None
    assert headline["verdicts"] == {"reproduces": 0, "contradicts": 0, "inconclusive": 1}
    lines = (out / "table3.md").read_text().splitlines()
    assert lines[2].startswith("| base | 3 | 128 | 512 | 8 | 16 | 16 | 0.1 | 0.1 | sinusoidal |")
    assert lines[3].startswith("| A1 | 3 | 128 | 512 | 1 | 128 | 128 |")
    assert lines[3].endswith("| one head is worse than eight (worse) | inconclusive | 1 |")
