"""Table 3 as a sweep spec read against the paper (configs/sweeps/table3.yaml): the scaling
rule on the paper's rows, the paper's training rules, the runs of earlier Table 3 sweeps
kept, the verdicts against the paper's findings, and the table from hand-made runs."""

import json
import pathlib

import numpy as np
import pytest
import yaml

from jaxformer.cli import main
from jaxformer.config import TABLE3_ROWS, TransformerConfig
from jaxformer.train.optim import paper_schedule
from jaxformer.train.report import write_predictions
from jaxformer_lab import records, sweep
from jaxformer_lab.results import Record
from jaxformer_lab.sweep import paper

ROOT = pathlib.Path(__file__).resolve().parents[3]
FULL, QUICK = (ROOT / "configs/sweeps" / name for name in ("table3.yaml", "table3_quick.yaml"))


@pytest.fixture(scope="module")
def full():
    return sweep.Spec.load(FULL)


def scaled(row: str) -> TransformerConfig:
    """The scaling rule: the paper's row with widths / 4 and layers / 2 (at least 1)."""
    p = TransformerConfig.table3(row, vocab_size=259)
    sizes = dict(d_model=p.d_model, d_ff=p.d_ff, d_k=p.key_dim, d_v=p.value_dim)
    layers = {n: max(1, getattr(p, n) // 2) for n in ("num_encoder_layers", "num_decoder_layers")}
    return p.replace(**{k: v // 4 for k, v in sizes.items()}, **layers)


def test_every_row_is_the_papers_scaled_by_one_rule(full):
    assert list(full.variants) == [row for row in TABLE3_ROWS if row != "big"]
    for row in full.variants:
        assert full.configs(row, 0)[0] == scaled(row), row
    assert set(full.paper.rows) == set(TABLE3_ROWS)


def test_the_quick_spec_is_four_rows_of_the_full_one_on_dates():
    quick = sweep.Spec.load(QUICK)
    assert list(quick.variants) == ["base", "A1", "C1", "D1"]
    full = yaml.safe_load(FULL.read_text())["paper"]
    assert quick.paper.rows == {row: full["rows"][row] for row in quick.variants}
    assert {k: v for k, v in vars(quick.paper).items() if k != "rows"} == {
        k: v for k, v in full.items() if k != "rows"
    }
    model, run = quick.configs("C1", 2)
    assert model == scaled("C1") and run.data.task == "dates" and run.eval.eval_beam == 1


@pytest.mark.parametrize("path, steps, warmup", [(FULL, 2000, 80), (QUICK, 500, 20)])
def test_the_paper_schedule_peaks_at_the_base_rate_and_scales_with_d_model(path, steps, warmup):
    spec = sweep.Spec.load(path)
    rates = {}
    for row in ("base", "C5") if "C5" in spec.variants else ("base",):
        model, run = spec.configs(row, 0)
        assert (run.optim.schedule, run.optim.warmup, run.optim.steps) == ("paper", warmup, steps)
        schedule = paper_schedule(model.d_model, run.optim.warmup, run.optim.peak_lr)
        rates[row] = np.array([float(schedule(c)) for c in range(steps)])
    assert rates["base"].argmax() == warmup - 1
    assert rates["base"].max() == pytest.approx(3e-3, rel=1e-4)
    if "C5" in rates:  # d_model 256: the rate times d_model^-0.5
        assert rates["C5"].max() == pytest.approx(3e-3 / 2**0.5, rel=1e-4)


def test_the_gpu_attempts_runs_keep_their_config_hashes(full, tmp_path):
    """records/h200/table3_attempt/spec.json is the spec the earlier script wrote for
    its GPU run: this spec resolves every run to the same configuration, so that sweep's
    run folders would be kept, not rerun."""
    spec = tmp_path / "spec.json"  # read from the records' archive
    spec.write_bytes(records.tree(ROOT / "records/h200/table3_attempt/spec.json").read_bytes())
    attempt = sweep.Spec.load(spec)
    runs = [(row, seed) for row in full.variants for seed in full.seeds]
    assert list(attempt.variants) == list(full.variants)
    assert [full.config_hash(*r) for r in runs] == [attempt.config_hash(*r) for r in runs]


def result(verdict, low, high, seeds=3):
    return dict(verdict=verdict, low=low, high=high, seeds=seeds)


@pytest.mark.parametrize(
    "finding, found, within, expected",
    [
        ("worse", result("worse", -3, -1), 1.0, "reproduces"),
        ("worse", result("better", 1, 3), 1.0, "contradicts"),
        ("worse", result("no detectable difference", -3, 1), 1.0, "inconclusive"),
        ("better", result("better", 1, 3), 1.0, "reproduces"),
        ("better", result("better", 1, 3, seeds=1), 1.0, "inconclusive"),
        ("equal", result("no detectable difference", -0.5, 0.4), 1.0, "reproduces"),
        ("equal", result("no detectable difference", -2.0, 0.4), 1.0, "inconclusive"),
        ("equal", result("worse", -2.0, -1.5), 1.0, "contradicts"),
        ("equal", result("no detectable difference", -0.004, 0.006), 0.01, "reproduces"),
        ("equal", result("no detectable difference", -0.02, 0.006), 0.01, "inconclusive"),
        (None, result("worse", -3, -1), 1.0, ""),
        ("worse", None, 1.0, "inconclusive"),
    ],
)
def test_verdicts_against_the_papers_findings(finding, found, within, expected):
    assert paper.verdict(finding, found, within) == expected


def test_the_table_from_hand_made_runs(tmp_path, capsys):
    """Rows base, A1 (clearly worse on every seed) and E (the same translations): A1
    reproduces the paper, E's interval is 0 (equal: reproduces); the sweep's own tables
    come first, this one last, in the report and in its results file."""
    fields = yaml.safe_load(FULL.read_text())
    fields["variants"] = {row: fields["variants"][row] for row in ("base", "A1", "E")}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(fields | {"seeds": 2, "out": str(tmp_path / "t3")}))
    spec = sweep.Spec.load(path)
    refs = [f"and he seide to hem {i} that thei schulden go" for i in range(60)]
    pairs = [(f"src {i}", ref) for i, ref in enumerate(refs)]
    worse = [" ".join(r.split()[:3]) for r in refs]
    runs = (("base", refs, 30.0), ("A1", worse, 10.0), ("E", refs, 30.0))
    for seed in range(2):
        for row, predictions, bleu in runs:
            folder = spec.folder(row, seed)
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"bleu": bleu + seed, "params": 4e6}))
            write_predictions(pairs, predictions, folder / "predictions.tsv")
    out = tmp_path / "table3.json"
    assert main(["sweep", "report", str(path), "--out", str(out)]) == 0
    table = Record.read(out).tables[-1]  # the sweep's own tables first, this one last
    assert table.caption.startswith("Each variant beside the paper's row, read against base")
    lines = table.markdown()[2:]
    assert lines[0] == (
        "| row | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls | pos | params (M) | paper "
        "dev BLEU | paper Δ | our dev BLEU | our Δ [95%] | Holm p (t / bootstrap) | paper's "
        "finding | verdict | seeds |"
    )
    assert lines[2].startswith(
        "| base | 3 | 128 | 512 | 8 | 16 | 16 | 0.1 | 0.1 | sinusoidal | 4.00 | 25.8 | +0.0 | 30.50 ± 6.35 |"
    )
    assert lines[3].startswith("| A1 | 3 | 128 | 512 | 1 | 128 | 128 |")
    assert lines[3].endswith("| one head is worse than eight (worse) | reproduces | 2 |")
    assert "| +0.00 [+0.00, +0.00] | 1.000 / 1.000 | learned and sinusoidal" in lines[4]
    assert lines[4].endswith("| reproduces | 2 |")
    assert "| learned and sinusoidal positions are equal (equal) | reproduces | 2 |" in (
        sweep.report.markdown(sweep.report.summarize(spec))
    )  # the sweep's results.md shows it too


@pytest.mark.parametrize(
    "block, message",
    [
        ({"figure": "BLEU"}, "paper must be a mapping of figure, equal_within, columns and rows"),
        ({"columns": {"N": "layers"}}, "paper column 'N': 'layers' is not a model field"),
        ({"equal_within": {"ppl": 1}}, "equal_within: 'ppl' is not one of"),
        ({"rows": {"A1": {"finding": "worse"}}}, "paper row 'A1' must be a mapping with figure"),
        ({"rows": {"A1": {"figure": 1, "finding": "bad", "why": "x"}}}, "a finding is one of"),
        ({"rows": {"A1": {"figure": 1, "finding": "worse"}}}, "with its why"),
    ],
)
def test_a_bad_paper_block_is_one_clear_error(tmp_path, block, message):
    fields = yaml.safe_load(QUICK.read_text())
    given = block if "figure" in block and len(block) == 1 else fields["paper"] | block
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(fields | {"paper": given}))
    with pytest.raises(ValueError, match=message):
        sweep.Spec.load(path)


@pytest.mark.slow  # two runs of two steps: a minute or two on a loaded 2-core machine
def test_a_two_row_sweep_writes_the_paper_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", "")  # the runs: one CPU device, not conftest's eight
    fields = yaml.safe_load(QUICK.read_text())
    fields["variants"] = {row: fields["variants"][row] for row in ("base", "A1")}
    fields["base"] |= {"steps": 2, "eval_every": 2, "checkpoint_every": 2, "eval_examples": 8}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(fields | {"seeds": 1, "out": str(tmp_path / "t3")}))
    assert main(["sweep", str(path), "--jobs", "2"]) == 0
    lines = (tmp_path / "t3" / "results.md").read_text().splitlines()
    base = next(line for line in lines if line.startswith("| base | 3 | 128 |"))
    a1 = next(line for line in lines if line.startswith("| A1 | 3 | 128 | 512 | 1 | 128 | 128 |"))
    assert "| 25.8 | +0.0 |" in base
    assert a1.endswith("| one head is worse than eight (worse) | inconclusive | 1 |")
