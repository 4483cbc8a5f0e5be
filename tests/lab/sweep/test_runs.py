"""`jaxformer sweep report --runs` on constructed run folders: what a configuration is
named, when an evaluation counts as done, and the refusal of a first run that is not the
speedrun command's or of a run without test scores; and the committed speedrun tables
rebuilt from their committed records."""

import json
import pathlib
import re

import pytest

import jaxformer as jf
from jaxformer.cli import main
from jaxformer_lab.results import Record
from jaxformer_lab.sweep import runs as speedrun

ROOT = pathlib.Path(__file__).resolve().parents[3]


def report(*folders, out, options=()) -> list:
    """`jaxformer sweep report --runs FOLDERS OPTIONS --out OUT`: the record's tables."""
    argv = ["sweep", "report", "--runs", *map(str, folders), *map(str, options)]
    assert main([*argv, "--out", str(out)]) == 0
    return Record.read(out).tables


def refused(capsys, *argv) -> str:
    """The one error line of `jaxformer sweep report ARGV` (exit 2)."""
    assert main(["sweep", "report", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("jaxformer sweep report: error:")
    return err


REFERENCES = ["the king said to her", "be doers of the word", "I hope to send him"]


def make_run(
    folder: pathlib.Path,
    dropout: float,
    bleus: list[float],
    final: float,
    exact: bool = False,
    bpe_vocab_size: int | None = None,
    averaged: float | None = None,
) -> None:
    """A finished run: evaluations at steps 10, 20 (BLEU `bleus`), each followed by a
    training record 60 s later, then the final evaluation (BLEU `final`; with `averaged`,
    that of the mean of the last 4 checkpoints after it, the final model) and 30 s of test
    scoring, as metrics.jsonl and summary.json record them; its dev translations are
    the references (`exact`) or each with its last word dropped."""
    folder.mkdir()
    translate = (lambda ref: ref) if exact else (lambda ref: ref.rsplit(" ", 1)[0])
    rows = [f"src {i}\t{ref}\t{translate(ref)}\n" for i, ref in enumerate(REFERENCES)]
    (folder / "predictions.tsv").write_text("".join(rows))
    options = speedrun.SPEEDRUN_OPTIONS | {"bpe_vocab_size": bpe_vocab_size}
    if averaged is not None:
        options |= {"checkpoint_every": 5, "keep_checkpoints": 4, "average_checkpoints": 4}
    run = jf.RunConfig.from_options(**options, out=str(folder))
    model = jf.TransformerConfig.tiny(bpe_vocab_size or 300, dropout_rate=dropout)
    (folder / "config.json").write_text(
        json.dumps({"model": model.to_dict(), "run": run.to_dict()})
    )
    records = []
    for i, bleu in enumerate(bleus):
        step = 10 * (i + 1)
        records.append({"step": step, "loss": 1.0, "wall_seconds": 600.0 * (i + 1)})
        evaluation = {"step": step, "bleu": bleu, "chrf": 40.0, "eval_perplexity": 9.0}
        records.append(evaluation | {"eval_pairs": 200, "eval_beam": 1})
        records.append({"step": step + 1, "loss": 1.0, "wall_seconds": 600.0 * (i + 1) + 60})
    final_eval = {"bleu": final, "chrf": 45.0, "eval_perplexity": 8.0, "eval_pairs": 400}
    records.append({"step": 30} | final_eval | {"eval_beam": 4})
    final_model = final_eval
    if averaged is not None:
        final_model = final_eval | {"bleu": averaged, "eval_beam": 4}
        records.append({"step": 30, "averaged_steps": [15, 20, 25, 30]} | final_model)
    records.append({"step": 30, "test_bleu": 1.0})
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    summary = {
        "steps": 30,
        "wall_seconds": 1800.0,
        "eval_seconds": 150.0,
        "test_seconds": 30.0,
        "test_bleu": final + 1,
        "test_chrf": 46.0,
        "final_eval": final_eval | {"eval_beam": 4},
        "bleu": final_model["bleu"],  # the final model's (the average's, with averaging)
        "chrf": final_model["chrf"],
    }
    (folder / "summary.json").write_text(json.dumps(summary))


def test_rows_name_the_options_and_the_minutes_at_which_each_target_was_reached(tmp_path):
    make_run(tmp_path / "a", 0.1, [12.0, 16.0], 18.0)
    make_run(tmp_path / "b", 0.0, [15.5, 19.0], 21.0, exact=True, bpe_vocab_size=320)
    table, curves = report(tmp_path / "a", tmp_path / "b", out=tmp_path / "speedrun.json")
    a, b = table.rows
    # Reached at step 20's evaluation, which ended 21 min in (the next training record).
    assert a[:4] == ["the speedrun command", "30.0", "21.0", "not reached"]
    # b reaches 20 only in the final evaluation, which ends when the test scoring starts.
    # Named by its options, not by the vocabulary size its tokenizer gave the model.
    assert b[:4] == ["--dropout-rate 0.0 --bpe-vocab-size 320", "30.0", "11.0", "29.5"]
    assert a[4:] == ["18.00 / 45.00", "", "19.00 / 46.00", "8.3% + 1.7%"]
    # b's translations are exact, a's each miss a word: b is better on every resample.
    difference, interval = b[5].split(" ", 1)
    assert float(difference) > 0 and float(interval[1:].split(",")[0]) > 0
    assert [row[1:4] for row in curves.rows[:3]] == [
        ["10", "11.0", "greedy, 200 sampled"],
        ["20", "21.0", "greedy, 200 sampled"],
        ["30", "29.5", "beam 4, all 400"],
    ]


def test_a_first_run_that_is_not_the_speedrun_command_is_refused(tmp_path, capsys):
    make_run(tmp_path / "a", 0.0, [12.0], 13.0)
    err = refused(capsys, "--runs", tmp_path / "a", "--out", tmp_path / "t.json")
    assert re.search("must be the speedrun command's .* differs in dropout_rate", err)


def test_a_run_without_test_scores_is_refused(tmp_path, capsys):
    make_run(tmp_path / "a", 0.1, [12.0], 13.0)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    del summary["test_seconds"]
    (tmp_path / "a" / "summary.json").write_text(json.dumps(summary))
    err = refused(capsys, "--runs", tmp_path / "a", "--out", tmp_path / "t.json")
    assert "did not score the test set" in err
    assert "not a finished run (no summary.json" in refused(
        capsys, "--runs", tmp_path / "b", "--out", tmp_path / "t.json"
    )


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("summary.json", '{"steps": 30, "wall_', "summary.json: not valid JSON"),
        ("config.json", "", "config.json: not valid JSON"),
        ("config.json", '{"model": 1}', "config.json: expected a run's model and run configs"),
        ("metrics.jsonl", '{"step": 1}\nnot json\n{"step": 2}\n', "metrics.jsonl"),
    ],
)
def test_a_damaged_run_file_is_one_line_naming_it(tmp_path, capsys, name, text, says):
    make_run(tmp_path / "a", 0.1, [12.0], 13.0)
    (tmp_path / "a" / name).write_text(text)
    err = refused(capsys, "--runs", tmp_path / "a", "--out", tmp_path / "t.json")
    assert says in err and str(tmp_path / "a") in err
    assert not (tmp_path / "t.json").exists()


def test_a_pair_compares_two_runs_and_a_pair_outside_the_runs_is_refused(tmp_path, capsys):
    make_run(tmp_path / "a", 0.1, [12.0], 13.0)
    make_run(tmp_path / "b", 0.0, [12.0], 14.0)
    make_run(tmp_path / "c", 0.0, [12.0], 16.0, exact=True, bpe_vocab_size=320)
    out = tmp_path / "speedrun.json"
    runs = [str(tmp_path / name) for name in "abc"]
    table, paired, curves = report(*runs, out=out, options=["--pair", runs[1], runs[2] + "/"])
    [row] = paired.rows
    assert row[:3] == [
        "--dropout-rate 0.0 --bpe-vocab-size 320",
        "--dropout-rate 0.0",
        "16.00 against 14.00",
    ]
    # c's translations are exact, b's each miss a word: c is better on every resample.
    assert float(row[3].split(" [")[1].split(",")[0]) > 0
    elsewhere = str(tmp_path / "elsewhere")
    err = refused(capsys, "--runs", *runs, "--pair", runs[0], elsewhere, "--out", out)
    assert re.search(r"pair .*elsewhere: not among the runs given", err)


def test_with_checkpoint_averaging_the_final_model_is_the_average(tmp_path):
    make_run(tmp_path / "a", 0.1, [12.0], 13.0)
    make_run(tmp_path / "b", 0.1, [12.0], 14.0, averaged=15.0)
    table, curves = report(tmp_path / "a", tmp_path / "b", out=tmp_path / "speedrun.json")
    name = "--average-checkpoints 4 --checkpoint-every 5 --keep-checkpoints 4"
    assert table.rows[1][0] == name and table.rows[1][4] == "15.00 / 45.00"
    assert [row[3:6] for row in curves.rows if row[0] == name][-2:] == [
        ["beam 4, all 400", "8.0", "14.00"],
        ["beam 4, all 400, mean of the last 4 checkpoints", "8.0", "15.00"],
    ]


XEON = ("speedrun", "wide_avg_s0", "wide_avg_s1", "wide_avg_s2", "wide_avg_alpha1")
XEON += ("wide_4500", "wide_bf16", "ceiling", "wide_b16", "wide_lr001", "wide_lr003")


@pytest.mark.parametrize(
    "machine, names, pairs",
    [
        # pairs: indices into names, each (against, run)
        ("avx512", ("speedrun", "wide", "wide_10000", "wider"), [(1, 2), (1, 3)]),
        ("xeon", XEON, [(1, 4), (4, 5), (4, 6), (4, 7), (4, 8), (4, 9), (4, 10)]),
    ],
)
def test_the_committed_tables_are_what_the_committed_run_records_compute(
    machine, names, pairs, tmp_path
):
    records = ROOT / "records" / "speedruns" / f"wyc-web-{machine}"
    runs = [records / name for name in names]
    options = [x for a, b in pairs for x in ("--pair", runs[a], runs[b])]
    computed = report(*runs, out=tmp_path / "speedrun.json", options=options)
    committed = Record.read(ROOT / f"docs/results/speedrun_wyc_web_{machine}.json").tables
    for table in computed + committed:
        table.notes = []  # given as options
    assert computed == committed
