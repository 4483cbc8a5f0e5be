"""The fitted model of eager time scored out of sample (validate.py), on points made from a
known law: the constants come back inside their intervals, a point that follows another
law fails where it is held out, a constant beyond the measured roof is reported, and a
crossover at the sweep's edge is refused."""

import numpy as np
import pytest

from jaxformer_lab.bench import stats, validate

A, B, C = 20e-6, 1 / 10e9, 1 / 50e9  # 20 us per dispatch, 10 GB/s, 50 GFLOP/s


def _row(name, dispatches, unfused, flops, rng, slower=1.0, **extra):
    """A lab row whose eager and jit times follow the law (x `slower` for eager), 12
    rounds with 2% noise."""
    fused, python = unfused / 3, 1e-4
    eager = (python + A * dispatches + B * unfused + C * flops) * slower
    jit = A + B * fused + C * flops
    noise = rng.lognormal(0, 0.02, (3, 12))
    times = {"eager": list(eager * noise[0]), "jit": list(jit * noise[1])}
    times["python"] = list(python * noise[2])
    return {
        "workload": name,
        "times": times,
        "ratios": {"eager / jit": stats.paired_ratio(times["eager"], times["jit"])},
        "counts": {
            "dispatches": {"total": dispatches, "primitives": dispatches, "jit_calls": 0},
            "bytes_unfused": unfused,
            "bytes_fused": fused,
            "flops": flops,
        },
    } | extra


def _points(rng, slower=1.0):
    rows = [
        _row("attention", 40, 1e8, 6e8, rng),
        _row("layer", 70, 3e8, 2e9, rng),
        _row("train_step", 1300, 2e9, 2e10, rng, slower=slower),
    ]
    scale = [
        _row("forward", 400, u, f, rng, d_model=d, batch=8, length=32, axis="d_model", value=d)
        for d, u, f in ((64, 5e7, 2e8), (128, 2e8, 1e9), (256, 8e8, 6e9), (512, 3e9, 4e10))
    ]
    return rows, scale


def _dispatch(us):
    return {
        "eager primitive": {"median": us, "low": 0.95 * us, "high": 1.05 * us},
        "jit call": {"median": 6.0, "low": 5.7, "high": 6.3},
    }


def _roofs(bandwidth):
    return {
        "bandwidth_bytes": {"median": bandwidth, "low": 0.9 * bandwidth, "high": 1.1 * bandwidth},
        "gemm_flops": {"median": 200e9, "low": 190e9, "high": 210e9},
    }


def test_a_law_is_recovered_and_holds_out_of_sample():
    rows, scale = _points(np.random.default_rng(0))
    why = validate.validate(rows, scale, _roofs(30e9), _dispatch(20.0))
    c = why["constants"]
    assert c["a_us"]["median"] == pytest.approx(20, rel=0.05)
    assert c["bandwidth_gb_s"]["median"] == pytest.approx(10, rel=0.1)
    assert c["a_us"]["low"] <= c["a_us"]["median"] <= c["a_us"]["high"]
    assert c["a_us"]["n"] == validate.REPLICATES
    assert all(p["verdict"] == "holds" for p in why["held_out"]["by_point"])
    assert [p["point"] for p in why["held_out"]["extrapolation"]["points"]] == [
        "forward, d_model 512"
    ]
    assert why["failures"] == []
    checks = {k["constant"]: k["relation"] for k in why["checks"]}
    assert checks["bandwidth_gb_s"] == "below" and checks["a_us"] == "overlaps"
    gap = why["gaps"]["layer"]
    assert gap["residual"]["share"]["median"] == pytest.approx(0, abs=0.1)


def test_a_point_off_the_law_fails_where_it_is_held_out():
    rows, scale = _points(np.random.default_rng(1), slower=2.0)  # the train step: 2x slower
    why = validate.validate(rows, scale, _roofs(30e9), _dispatch(20.0))
    held = {p["point"]: p for p in why["held_out"]["by_point"]}
    assert held["train_step"]["verdict"] == "fails"
    assert held["train_step"]["error"]["median"] == pytest.approx(-0.5, abs=0.05)  # half its time
    assert any("train_step" in f and "left out alone" in f for f in why["failures"])


def test_a_constant_beyond_the_measured_roof_is_reported():
    rows, scale = _points(np.random.default_rng(2))
    why = validate.validate(rows, scale, _roofs(2e9), _dispatch(5.0))  # roof 2 GB/s < 10
    checks = {k["constant"]: k["relation"] for k in why["checks"]}
    assert checks["bandwidth_gb_s"] == "exceeds" and checks["a_us"] == "above"
    assert sum("measured in the same run" in f for f in why["failures"]) == 2


def _ci(median, low, high):
    return {"median": median, "low": low, "high": high}


def test_a_crossover_at_the_sweeps_edge_is_refused():
    xs = [64, 128, 256, 512]
    speedups = np.tile([9.0, 5.0, 3.0, 1.99], (validate.REPLICATES + 1, 1))
    edge = [_ci(9, 8, 10), _ci(5, 4.5, 5.5), _ci(3, 2.8, 3.2), _ci(1.99, 1.89, 2.01)]
    refused = validate.crossing("d_model", xs, speedups, edge)
    assert not refused["established"] and "512 (the sweep's edge)" in refused["why"]
    clear = edge[:3] + [_ci(1.5, 1.4, 1.6)]
    speedups[:, 3] = 1.5
    found = validate.crossing("d_model", xs, speedups, clear)
    assert found["established"] and 256 < found["value"]["median"] < 512
    none = validate.crossing("d_model", xs, speedups + 10, clear)
    assert none == {"established": False, "why": "no crossing within d_model 64-512"}
