"""jaxformer bench sweep-jobs: one run on every core against N runs at once, each pinned to
its share of the cores, timed in paired rounds."""

import json
import os

import pytest

from jaxformer import cli

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0


@pytest.mark.slow  # three worker processes set up and compile the dates model: 40-80 s
@pytest.mark.skipif(CORES < 2, reason="pinning two runs needs Linux and two cores")
def test_runs_at_once_are_timed_against_one_run_on_every_core(tmp_path):
    out = tmp_path / "jobs.json"
    argv = ["--steps", "1"]  # --jobs 2, the default
    assert cli.main(["bench", "sweep-jobs", *argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"] == " ".join(
        ["jaxformer", "bench", "sweep-jobs", "--out", str(out), *argv]
    )
    (row,) = record["data"]["rows"]
    cores = sorted(os.sched_getaffinity(0))
    assert row["jobs"] == 2 and row["cores"] == [cores[: CORES // 2], cores[CORES // 2 :]]
    assert 0 < row["speedup"]["low"] <= row["speedup"]["median"] <= row["speedup"]["high"]
    assert row["seconds"]["one"]["n"] == 6 and set(row["peak_mib"]) == {"one", "run0", "run1"}
    assert all(mib > 0 for mib in row["peak_mib"].values())
    assert record["data"]["headline"] == {"jobs=2": round(row["speedup"]["median"], 3)}
    assert "what varied: the round" in record["tables"][0]["caption"]
    assert (tmp_path / "jobs-run1.log").exists()


def test_more_runs_than_cores_to_pin_them_to_is_refused(capsys):
    jobs = str(max(CORES, 1) + 1)
    assert cli.main(["bench", "sweep-jobs", "--jobs", jobs, "--out", "/nonexistent/x.json"]) == 2
    err = capsys.readouterr().err
    assert f"--jobs {jobs}: runs cannot be pinned to cores here" in err
