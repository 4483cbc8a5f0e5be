"""The XLA-vs-eager lab's statistics and program counters; its runner (options recorded as
given, the load guard, parts that resume and survive a stop) and report are in
test_lab_run.py, its modes in test_lab_modes.py, the validated model in test_validate.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxformer_lab.bench import eager_model, programs, stats


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
    X = np.stack(
        [rng.integers(50, 2000, 12), rng.uniform(1e5, 1e9, 12), rng.uniform(1e6, 1e11, 12)], 1
    )
    python = rng.uniform(1e-5, 1e-3, 12)
    eager = (python + X @ [a, b, c]) * rng.normal(1, 0.002, 12)  # 0.2% timing noise
    fitted = eager_model.fit_arrays(X.astype(float), eager, python)
    np.testing.assert_allclose(fitted, [a, b, c], rtol=0.05)
    with pytest.raises(ValueError, match="needs >= 3 points"):
        eager_model.fit_arrays(X[:2].astype(float), eager[:2], python[:2])


def test_crossover_interpolates_on_log_axes():
    assert eager_model.crossover([1, 4], [4.0, 1.0]) == pytest.approx(2.0)
    assert eager_model.crossover([1, 2, 4], [9.0, 5.0, 3.0]) is None
    assert eager_model.crossing_segment([9.0, 5.0, 1.5, 1.0]) == 1


def test_memory_plan_reads_the_compiled_programs_buffers():
    compiled = jax.jit(lambda x: x @ x.T).lower(jnp.ones((16, 8))).compile()
    plan = programs.memory_plan(compiled)
    assert plan["arguments"] == 16 * 8 * 4 and plan["outputs"] == 16 * 16 * 4


def test_the_profiler_counts_what_an_eager_call_launched_and_put():
    x = jnp.ones((8, 8))

    def f(x):  # sin, dot, max (relu), add: four primitives; 1.0 put from the host
        return jax.nn.relu(jnp.sin(x) @ x) + 1.0

    f(x)  # compile each primitive once
    eager = programs.launched(lambda: jax.block_until_ready(f(x)))
    assert eager["launches"] == programs.dispatches(f, x)["total"] == 4
    assert eager["transfers"] >= 1 and set(eager["events"]) >= {"DevicePut"}
    jitted = jax.jit(f)
    jitted(x)
    once = programs.launched(lambda: jax.block_until_ready(jitted(x)))
    assert once["launches"] == 1 and once["transfers"] == 0
