"""The XLA-vs-eager lab: its statistics, that every mode computes the same numbers, that
the program counters read real programs, and (slow) the whole --quick report."""

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxformer.bench import eager_model, programs, report, stats, workloads
from jaxformer.bench import xla_vs_eager as lab


def test_median_interval_is_the_binomial_order_statistics():
    # n = 30: the 95% interval of the median is [x_(10), x_(21)] (1-based).
    ci = stats.median_ci([float(i) for i in range(30)])
    assert (ci["median"], ci["low"], ci["high"], ci["n"]) == (14.5, 9.0, 20.0, 30)
    ci6 = stats.median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0])  # n = 6: only the extremes cover 95%
    assert (ci6["low"], ci6["median"], ci6["high"]) == (1.0, 3.5, 6.0)


def test_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = sum(
        ci["low"] <= 1.0 <= ci["high"]  # exponential(1) shifted so its median is 1
        for ci in (
            stats.median_ci(list(rng.exponential(1, 30) + 1 - math.log(2))) for _ in range(2000)
        )
    )
    assert 0.94 <= hits / 2000 <= 0.985  # exact coverage 95.7%


@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=6, max_size=60))
@settings(max_examples=50, deadline=None)
def test_median_lies_inside_its_interval(samples):
    ci = stats.median_ci(samples)
    assert ci["low"] <= ci["median"] <= ci["high"]


def test_too_few_samples_for_an_interval_are_refused():
    with pytest.raises(ValueError, match="5 samples cannot give a 95% interval"):
        stats.median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(ValueError, match="confidence must be in"):
        stats.median_ci([1.0] * 10, confidence=1.5)


def test_paired_ratio_of_identical_series_contains_one():
    times = list(np.random.default_rng(0).lognormal(-5, 0.3, 30))
    ci = stats.paired_ratio(times, list(times))
    assert ci["low"] <= 1 <= ci["high"] and ci["median"] == 1


def test_paired_ratio_recovers_a_constructed_twofold_speedup():
    rng = np.random.default_rng(1)
    fast = rng.lognormal(-5, 0.5, 30)  # rounds that vary 50%: noise shared by the pair
    slow = 2 * fast * rng.lognormal(0, 0.05, 30)
    ci = stats.paired_ratio(list(slow), list(fast))
    assert ci["low"] <= 2 <= ci["high"]
    assert ci["high"] - ci["low"] < 0.2  # pairing cancels the rounds' shared noise
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_ratio([1.0] * 6, [1.0] * 7)


def _ci(median, low, high):
    return {"median": median, "low": low, "high": high}


def test_break_even_is_not_significant_when_the_saving_spans_zero():
    b = stats.break_even(_ci(1.0, 0.9, 1.1), _ci(3.0, 2.8, 3.2), _ci(1e-3, -1e-3, 3e-3))
    assert b == {"verdict": "not significant", "calls": None, "low": None, "high": None}
    slower = stats.break_even(_ci(1.0, 0.9, 1.1), _ci(3.0, 2.8, 3.2), _ci(-2e-3, -3e-3, -1e-3))
    assert slower["verdict"] == "never"


def test_break_even_counts_from_each_modes_first_call():
    # jit's first call 3 s against eager's 1 s, 2 ms (1-4 ms) saved per later call.
    b = stats.break_even(_ci(1.0, 0.9, 1.1), _ci(3.0, 2.8, 3.2), _ci(2e-3, 1e-3, 4e-3))
    assert b["verdict"] == "pays off" and b["calls"] == 1 + 1000
    assert 1 + 425 <= b["low"] <= 1 + 426  # 1.7 s / 4 ms (ceil of a float quotient)
    assert 1 + 2300 <= b["high"] <= 1 + 2301  # 2.3 s / 1 ms
    # eager's first call (10 s) is slower than jit's (3.3 s): jit is ahead from call 1.
    ahead = stats.break_even(_ci(10.0, 9.5, 11), _ci(3.3, 3.2, 3.4), _ci(2e-3, 1e-3, 4e-3))
    assert ahead == {"verdict": "from call 1", "calls": 1, "low": 1, "high": 1}


def test_few_fresh_processes_get_the_coverage_of_their_range():
    ci = stats.best_median_ci([3.0, 1.0, 2.0])
    assert (ci["low"], ci["median"], ci["high"], ci["confidence"]) == (1.0, 2.0, 3.0, 0.75)
    assert stats.best_median_ci([float(i) for i in range(10)])["confidence"] == 0.95


def test_interleaved_rounds_rotate_the_order_of_the_modes():
    order = []
    calls = {m: (lambda m=m: order.append(m)) for m in "abc"}
    times = stats.time_interleaved(calls, rounds=3, warmup=1)
    assert order == list("abc") + list("abc") + list("bca") + list("cab")
    assert {m: len(t) for m, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        stats.time_interleaved(calls, rounds=0)


def test_a_fused_elementwise_chain_counts_as_fewer_fusions_than_its_ops():
    def chain(x):
        return jnp.sin(jnp.cos(jnp.exp(x))) * 2 + 1

    x = jnp.ones(64)
    lowered = jax.jit(chain).lower(x)
    counts = programs.hlo_counts(lowered, lowered.compile())
    assert programs.jaxpr_equations(chain, x) == 5  # exp, cos, sin, mul, add
    assert counts["hlo_ops_before"] > counts["hlo_ops_after"]
    assert 1 <= counts["fusions"] < 5


def test_equations_of_nested_jits_are_counted_inline_but_dispatched_once():
    inner = jax.jit(lambda x: jnp.tanh(x) + 1)

    def outer(x):
        return inner(x) * inner(x)

    assert programs.jaxpr_equations(outer, jnp.ones(4)) == 5  # (tanh, add) x 2, mul
    # eager calls the inner jit as one compiled call, twice, and dispatches mul alone
    assert programs.dispatches(outer, jnp.ones(4)) == {
        "primitives": 1,
        "jit_calls": 2,
        "total": 3,
    }


def test_custom_jvp_bodies_are_dispatched_op_by_op():
    @jax.custom_jvp
    def softplus(x):
        return jnp.log1p(jnp.exp(x))

    softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))
    assert programs.dispatches(softplus, jnp.ones(4))["primitives"] == 2  # exp, log1p


def test_cost_analysis_counts_a_matmuls_flops():
    x = jnp.ones((16, 8))
    lowered = jax.jit(lambda x: x @ x.T).lower(x)
    cost = programs.cost(lowered, lowered.compile())
    assert cost["flops"] == 2 * 16 * 16 * 8
    assert cost["bytes_fused"] >= (16 * 8 + 16 * 16) * 4  # reads x, writes the product


def test_fitted_model_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    a, b, c = 5e-6, 1 / 20e9, 1 / 50e9  # 5 us per dispatch, 20 GB/s, 50 GFLOP/s
    rows = []
    for _ in range(12):
        r = dict(
            dispatches=int(rng.integers(50, 2000)),
            bytes_unfused=rng.uniform(1e5, 1e9),
            flops=rng.uniform(1e6, 1e11),
            python_s=rng.uniform(1e-5, 1e-3),
        )
        exact = r["python_s"] + a * r["dispatches"] + b * r["bytes_unfused"] + c * r["flops"]
        rows.append(r | {"eager_s": exact * rng.normal(1, 0.01)})  # 1% timing noise
    fit = eager_model.fit(rows)
    assert fit["a"] == pytest.approx(a, rel=0.05)
    assert fit["b"] == pytest.approx(b, rel=0.05)
    assert fit["c"] == pytest.approx(c, rel=0.05)
    assert fit["rel_error"] < 0.02
    row = rows[0] | {"bytes_fused": rows[0]["bytes_unfused"] / 2}
    gap = eager_model.explain_gap(fit, row, gap_s=1.0)
    assert gap["python"] + gap["dispatch"] + gap["unfused_bytes"] + gap["residual"] == 1.0
    with pytest.raises(ValueError, match="needs >= 3 rows"):
        eager_model.fit(rows[:2])


def test_crossover_interpolates_on_log_axes():
    assert eager_model.crossover([1, 4], [4.0, 1.0]) == pytest.approx(2.0)
    assert eager_model.crossover([1, 2, 4], [9.0, 5.0, 3.0]) is None


def test_memory_plan_reads_the_compiled_programs_buffers():
    compiled = jax.jit(lambda x: x @ x.T).lower(jnp.ones((16, 8))).compile()
    plan = programs.memory_plan(compiled)
    assert plan["arguments"] == 16 * 8 * 4 and plan["outputs"] == 16 * 16 * 4


# The train step (14 s, torch.compile's mostly) is also checked in every mode by the slow
# --quick report test; the quick suite keeps the stateless workloads.
@pytest.mark.parametrize(
    "name", [*workloads.WORKLOADS[:-1], pytest.param("train_step", marks=pytest.mark.slow)]
)
def test_every_mode_computes_the_same_values(name):
    pytest.importorskip("torch")
    w = workloads.build(name, workloads.bench_config(64, 1, vocab=64), batch=2, length=8)
    calls = lab.mode_calls(w, "cpu", lab.modes_of(w, "cpu"))
    assert set(lab.JAX_MODES + lab.TORCH_MODES) <= set(calls)
    first = {mode: [lab._numpy(call()), lab._numpy(call())] for mode, call in calls.items()}
    agree = lab.agreement(first, tolerance=1e-4)
    assert all(a["agrees"] for a in agree.values()), agree
    if w.stateful:  # the second loss is after one Adam step, the same in every mode
        assert first["jit"][1] < first["jit"][0]


def test_agreement_flags_a_mode_that_disagrees():
    first = {"jit": [np.ones(3)], "eager": [np.ones(3)], "torch": [np.array([1.0, 1.0, 1.5])]}
    agree = lab.agreement(first, tolerance=1e-4)
    assert agree["eager"] == {"max_abs_diff": 0.0, "agrees": True}
    assert agree["torch"] == {"max_abs_diff": 0.5, "agrees": False}


def _row(name, eager_ms, jit_ms, rng, agrees=True, **extra):
    """A lab row from constructed timings: jit's rounds x eager_ms / jit_ms for eager."""
    jit = list(rng.lognormal(np.log(jit_ms / 1e3), 0.1, 12))
    times = {"eager": [t * eager_ms / jit_ms for t in jit], "jit": jit, "python": jit}
    times["torch"] = list(rng.permutation(jit))  # as fast as jit: a ratio spanning 1
    saving = stats.paired_saving(times["eager"], times["jit"])
    first = {"median": 2.0, "low": 1.5, "high": 2.5, "n": 3, "confidence": 0.75}
    fresh = {m: {"first_call_s": first, "peak_rise_bytes": 2**20} for m in times}
    slow_first = {"median": 5.0, "low": 4.5, "high": 5.5, "n": 3, "confidence": 0.75}
    fresh["eager"]["first_call_s"] = slow_first  # eager's first call slower than jit's
    return {
        "workload": name,
        "times": times,
        "timing": {m: stats.median_ci(t) for m, t in times.items()},
        "ratios": lab.paired_ratios(times),
        "agreement": {
            "eager": {"max_abs_diff": 0.0 if agrees else 0.5, "agrees": agrees},
            "jit": {"max_abs_diff": 0.0, "agrees": True},
        },
        "counts": {
            "dispatches": {"primitives": 90, "jit_calls": 10, "total": 100},
            "jaxpr_equations": 120,
            "hlo_ops_before": 200,
            "hlo_ops_after": 50,
            "fusions": 30,
            "flops": 1e8 * eager_ms,
            "bytes_unfused": 1e7 * eager_ms,
            "bytes_fused": 4e6 * eager_ms,
            "memory_plan": None,
        },
        "fresh": fresh | {"nnx.jit": {"error": "MemoryError"}},
        "break_even": {"jit": stats.break_even(slow_first, first, saving) | {"saving_s": saving}},
        "attention_path": {"jax": "xla", "torch": ["aten::_native_multi_head_attention"]},
    } | extra


def _result(quick=True):
    rng = np.random.default_rng(0)
    rows = [_row("attention", 4.0, 1.0, rng), _row("forward", 10.0, 2.0, rng)]
    scale = [
        _row("forward", e, j, rng, agrees=v != 8, axis="batch", value=v)
        | {"d_model": 64, "batch": v, "length": 16}
        for v, e, j in ((1, 8.0, 1.0), (8, 9.0, 3.0), (32, 12.0, 8.0))
    ]
    scale.append(scale[1] | {"axis": "length", "value": 16})  # the center, on a second axis
    ci = {"median": 1e9, "low": 9e8, "high": 1.1e9}
    dispatch = {"eager primitive": ci | {"median": 10.0}, "jit call": ci | {"median": 20.0}}
    return {
        "command": "jaxformer bench xla-vs-eager --quick",
        "model": "tiny",
        "quick": quick,
        "note": "Under load." if quick else "",
        "rounds": 12,
        "repeats": 3,
        "tolerance": 1e-4,
        "memory_measure": "resident peak",
        "wall_s": 1.0,
        "workloads": rows,
        "scale": scale,
        "dispatch_us": dispatch,
        "scale_center": {"d_model": 64, "batch": 8, "length": 16},
        "roofs": {"gemm_flops": ci, "gemm_n": 512, "bandwidth_bytes": ci},
        "why": lab.explain(rows, scale),
        "machine": {
            "device": "cpu",
            "jax": "x",
            "flax": "y",
            "cpu_count": 2,
            "xla_intra_op_threads": 2,
            "torch": "z",
            "torch_threads": 2,
            "torch_device": "cpu",
            "load_before": 0.0,
            "load_after": 0.0,
        },
    }


def test_report_tables_carry_intervals_verdicts_and_flags(tmp_path):
    result = _result()
    text = report.markdown(result)
    assert text.startswith(
        "# XLA vs eager\n\n**A --quick run** (a tiny model, few repeats). **Under load.**"
    )
    assert "**Outputs that disagree with jit**" in text and "forward batch 8 eager (0.5)" in text
    assert "| attention | eager / jit | 4.00 (4.00-4.00) | yes |" in text  # constructed 4x
    torch_row = next(ln for ln in text.splitlines() if ln.startswith("| attention | torch / jit"))
    assert torch_row.endswith("| no |")  # the same rounds shuffled: not significant
    be = "| attention | jit vs eager | 5.00 (4.50-5.50; 3 processes, 75%) | 2.00 (1.50-2.50; "
    assert be in text
    assert "| from call 1 |" in text  # jit's first call is faster than eager's, and it saves
    assert "failed: MemoryError" in text
    assert "reduce-overhead is not run on a CPU" in text
    assert "## A fitted model of eager time" in text and "| batch |" in text
    assert result["why"]["model"]["rows"] == 2 + 3  # the center counted once


def test_docs_tables_render_a_committed_report_json(tmp_path):
    result = _result(quick=False)
    (tmp_path / "report.json").write_text(json.dumps(result))
    assert report.docs_tables(tmp_path / "report.json") == report.tables(result)
    assert "--quick run" not in report.tables(result)
    assert set(report.plots(result, tmp_path)) == {"modes.png", "roofline.png", "scale.png"}
    assert all((tmp_path / name).stat().st_size > 0 for name in report.plots(result, tmp_path))


def test_bad_workloads_and_sizes_are_named():
    with pytest.raises(ValueError, match="unknown workload 'decoder'"):
        workloads.build("decoder", workloads.bench_config(), 2, 8)
    with pytest.raises(ValueError, match="d_model must be a multiple of 32"):
        workloads.bench_config(100)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        workloads.build("forward", workloads.bench_config(), 0, 8)


def test_too_few_rounds_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxformer",
            "bench",
            "xla-vs-eager",
            "--rounds",
            "3",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "--rounds must be >= 6" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_quick_report_is_complete(tmp_path):
    pytest.importorskip("torch")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxformer",
            "bench",
            "xla-vs-eager",
            "--quick",
            "--rounds",
            "6",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    headline = json.loads(result.stdout.strip().splitlines()[-1])
    report = json.loads((tmp_path / "report.json").read_text())
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"report.md", "report.json", "modes.png", "scale.png", "roofline.png"}
    for row in report["workloads"]:
        assert set(lab.JAX_MODES + lab.TORCH_MODES) <= set(row["timing"])
        assert all(t["n"] == 6 for t in row["timing"].values())
        assert all(a["agrees"] for a in row["agreement"].values())
        assert headline[row["workload"]]["jit_break_even"] == row["break_even"]["jit"]["verdict"]
        assert all("peak_rise_bytes" in f for f in row["fresh"].values())
        assert row["counts"]["dispatches"]["total"] <= row["counts"]["jaxpr_equations"]
    assert "torch.compile step" in report["workloads"][-1]["timing"]
    assert {r["axis"] for r in report["scale"]} == {"d_model", "batch", "length"}
    assert report["why"]["model"]["rows"] == len(report["workloads"]) + 7  # distinct points
    text = (tmp_path / "report.md").read_text()
    assert "## Scale" in text and "every mode agrees with jit" in text
