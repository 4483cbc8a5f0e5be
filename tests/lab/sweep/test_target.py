"""A sweep's target: each run's steps and training seconds to the first evaluation at or
below it, read from metrics.jsonl; the seed-paired ratios, their t-intervals and Holm
verdicts, checked against scipy; runs that never reach it named, never dropped."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from jaxformer.cli import main
from jaxformer_lab import results, sweep
from jaxformer_lab.sweep import stats, target
from tests.lab.sweep.test_sweep import finished, write_spec

TARGET = {"metric": "eval_nll", "below": 4.0}


def lm_run(folder, nll: list[float], step_seconds=1.0, eval_seconds=0.5, every=10):
    """A finished run's folder whose evaluations, every `every` steps, read `nll`: each
    step takes `step_seconds` and each evaluation `eval_seconds` (the last is the final
    one, which logs no eval_seconds), so its training seconds to step s are s x
    step_seconds."""
    finished(folder, {"steps": every * len(nll)})
    records, spent = [], 0.0
    for i, value in enumerate(nll, 1):
        step = every * i
        records.append({"step": step, "loss": value, "wall_seconds": step * step_seconds + spent})
        spent += eval_seconds
        evaluation = {"step": step, "eval_nll": value, "eval_loss": value}
        records.append(evaluation | ({"eval_seconds": spent} if i < len(nll) else {}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def curve(reach_step: int | None, steps: int = 80) -> list[float]:
    """Held-out NLLs every 10 steps: 4.5, then 4.0 (the target, exactly) at `reach_step`,
    then 3.9; 4.5 throughout when `reach_step` is None."""
    return [
        4.5 if reach_step is None or s < reach_step else 4.0 if s == reach_step else 3.9
        for s in range(10, steps + 1, 10)
    ]


def test_a_run_reaches_the_target_at_its_first_evaluation_at_or_below_it(tmp_path):
    goal = target.Target("eval_nll", 4.0)
    lm_run(tmp_path / "a", [6.0, 5.0, 4.0001, 4.0, 3.0], step_seconds=1.5, eval_seconds=2.0)
    # step 40, at the target exactly (no interpolation between 30 and 40); its seconds are
    # the wall clock of step 40's record less the three evaluations before it
    assert target.reach(tmp_path / "a", goal) == {"steps_to_target": 40, "seconds_to_target": 60.0}
    lm_run(tmp_path / "b", [6.0, 5.0, 3.9], eval_seconds=3.0)  # the final evaluation reaches it
    assert target.reach(tmp_path / "b", goal) == {"steps_to_target": 30, "seconds_to_target": 30.0}
    lm_run(tmp_path / "c", [6.0, 5.0, 4.01])
    assert target.reach(tmp_path / "c", goal) == {"not_reached": 30}
    assert target.reach(tmp_path / "c", target.Target("eval_loss", 5.0))["steps_to_target"] == 20


def test_a_run_that_cannot_say_when_it_reached_the_target_is_an_error(tmp_path):
    goal = target.Target("eval_nll", 4.0)
    lm_run(tmp_path / "a", [6.0, 3.0])
    path = tmp_path / "a" / "metrics.jsonl"
    path.write_text("".join(line for line in path.open() if '"loss"' not in line or "eval" in line))
    with pytest.raises(ValueError, match="no step record at step 20.*log_every must divide"):
        target.reach(tmp_path / "a", goal)
    with pytest.raises(ValueError, match="no evaluation logged eval_perplexity"):
        target.reach(tmp_path / "a", target.Target("eval_perplexity", 4.0))


@pytest.mark.parametrize(
    "value, message",
    [
        ({"metric": "eval_nll"}, "target must be {metric: NAME, below: NUMBER}"),
        ({"metric": "bleu", "below": 3}, "metric must be one of .*'bleu'"),
        ({"metric": "eval_nll", "below": "low"}, "below must be a finite number, got 'low'"),
        ({"metric": "eval_nll", "below": True}, "below must be a finite number"),
        ([4.0], "target must be"),
    ],
)
def test_a_bad_target_is_one_line_naming_the_spec(tmp_path, value, message):
    path = write_spec(tmp_path, target=value)
    with pytest.raises(ValueError, match=message) as error:
        sweep.Spec.load(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)
    assert sweep.Spec.load(write_spec(tmp_path, target=TARGET)).target == target.Target(
        "eval_nll", 4.0
    )


# Seeds 0-3: where each variant first reaches NLL 4.0, and its seconds per step.
REACH = {
    "base": ([40, 50, 40, 60], 1.0),
    "fast": ([20, 30, 20, 30], 1.0),  # fewer steps on every seed
    "slow_steps": ([40, 50, 40, 60], 2.0),  # the same steps, each twice as long
    "missing": ([30, 40, 30, None], 1.0),  # seed 3 never reaches it
}


def lm_sweep(tmp_path, **fields):
    variants = {n: {} for n in [*REACH, "unrun"]}  # unrun: no run finished (none started)
    path = write_spec(tmp_path, variants=variants, seeds=4, target=TARGET, **fields)
    spec = sweep.Spec.load(path)
    for name, (steps, step_seconds) in REACH.items():
        for seed, step in enumerate(steps):
            lm_run(spec.folder(name, seed), curve(step), step_seconds=step_seconds)
    return path, spec


def t_p(x: np.ndarray) -> float:
    """scipy's one-sample t-test p; equal values (sd 0, up to rounding): 0, or 1 at 0."""
    if np.ptp(x) < 1e-12:
        return 1.0 if np.allclose(x, 0) else 0.0
    return float(scipy.stats.ttest_1samp(x, 0).pvalue)


def holm(p: list[float]) -> list[float]:
    """Holm's adjusted p's, written out: the running max of (m - rank) p over the sorted."""
    order, out, running = np.argsort(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def test_the_report_gives_ratios_with_t_intervals_and_holm_verdicts(tmp_path):
    _, spec = lm_sweep(tmp_path)
    summary = sweep.report.summarize(spec)
    v = summary["variants"]
    assert summary["target"] == TARGET and summary["comparisons"] == 4  # missing: untested
    assert v["base"]["target"][3] == {"steps_to_target": 60, "seconds_to_target": 60.0}
    assert v["missing"]["target"][3] == {"not_reached": 80}
    assert v["base"]["figures"]["steps_to_target"]["values"] == [40, 50, 40, 60]
    assert v["missing"]["figures"]["steps_to_target"]["values"] == [30, 40, 30]  # reached only
    tested = [(n, k) for n in ("fast", "slow_steps") for k in target.FIGURES]
    logs = {
        (n, k): np.log(np.array(REACH[n][0]) * (REACH[n][1] if k == "seconds_to_target" else 1))
        - np.log(np.array(REACH["base"][0]))
        for n, k in tested
    }
    p = [t_p(logs[c]) for c in tested]
    for (name, key), p_i, p_holm in zip(tested, p, holm(p), strict=True):
        r = v[name]["paired"]["targets"]["figures"][key]
        mean, sem = logs[name, key].mean(), scipy.stats.sem(logs[name, key])
        half = scipy.stats.t.ppf(0.975, 3) * sem
        assert r["ratio"] == pytest.approx(math.exp(mean), rel=1e-12)
        assert r["low"] == pytest.approx(math.exp(mean - half), rel=1e-9)
        assert r["high"] == pytest.approx(math.exp(mean + half), rel=1e-9)
        assert r["t_p"] == pytest.approx(p_i, rel=1e-8, abs=1e-15)
        assert r["t_p_holm"] == pytest.approx(p_holm, rel=1e-8, abs=1e-15)
    fast = v["fast"]["paired"]["targets"]["figures"]
    assert fast["steps_to_target"]["values"] == [0.5, 0.6, 0.5, 0.5]
    assert fast["steps_to_target"]["verdict"] == fast["seconds_to_target"]["verdict"] == "faster"
    slow = v["slow_steps"]["paired"]["targets"]["figures"]
    assert slow["steps_to_target"]["verdict"] == "no detectable difference"
    assert slow["seconds_to_target"]["ratio"] == pytest.approx(2.0)
    assert slow["seconds_to_target"]["verdict"] == "slower"
    missing = v["missing"]["paired"]["targets"]
    assert missing["not_reached"] == {3: ["variant"]} and missing["figures"]["steps_to_target"][
        "seeds"
    ] == [0, 1, 2]
    assert (
        missing["figures"]["steps_to_target"]["verdict"] == "no verdict (not reached in every seed)"
    )
    assert v["fast"]["paired"]["differences"]["steps_to_target"]["mean"] == pytest.approx(-22.5)
    assert sweep.report.verdicts(summary)["fast"] == {
        "steps_to_target": "faster",
        "seconds_to_target": "faster",
    }


def test_the_target_table_opens_the_record_and_names_the_runs_that_missed(tmp_path, capsys):
    path, spec = lm_sweep(tmp_path, readings=["fast"])
    out, png = tmp_path / "lm.json", tmp_path / "lm.png"
    argv = ["sweep", "report", str(path), "--out", str(out), "--curves", str(png)]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["verdicts"]["slow_steps"]["seconds_to_target"] == "slower"
    assert png.read_bytes().startswith(b"\x89PNG")
    tables = results.Record.read(out).tables
    first = tables[0]
    assert first.caption.startswith("Time to the target, held-out NLL <= 4 (the first")
    assert first.rows[0][:4] == ["base (baseline)", "4/4", "48 ± 15", "48 ± 15"]
    assert first.rows[3][:4] == ["missing", "3/4", "33 ± 14", "33 ± 14"]
    assert first.rows[1][4:7][2] == "faster" and first.rows[1][4].startswith("0.52 [")
    assert first.rows[3][6] == "no verdict (not reached in every seed)"
    assert first.rows[4] == ["unrun", "0/0"] + [""] * 8  # nothing finished: nothing to say
    assert first.notes == ["Not reached: missing seed 3 (last evaluated at step 80)."]
    assert "over the 6 comparisons" in first.caption  # missing against either: untested
    assert tables[1].columns[2:4] == ["steps to target", "seconds to target"]  # the figures
    assert tables[2].caption.startswith("Variant minus base") and not tables[2].notes
    # read against fast, base is slower: every ratio inverted, every verdict turned
    summary = sweep.report.summarize(spec)
    base = summary["readings"]["fast"]["base"]["targets"]["figures"]["steps_to_target"]
    fast = summary["variants"]["fast"]["paired"]["targets"]["figures"]["steps_to_target"]
    assert base["ratio"] == pytest.approx(1 / fast["ratio"]) and base["verdict"] == "slower"
    assert base["low"] == pytest.approx(1 / fast["high"])
    missing = summary["readings"]["fast"]["missing"]["targets"]
    assert missing["not_reached"] == {3: ["variant"]}
    assert summary["readings"]["fast"]["base"]["targets"]["not_reached"] == {}


def test_a_comparison_without_a_bootstrap_is_read_from_its_t_test_in_the_family():
    boot = stats.Bootstrap(1.0, 0.5, 1.5, 0.01, False, 1000, 3, 100)
    t_a, t_b = stats.SeedTest(1.0, 0.5, 0.01, 3), stats.SeedTest(-0.2, 0.1, 0.02, 3)
    a, b = stats.verdicts([(t_a, boot), (t_b, None)])
    assert a.t_p_holm == b.t_p_holm == pytest.approx(0.02)  # both t p's in one Holm family
    assert a.p_holm == pytest.approx(0.01) and a.verdict == "better"  # the bootstrap's alone
    assert b.p_holm is None and b.verdict == "lower"
    assert stats.t_verdict(t_b, 0.05) == "no detectable difference"
    assert stats.t_verdict(stats.SeedTest(0.3, None, 1.0, 1), 0.0) == "no verdict (one seed)"


ROOT = pathlib.Path(__file__).resolve().parents[3]
RECORDS = ROOT / "records" / "sweeps" / "lm-speedrun"


def test_the_committed_lm_speedrun_tables_are_what_its_committed_records_compute(tmp_path, capsys):
    out = tmp_path / "lm.json"
    spec = ROOT / "configs" / "sweeps" / "lm_speedrun.yaml"
    argv = ["sweep", "report", str(spec), "--sweep-out", str(RECORDS), "--out", str(out)]
    assert main(argv) == 0
    committed = results.Record.read(ROOT / "docs" / "results" / "lm_speedrun.json").tables
    computed = results.Record.read(out).tables
    for table in committed + computed:  # the words around the tables are options
        table.caption, table.notes = "", []
    assert computed == committed


def test_the_committed_load_table_is_what_the_records_load_samples_give(tmp_path):
    """experiments/lm_speedrun.py load: the others' cores of each variant's runs, from the
    archive's load.jsonl and each run's times.json."""
    out = tmp_path / "load.json"
    script = ROOT / "experiments" / "lm_speedrun.py"
    subprocess.run(
        [sys.executable, str(script), "load", str(RECORDS), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    committed = results.Record.read(ROOT / "docs" / "results" / "lm_speedrun_load.json")
    computed = results.Record.read(out)
    assert computed.tables == committed.tables
    variants = [row[0] for row in computed.tables[0].rows]
    spec = sweep.Spec.load(ROOT / "configs" / "sweeps" / "lm_speedrun.yaml")
    assert sorted(variants[:-1]) == sorted(spec.variants) and variants[-1] == "the whole sweep"
