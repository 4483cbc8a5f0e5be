"""The lab's modes: every mode computes the same numbers as jit (torch op by op and with its
fast path, the functional steps), torch's operators are read without its profiler (no
`USDT:` lines), the compiled torch steps' graphs are counted, and the compile-cost and
variable-length measurements count compilations and say why JAX compiled again
(jax_explain_cache_misses)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.checks import BadValue
from jaxformer_lab.bench import compile_costs, measure, modes, report, workloads

TORCH_COMPILED = {
    "attention": ("torch.compile",),
    "layer": ("torch.compile", "torch.compile max-autotune", "torch.compile reduce-overhead"),
    "forward": ("torch.compile",),
    "train_step": ("torch.compile step", "torch.compile functional step"),
}


def _tiny(name):
    return workloads.build(name, workloads.bench_config(64, 1, vocab=64), batch=2, length=8)


# The train step compiles torch's whole step twice (slow); the quick suite keeps the rest.
@pytest.mark.parametrize(
    "name", [*workloads.WORKLOADS[:-1], pytest.param("train_step", marks=pytest.mark.slow)]
)
def test_every_mode_computes_the_same_values(name):
    pytest.importorskip("torch")
    w = _tiny(name)
    names = modes.modes_of(w, "cpu", TORCH_COMPILED[name])
    assert set(modes.JAX_MODES) | {"torch"} <= set(names)
    assert "torch.compile reduce-overhead" not in names  # CUDA graphs: not on a CPU
    assert ("torch, fast path" in names) != w.stateful
    calls = modes.mode_calls(w, "cpu", names)
    first = {m: [modes.to_numpy(call()), modes.to_numpy(call())] for m, call in calls.items()}
    agree = modes.agreement(first, tolerance=1e-4)
    assert all(a["agrees"] for a in agree.values()), agree
    if w.stateful:  # the second loss is after one Adam step, the same in every mode
        assert first["jit"][1] < first["jit"][0]


@pytest.mark.slow  # two train steps compiled: 15 s of CI's quick suite
def test_the_functional_jax_step_equals_the_nnx_step():
    w = _tiny("train_step")
    calls = modes.mode_calls(w, None, ("jit", "eager, functional"))
    losses = {m: [float(call()) for _ in range(3)] for m, call in calls.items()}
    np.testing.assert_allclose(losses["eager, functional"], losses["jit"], rtol=1e-5)


@pytest.mark.parametrize("name", ["layer", "forward"])  # the module itself; its split state
def test_tree_mode_jit_agrees_with_jit_and_is_timed(name):
    w = _tiny(name)
    assert modes.shares_variables(w.module) == (name == "forward")  # tied embeddings
    assert modes.TREE_JIT in modes.modes_of(w, None)
    ctx = measure.Context(None, rounds=6, repeats=1, dtype="float32", device=None,
                          tolerance=1e-5, say=lambda _: None)  # fmt: skip
    row = measure.measure_workload(ctx, w, ("jit", "nnx.jit", modes.TREE_JIT))
    assert row["agreement"][modes.TREE_JIT]["agrees"], row["agreement"]
    assert len(row["times"][modes.TREE_JIT]) == 6
    assert all(t > 0 for t in row["times"][modes.TREE_JIT])
    ratio = row["ratios"][f"{modes.TREE_JIT} / jit"]
    assert ratio["low"] <= ratio["median"] <= ratio["high"]


@pytest.mark.slow  # three train steps compiled
def test_tree_mode_jit_takes_the_same_adam_steps_as_jit():
    w = _tiny("train_step")  # its Variables are shared: run as the split state, updated
    calls = modes.mode_calls(w, None, ("jit", "nnx.jit", modes.TREE_JIT))
    losses = {m: [float(call()) for _ in range(3)] for m, call in calls.items()}
    assert losses["jit"][2] < losses["jit"][0]  # the updates reach the next call
    for m in ("nnx.jit", modes.TREE_JIT):
        np.testing.assert_allclose(losses[m], losses["jit"], rtol=1e-5)


def test_a_shape_change_is_explained_naming_the_argument():
    f = jax.jit(lambda tokens, scale: tokens * scale)
    before = jax.config.jax_explain_cache_misses
    with compile_costs.explained_misses() as misses:
        f(jnp.ones((2, 3)), 1.0)
        f(jnp.ones((2, 3)), 2.0)  # a hit: no reason
        f(jnp.ones((2, 5)), 1.0)
    assert jax.config.jax_explain_cache_misses == before
    assert logging.getLogger("jax").propagate
    assert [m["reason"] for m in misses] == [
        "never seen function",
        "different input types: at tokens, now f32[2,5] and before f32[2,3]",
    ]
    assert {m["function"] for m in misses} == {"<lambda>"}


def test_a_miss_is_shortened_to_its_clause():
    text = (
        "TRACING CACHE MISS at /a.py:8 (<module>):\n  for step defined at /a.py:7\n"
        "  all previously seen cache keys differ. For the closest previous key:\n"
        "  different input types:\n  * at x, now f32[2,4] and before f32[2,3]"
    )
    reason = "different input types: at x, now f32[2,4] and before f32[2,3]"
    assert compile_costs.miss_reason(text) == {"function": "step", "reason": reason}
    v = {"first": {"jit, exact shapes": {"reasons": [{"length": 4, "reason": reason}]}}}
    assert f"| jit, exact shapes | 4 | {reason} |" in "\n".join(report._recompile_reasons(v))
    assert report._recompile_reasons({"first": {"torch": {}}}) == []  # an earlier run


def test_agreement_flags_a_mode_that_disagrees():
    first = {"jit": [np.ones(3)], "eager": [np.ones(3)], "torch": [np.array([1.0, 1.0, 1.5])]}
    agree = modes.agreement(first, tolerance=1e-4)
    assert agree["eager"] == {"max_abs_diff": 0.0, "agrees": True}
    assert agree["torch"] == {"max_abs_diff": 0.5, "agrees": False}


def test_torch_ops_show_the_fast_path_without_profiler_lines(capfd):
    pytest.importorskip("torch")
    w = _tiny("attention")
    op_by_op = modes.torch_ops(modes.mode_call(w, "cpu", "torch"))
    fused = modes.torch_ops(modes.mode_call(w, "cpu", "torch, fast path"))
    assert modes.attention_ops(fused) == ["aten._native_multi_head_attention"]
    assert "aten._native_multi_head_attention" not in op_by_op
    assert "aten.scaled_dot_product_attention" in op_by_op
    assert sum(op_by_op.values()) > sum(fused.values())
    out, err = capfd.readouterr()
    assert "USDT" not in out + err


@pytest.mark.slow
def test_the_functional_torch_step_is_one_graph():
    pytest.importorskip("torch")
    w = _tiny("train_step")
    graphs = modes.torch_graphs(w, "cpu", ("torch.compile functional step", "torch.compile step"))
    assert graphs["torch.compile functional step"] == {"graphs": 1, "breaks": 0, "reasons": []}
    assert graphs["torch.compile step"]["breaks"] >= 1  # loss.backward() breaks the graph
    assert "backward" in graphs["torch.compile step"]["reasons"][0]


def test_buckets_are_powers_of_two_from_eight():
    assert [compile_costs.bucket(n) for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]


def test_compile_times_read_a_warm_cache_faster_than_they_compile():
    rows = compile_costs.compile_times(
        [dict(d_model=64, layers=1, batch=2, length=8)], repeats=1, dtype="float32"
    )
    t = {k: v["median"] for k, v in rows[0]["times_s"].items()}
    assert set(t) == {"trace + lower", *compile_costs.COMPILE_KEYS.values()}
    assert t["compile, warm cache"] < t["compile, cold cache"] / 2


def test_compile_times_measure_the_caches_a_plan_asks_for():
    point = [dict(d_model=64, layers=1, batch=2, length=8)]
    rows = compile_costs.compile_times(point, repeats=1, dtype="float32", caches=("cold", "warm"))
    assert list(rows[0]["times_s"]) == [
        "trace + lower",
        "compile, cold cache",
        "compile, warm cache",
    ]
    with pytest.raises(BadValue, match="lack 'cold'"):
        compile_costs.compile_times(point, repeats=1, dtype="float32", caches=("warm",))


@pytest.mark.slow  # 50 s of CI's quick suite: three strategies' compilations counted
def test_variable_lengths_count_each_strategys_compilations():
    pytest.importorskip("torch")
    v = compile_costs.variable_lengths(64, 2, [5, 8, 13, 5], repeats=1, rounds=6, device="cpu")
    compiles = {name: f["compiles"][0] for name, f in v["first"].items()}
    assert compiles["jit, exact shapes"] == 3  # 5, 8, 13
    assert compiles["jit, buckets"] == 2  # 8, 16
    assert compiles["jit, pad to longest"] == 1
    assert compiles["torch"] == 0
    assert compiles["torch.compile, static shapes"] == 3
    assert compiles["torch.compile, dynamic shapes"] <= 2
    assert compiles["torch.compile, buckets"] == 2  # a code object of its own: no reuse
    assert v["padded_share"]["jit, pad to longest"] == pytest.approx(1 - 31 / 52)
    assert "jit, buckets / jit, exact shapes" in v["ratios"]
    reasons = {name: f.get("reasons") for name, f in v["first"].items()}
    assert [r["length"] for r in reasons["jit, exact shapes"]] == [5, 8, 13]
    assert reasons["jit, buckets"][1]["reason"].endswith("now f32[2,16,64] and before f32[2,8,64]")
    assert [r["reason"] for r in reasons["jit, pad to longest"]] == ["never seen function"]
    assert reasons["torch"] is None  # dynamo's recompiles are counted, not explained
