"""jaxformer bench make-train: `make train`'s command as one fresh process, its in-run
exact match and its time read from the run folder it wrote (here a 4-step run)."""

import json

import pytest

from jaxformer import cli
from jaxformer_lab.bench import make_train


@pytest.mark.slow  # a fresh process trains and evaluates: 20-40 s
def test_the_record_reads_the_runs_own_folder(tmp_path, monkeypatch):
    short = [*make_train.COMMAND, "--steps", "4", "--eval-every", "2", "--eval-examples", "8"]
    monkeypatch.setattr(make_train, "COMMAND", short)
    out = tmp_path / "make_train.json"
    assert cli.main(["bench", "make-train", "--out", str(out)]) == 0
    accuracy, timing = json.loads(out.read_text())["tables"]
    assert [row[0] for row in accuracy["rows"]][0] == "2"
    assert accuracy["rows"][-1][0].startswith("4 (end, all ")
    (row,) = timing["rows"]
    assert row[0].endswith(" s") and "(" in row[5]


def test_a_failed_run_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(make_train, "COMMAND", ["-c", "import sys; sys.exit('no data here')"])
    with pytest.raises(RuntimeError, match="exited with 1: no data here"):
        make_train.timed_run(tmp_path)
