"""bench ray-sweep: its options' checks, and the record it makes of the two arms' times."""

import pytest

from jaxformer.cli import main
from jaxformer_lab.bench import ray_sweep


def test_too_few_rounds_for_an_interval_is_one_line(capsys):
    assert main(["bench", "ray-sweep", "--rounds", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "jaxformer bench ray-sweep: error: --rounds must be >= 6 and --steps >= 1, got 3, 20"
    ]


def test_the_ratio_is_rays_time_over_the_local_ones_round_by_round():
    times = {"local": [10.0, 11, 10, 12, 10, 10], "ray": [11.0, 11, 12, 12, 10.5, 11]}
    record = ray_sweep._record(ray_sweep.RaySweepOptions(), times)
    ratios = sorted(r / l for r, l in zip(times["ray"], times["local"], strict=True))
    assert record.data["ratio"]["median"] == pytest.approx((ratios[2] + ratios[3]) / 2)
    assert record.data["ratio"]["low"] == ratios[0] and record.data["ratio"]["high"] == ratios[-1]
    assert record.tables[0].rows[1][2].startswith(f"{record.data['ratio']['median']:.2f} (")
