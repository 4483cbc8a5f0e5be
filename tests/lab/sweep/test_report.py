"""`jaxformer sweep report SPEC` on a constructed sweep: the report's tables as a results
Record, recomputed from the run folders; and the committed speedrun sweep's tables rebuilt
from its committed records."""

import json
import pathlib
import re

import pytest

from jaxformer.cli import main
from jaxformer.train.report import write_predictions
from jaxformer_lab import results
from tests.lab.sweep.test_sweep import finished, system, write_spec

ROOT = pathlib.Path(__file__).resolve().parents[3]


def report(capsys, *argv) -> dict:
    """`jaxformer sweep report ARGV` in this process: the JSON line it prints."""
    assert main(["sweep", "report", *map(str, argv)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_sweep_becomes_a_results_record_with_its_verdicts(tmp_path, capsys):
    path = write_spec(tmp_path, variants={"base": {}, "better": {}}, seeds=3)
    spec_out = tmp_path / "sweep"
    for seed in range(3):
        base = {"bleu": 10.0 + seed, "chrf": 30.0}
        finished(spec_out / "base" / f"seed{seed}", base, system(0.6, seed))
        better = {"bleu": 13.0 + seed, "chrf": 33.0}
        finished(spec_out / "better" / f"seed{seed}", better, system(0.85, 10 + seed))
    out = tmp_path / "docs" / "sweep.json"
    line = report(capsys, path, "--about", "A toy.", "--note", "Read it.", "--out", out)
    assert line["verdicts"] == {"better": {"bleu": "better", "chrf": "better"}}
    record = results.Record.read(out)
    assert record.command == f"jaxformer sweep {path}"
    assert record.source == "the sweep's run folders" and record.versions["jax"]
    figures, differences, verdicts = record.tables
    assert figures.caption.startswith("A toy. Each variant: mean")
    assert figures.rows[1][:3] == ["better", "3/3", "14.00 ± 2.48"]
    assert differences.rows == [["better", "3", "+3.00 ± 0.00", "+3.00 ± 0.00"]]
    assert verdicts.notes == ["Read it."] and verdicts.rows[0][7] == "better"
    text = record.markdown()
    assert "| better | 3/3 | 14.00 ± 2.48 | 33.00 |" in text and "Read it." in text

    png = tmp_path / "figures" / "curves.png"  # a folder not yet made
    options = ["--device", "a laptop", "--source", "runs of today"]
    line = report(capsys, path, "--baseline", "better", "--curves", png, *options, "--out", out)
    assert line["verdicts"] == {"base": {"bleu": "worse", "chrf": "worse"}}
    assert png.read_bytes().startswith(b"\x89PNG")
    record = results.Record.read(out)
    assert (record.device, record.source) == ("a laptop", "runs of today")
    report(capsys, path, "--comparisons-only", "--about", "Again.", "--out", out)
    differences, verdicts = results.Record.read(out).tables
    assert differences.caption.startswith("Again. Variant minus base")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["SPEC"], "no such sweep folder"),
        (["SPEC", "--baseline", "nope"], "baseline 'nope' is not one of the variants"),
        (["MISSING"], "missing.yaml: no such config file"),
        ([], "give a sweep's SPEC or --runs RUN..., one of them"),
        (["SPEC", "--runs", "x"], "give a sweep's SPEC or --runs RUN..., one of them"),
        (["--runs", "x", "--baseline", "a"], "--baseline read\\(s\\) a sweep: give its SPEC"),
        (["SPEC", "--pair", "a", "b"], "--pair compares two of --runs"),
    ],
)
def test_bad_input_is_one_error_line_with_exit_2(tmp_path, capsys, argv, message):
    names = {"SPEC": str(write_spec(tmp_path)), "MISSING": str(tmp_path / "missing.yaml")}
    argv = [names.get(a, a) for a in argv]
    assert main(["sweep", "report", *argv, "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxformer sweep report: error:") and len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "name, baseline",
    [
        ("sweep_wyc_web_speedrun", None),
        # the other two readings of the same records: make test-all
        pytest.param("sweep_wyc_web_speedrun_batch", "no_dropout", marks=pytest.mark.slow),
        pytest.param(
            "sweep_wyc_web_speedrun_levers", "no_dropout_batch_32", marks=pytest.mark.slow
        ),
    ],
)
def test_the_committed_speedrun_sweep_tables_are_what_its_committed_records_compute(
    tmp_path, capsys, name, baseline
):
    out = tmp_path / "sweep.json"
    records = ROOT / "records" / "sweeps" / "wyc-web-speedrun"
    argv = [ROOT / "configs" / "sweeps" / "wyc_web_speedrun.yaml", "--sweep-out", records]
    if baseline:
        argv += ["--baseline", baseline, "--comparisons-only"]
    report(capsys, *argv, "--out", out)
    committed = results.Record.read(ROOT / "docs" / "results" / f"{name}.json").tables
    computed = results.Record.read(out).tables
    for table in committed + computed:  # the words around the tables are options
        table.caption, table.notes = "", []
    assert computed == committed


def test_runs_that_scored_different_dev_sentences_get_no_verdict_and_say_why(tmp_path, capsys):
    path = write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=2)
    for name in ("base", "other"):
        for seed in range(2):
            folder = tmp_path / "sweep" / name / f"seed{seed}"
            finished(folder, {"exact_match": 0.5 + 0.1 * seed + 0.2 * (name == "other")})
            pairs = [(f"seed {seed} source {i}", f"ref {i}") for i in range(4)]  # its own
            write_predictions(pairs, [f"ref {i}" for i in range(4)], folder / "predictions.tsv")
    out = tmp_path / "sweep.json"
    assert report(capsys, path, "--out", out)["verdicts"] == {"other": {}}
    differences = results.Record.read(out).tables[1]
    assert differences.notes[0].startswith("No verdict: the paired runs decoded no dev")


SAME = "no detectable difference"


@pytest.mark.parametrize(
    "spec, records, name, verdicts",
    [
        (
            "dates_variants",
            "dates-variants",
            "sweep_dates_variants",
            {"squared_relu": {"exact_match": SAME}, "qk_norm": {"exact_match": "better"}},
        ),
        (
            "table3_quick",
            "table3-quick",
            "table3_quick",
            {v: {"exact_match": "better"} for v in ("A1", "C1", "D1")},
        ),
        (
            "wyc_web_levers",
            "wyc-web-levers",
            "sweep_wyc_web_levers",
            {
                **{
                    v: {"bleu": "better", "chrf": "better"}
                    for v in ("extra_kjv", "pretrained_bibles")
                },
                **{
                    v: {"bleu": SAME, "chrf": SAME}
                    for v in ("extra_kjv_asv", "bpe_2000", "tokens_1536")
                },
                "iwslt_recipe": {"bleu": "worse", "chrf": "worse"},
            },
        ),
    ],
)
def test_the_committed_sweep_tables_are_what_their_committed_records_compute(
    tmp_path, capsys, spec, records, name, verdicts
):
    out = tmp_path / "sweep.json"
    spec = ROOT / "configs" / "sweeps" / f"{spec}.yaml"
    line = report(capsys, spec, "--sweep-out", ROOT / "records/sweeps" / records, "--out", out)
    assert line["verdicts"] == verdicts
    committed = results.Record.read(ROOT / f"docs/results/{name}.json").tables
    computed = results.Record.read(out).tables
    for table in committed + computed:
        table.caption, table.notes = "", []
    assert computed == committed


def test_runs_on_more_than_one_machine_or_code_are_named_under_the_first_table(tmp_path, capsys):
    """Seed 1's runs name a machine and a commit, seed 0's neither (made before runs
    recorded them); then seed 0's name the same machine and another commit."""
    path = write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=2)
    for name in ("base", "other"):
        for seed in range(2):
            made_by = {"machine": "CPU X", "code": "jaxformer at commit b"} if seed else {}
            finished(tmp_path / "sweep" / name / f"seed{seed}", {"exact_match": 0.5, **made_by})
    out = tmp_path / "sweep.json"
    report(capsys, path, "--out", out)
    assert results.Record.read(out).tables[0].notes[-2:] == [
        "The runs ran on more than one machine (summary.json's machine), whose float kernels "
        "need not round alike. Not recorded: seed 0 of base and other. CPU X: seed 1 of base "
        "and other.",
        "The runs ran at more than one version of the code (summary.json's code: the version "
        "that finished the run). Not recorded: seed 0 of base and other. jaxformer at commit "
        "b: seed 1 of base and other.",
    ]
    for name in ("base", "other"):  # one machine, two commits: no machine note
        summary_path = tmp_path / "sweep" / name / "seed0" / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary |= {"machine": "CPU X", "code": "jaxformer at commit a"}
        summary_path.write_text(json.dumps(summary))
    report(capsys, path, "--out", out)
    notes = results.Record.read(out).tables[0].notes
    assert not any("machine" in n for n in notes)
    assert notes[-1].endswith(
        "jaxformer at commit a: seed 0 of base and other. jaxformer at "
        "commit b: seed 1 of base and other."
    )


def test_seeds_that_share_a_maker_or_a_reason_are_named_together(tmp_path, capsys):
    """Three variants, four seeds: seeds 0-2 made before runs named their machine, seed 3
    on CPU X; the third variant's seeds 2 and 3 pending."""
    path = write_spec(tmp_path, variants={"base": {}, "other": {}, "third": {}}, seeds=4)
    for name in ("base", "other", "third"):
        for seed in range(2 if name == "third" else 4):
            made_by = {"machine": "CPU X"} if seed == 3 else {}
            finished(tmp_path / "sweep" / name / f"seed{seed}", {"exact_match": 0.5, **made_by})
    out = tmp_path / "sweep.json"
    report(capsys, path, "--out", out)
    table = results.Record.read(out).tables[0]
    assert table.caption.endswith("of seeds 0, 1, 2, 3 (the runs column counts them).")
    assert "- third seeds 2, 3: pending (not run, or interrupted)" in table.notes[1]
    assert table.notes[2].endswith(
        "Not recorded: seeds 0 and 1 of every variant; seed 2 of base and other. "
        "CPU X: seed 3 of base and other."
    )


@pytest.mark.parametrize(
    "exact, note",
    [
        (lambda name, seed: 0.0, "**Dev exact match is at its floor (0.00%) in every run"),
        (lambda name, seed: 1.0, "**Dev exact match is at its ceiling (100.00%) in every run"),
        (lambda name, seed: 0.5, "**Dev exact match is the same (50.00%) in every run"),
        (lambda name, seed: 0.5 + 0.1 * seed + 0.2 * (name == "other"), None),
    ],
)
def test_a_metric_that_never_moved_is_named_above_the_verdicts(tmp_path, capsys, exact, note):
    path = write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=2)
    for name in ("base", "other"):
        for seed in range(2):
            summary = {
                "exact_match": exact(name, seed),
                "eval_perplexity": 5.0 + seed + (name == "other"),
            }
            finished(tmp_path / "sweep" / name / f"seed{seed}", summary, system(0.6, seed))
    out = tmp_path / "sweep.json"
    report(capsys, path, "--out", out)
    verdicts = results.Record.read(out).tables[-1]
    assert verdicts.columns[-2].startswith("verdict")
    if note is None:
        assert not verdicts.caption.startswith("**")
    else:
        assert verdicts.caption.startswith(note)
        assert "these varied: dev perplexity." in verdicts.caption
