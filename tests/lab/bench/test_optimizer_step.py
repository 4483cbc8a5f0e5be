"""jaxformer bench optimizer-step: each optimizer's train step against AdamW's in paired
rounds, per batch size; the record carries each ratio with its interval and whether
Muon's meets its target."""

import json

import pytest

from jaxformer import cli
from jaxformer_lab.bench import optimizer_step


@pytest.mark.slow  # 20-40 s: four optimizers' steps of train-step's model compiled
def test_each_optimizer_is_timed_against_adamw_with_an_interval(tmp_path):
    out = tmp_path / "optimizers.json"
    words = "--batches 2 --rounds 6 --steps-per-round 1 --cheap-ns-steps 2".split()
    assert cli.main(["bench", "optimizer-step", *words, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    runs = record["data"]["batches"]["2"]
    assert list(runs) == ["adamw", "muon", "muon_ns2", "schedule_free_adamw"]
    for name, run in runs.items():
        assert len(run["samples"]) == 6
        ratio = run["over_adamw"]
        assert ratio["low"] <= ratio["median"] <= ratio["high"]
        if name == "adamw":
            assert ratio["median"] == 1.0
    headline = record["data"]["headline"]
    assert headline["muon_target_met_b2"] == (runs["muon"]["over_adamw"]["high"] <= 1.10)
    rows = record["tables"][0]["rows"]
    assert [r[1] for r in rows] == list(runs) and rows[1][3].startswith(
        f"{runs['muon']['over_adamw']['median']:.2f}x ["
    )


def test_bad_options_are_refused_naming_them():
    with pytest.raises(ValueError, match="--rounds must be >= 6"):
        optimizer_step.OptimizerStepOptions(rounds=3)
    with pytest.raises(ValueError, match="--batches must be >= 1, got 0"):
        optimizer_step.OptimizerStepOptions(batches=(8, 0))
