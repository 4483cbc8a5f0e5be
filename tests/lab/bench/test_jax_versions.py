"""jaxformer_lab.bench.jax_versions (`jaxformer bench jax-versions`): every line timed in
the same rounds against ONE GEMM peak, and a quick run of two lines end to end."""

import sys

import pytest

from jaxformer_lab.bench import jax_versions, registry, stats, train_step

N3 = 2 * train_step.PEAK_N**3


def test_two_lines_of_one_jax_are_told_apart_by_their_python_or_a_number():
    infos = [
        dict(jax="0.12.0", python="3.13.0"),
        dict(jax="0.12.0", python="3.12.1"),
        dict(jax="0.10.2", python="3.11.7"),
        dict(jax="0.12.0", python="3.13.0"),
    ]
    assert jax_versions.line_names(infos) == [
        "JAX 0.12.0 (Python 3.13.0) #1",
        "JAX 0.12.0 (Python 3.12.1)",
        "JAX 0.10.2",
        "JAX 0.12.0 (Python 3.13.0) #2",
    ]


def _ready(device="cpu"):
    programs = {
        d: dict(xla_flops=1.0, temp_bytes=2, argument_bytes=3, first_step_s=4.0)
        for d in jax_versions.DTYPES
    }
    programs["gemm"] = dict(device=device, xla_threads=2)
    return {"programs": programs, "ready_s": 5.0}


def test_the_one_peak_is_the_fastest_gemm_and_every_share_is_taken_against_it():
    options = jax_versions.JaxVersionsOptions(steps_per_round=2, batch=32)
    lines = {"JAX a": dict(python="3.13.0", jax="a"), "JAX b": dict(python="3.11.7", jax="b")}
    k, rounds = 2, 6
    # per call of k steps; GEMM rates per round: a's 100, b's 120, NumPy's 110 GFLOP/s...
    gemm = {"JAX a": 100e9, "JAX b": 120e9, "numpy": 110e9}
    times = {
        f"{n}/gemm": [k * N3 / (r * (1 + 0.01 * i)) for i in range(rounds)] for n, r in gemm.items()
    }
    times["JAX a/float32"] = [k * 0.4] * rounds
    times["JAX b/float32"] = [k * 0.5, k * 0.5, k * 0.5, k * 0.6, k * 0.6, k * 0.6]
    times["JAX a/bfloat16"] = [k * 0.3] * rounds
    times["JAX b/bfloat16"] = [k * 0.3] * rounds
    r = jax_versions.figures(times, options, lines, {n: _ready() for n in lines})
    peak = r["gemm_peak_flops"]
    assert peak["of"] == "JAX b/gemm"  # the fastest, whichever line or library it is
    b_rates = [120e9 * (1 + 0.01 * i) for i in range(rounds)]
    assert peak["samples"] == pytest.approx(b_rates)
    flops = r["analytic_flops_per_step"]
    share_a = [flops / 0.4 / rate for rate in b_rates]  # a's step against b's GEMM, round by round
    assert r["runs"]["JAX a"]["float32"]["share_of_peak"]["median"] == pytest.approx(
        stats.median_ci(share_a)["median"]
    )
    assert r["runs"]["JAX a"]["float32"]["speed_vs_first"]["median"] == 1.0
    speed_b = r["runs"]["JAX b"]["float32"]["speed_vs_first"]
    assert speed_b["median"] == pytest.approx((0.4 / 0.5 + 0.4 / 0.6) / 2)  # a's time over b's
    assert r["runs"]["JAX a"]["gemm_flops"]["median"] == pytest.approx(
        stats.median_ci([100e9 * (1 + 0.01 * i) for i in range(rounds)])["median"]
    )
    rows = jax_versions.table(
        r
        | {
            "rounds": rounds,
            "load": dict(others_cores=0.1, cores=2, others_cores_max=0.2, load_average=1.0),
        }
    ).rows
    assert [row[:2] for row in rows] == [
        ["JAX a, Python 3.13.0", "float32"],
        ["JAX a, Python 3.13.0", "bfloat16 compute"],
        ["JAX b, Python 3.11.7", "float32"],
        ["JAX b, Python 3.11.7", "bfloat16 compute"],
    ]


@pytest.mark.slow  # two workers compile two train steps each
def test_a_quick_run_of_two_lines_times_profiles_and_compares_them(tmp_path):
    options = jax_versions.JaxVersionsOptions(
        pythons=(sys.executable, sys.executable),
        rounds=6,
        steps_per_round=1,
        batch=1,
        out=str(tmp_path / "v.json"),
    )
    record = registry.run("jax-versions", options)
    r = record.data
    assert len(r["lines"]) == 2 and all("Python" in name for name in r["lines"])
    first, second = r["lines"]
    for name in r["lines"]:
        for dtype in jax_versions.DTYPES:
            run = r["runs"][name][dtype]
            assert run["seconds"]["n"] == 6 and run["seconds"]["low"] <= run["seconds"]["median"]
        profile = r["profiles"][name]["float32"]
        assert profile["steps"] == 6 and profile["busy_ms"]["median"] > 0
        assert "matrix products" in profile["kinds"] and len(profile["ops"]) > 10
    assert r["runs"][first]["float32"]["speed_vs_first"]["median"] == 1.0
    assert set(r["differences"]["float32"]) == {second}
    assert r["gemm_peak_flops"]["of"] in {f"{first}/gemm", f"{second}/gemm", "numpy/gemm"}
    assert len(record.tables) == 4 and record.data["headline"]["gemm_peak_gflops"] > 0
