"""jaxformer bench tracker-overhead: blocks of logged steps with --tracker jsonl and with
every tracker (W&B offline), in paired rounds; the record carries the overhead and the
share of the time inside the logging calls with their intervals."""

import json
import os
import sys

import pytest

from jaxformer import cli


@pytest.mark.slow  # 20-40 s: the dates model's step compiled, 16 blocks of 3 steps
def test_the_overhead_and_the_logging_share_carry_intervals(tmp_path, monkeypatch):
    for hooked in ("exit", "excepthook"):  # wandb's service wraps them for the process
        monkeypatch.setattr(sys, hooked, getattr(sys, hooked))
    out = tmp_path / "trackers.json"
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    argv = ["--steps", "3", "--rounds", "6", "--log-every", "1", "--out", str(out)]
    assert cli.main(["bench", "tracker-overhead", *argv]) == 0
    record = json.loads(out.read_text())
    times = record["data"]["times"]
    assert [len(times[k]) for k in ("jsonl", "all")] == [6, 6]
    logging = record["data"]["logging_s"]
    assert len(logging) == 6 and all(0 < s < t for s, t in zip(logging, times["all"], strict=True))
    (row,) = record["tables"][0]["rows"]
    assert row[:3] == ["3", "1", "6"] and all(" [" in cell for cell in row[3:])
    overhead = record["data"]["headline"]["overhead"]
    assert row[5].startswith(f"{overhead:+.2%}")
    assert {k: v for k, v in os.environ.items() if k.startswith("WANDB_")} == before
