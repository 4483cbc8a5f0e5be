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

from jaxformer.bench import programs, report, stats, workloads
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


def test_break_even_counts_calls_and_says_never_when_not_faster():
    slow, fast = {"median": 3e-3}, {"median": 1e-3}
    assert stats.break_even(1.0, slow, fast) == 500
    assert stats.break_even(1.0001, slow, fast) == 501  # a part call is a whole call
    assert stats.break_even(1.0, fast, slow) is None  # compiled is slower: never
    assert stats.break_even(1.0, slow, slow) is None
    assert stats.faster({"low": 2, "high": 3}, {"low": 0.5, "high": 1})
    assert not stats.faster({"low": 2, "high": 3}, {"low": 1, "high": 2.5})  # intervals overlap


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


def test_equations_of_nested_jits_are_counted_inline():
    inner = jax.jit(lambda x: jnp.tanh(x) + 1)

    def outer(x):
        return inner(x) * inner(x)

    assert programs.jaxpr_equations(outer, jnp.ones(4)) == 5  # (tanh, add) x 2, mul


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
    calls = lab.mode_calls(w, "cpu")
    assert set(calls) == set(lab.JAX_MODES + lab.TORCH_MODES)
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


def _row(eager_ms, jit_ms, agrees=True, **extra):
    ci = lambda ms, w: {"median": ms / 1e3, "low": (ms - w) / 1e3, "high": (ms + w) / 1e3}  # noqa: E731
    return {
        "workload": "forward", "timing": {"eager": ci(eager_ms, 1), "jit": ci(jit_ms, 1)},
        "agreement": {"eager": {"max_abs_diff": 0.0 if agrees else 0.5, "agrees": agrees},
                      "jit": {"max_abs_diff": 0.0, "agrees": True}},
        "break_even": {"jit": None, "jit_warm_cache": None}, "first_call_s": {"eager": 1.0},
        "costs": {"cold": {"trace_s": 0.1, "lower_s": 0.1, "compile_s": 1.0},
                  "warm": {"total_s": 0.1}, "jaxpr_equations": 10, "hlo_ops_before": 20,
                  "hlo_ops_after": 5, "fusions": 3, "memory_plan": None},
        "memory": {"eager": {"peak_rise_bytes": 2**20}, "jit": {"error": "MemoryError"}},
    } | extra  # fmt: skip


def test_report_flags_disagreement_in_the_scale_sweep_and_noise_in_speedups():
    result = {
        "command": "jaxformer bench xla-vs-eager", "model": "tiny", "rounds": 30,
        "tolerance": 1e-4, "memory_measure": "resident peak", "wall_s": 1.0,
        "machine": {"device": "cpu", "jax": "x", "flax": "y", "cpu_count": 2,
                    "load_before": 0.0, "load_after": 0.0},
        "workloads": [_row(10.0, 2.0)], "dispatch_us": {},
        "scale": [_row(3.0, 2.5, agrees=False, axis="batch", value=8)],
    }  # fmt: skip
    text = report.markdown(result)
    assert "**Outputs that disagree with jit**" in text and "forward batch 8 eager (0.5)" in text
    assert "| 5.0x |" in text  # intervals apart: no mark
    assert "| 1.2x* |" in text  # 3 +- 1 against 2.5 +- 1: within the noise
    assert "failed: MemoryError" in text


def test_bad_workloads_and_sizes_are_named():
    with pytest.raises(ValueError, match="unknown workload 'decoder'"):
        workloads.build("decoder", workloads.bench_config(), 2, 8)
    with pytest.raises(ValueError, match="d_model must be a multiple of 32"):
        workloads.bench_config(100)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        workloads.build("forward", workloads.bench_config(), 0, 8)


def test_too_few_rounds_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "jaxformer", "bench", "xla-vs-eager", "--rounds", "3",
         "--out", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--rounds must be >= 6" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_quick_report_is_complete(tmp_path):
    pytest.importorskip("torch")
    result = subprocess.run(
        [sys.executable, "-m", "jaxformer", "bench", "xla-vs-eager", "--quick", "--out",
         str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    headline = json.loads(result.stdout.strip().splitlines()[-1])
    report = json.loads((tmp_path / "report.json").read_text())
    assert {p.name for p in tmp_path.iterdir()} == {
        "report.md",
        "report.json",
        "modes.png",
        "scale.png",
    }
    for row in report["workloads"]:
        assert set(row["timing"]) == set(lab.JAX_MODES + lab.TORCH_MODES)
        assert all(t["n"] == 30 for t in row["timing"].values())
        assert all(a["agrees"] for a in row["agreement"].values())
        assert row["timing"]["jit"]["high"] < row["timing"]["eager"]["low"]  # jit is faster
        assert headline[row["workload"]]["jit_break_even_calls"] == row["break_even"]["jit"]
        assert row["costs"]["warm"]["compile_s"] < row["costs"]["cold"]["compile_s"]
        assert all("peak_rise_bytes" in row["memory"][mode] for mode in ("eager", "jit"))
    assert {r["axis"] for r in report["scale"]} == {"d_model", "batch", "length"}
    text = (tmp_path / "report.md").read_text()
    assert "## Scale" in text and "every mode agrees with jit" in text
