"""JAX's splash attention behind ATTENTION ("splash"): its numerics in Pallas interpret mode
against "xla", the calls it refuses, its TPU lowering, and its shard_map under a mesh."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from jaxformer import functional as F
from jaxformer.accelerators import StandInDevice
from jaxformer.checks import BadType, BadValue
from jaxformer.functional import splash


def _qkv(B=2, T=256, S=256, H=4, K=2, D=64, Dv=None, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (B, T, H, D), dtype)
    k = jax.random.normal(keys[1], (B, S, K, D), dtype)
    v = jax.random.normal(keys[2], (B, S, K, Dv or D), dtype)
    return q, k, v


def _value_and_grads(implementation, q, k, v, **kw):
    def loss(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, implementation=implementation, **kw)
        return jnp.sum(jnp.sin(out.astype(jnp.float32))), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


def _valid(T, S):
    """Validity vectors for two rows: row 0 with holes in both, row 1 without any key."""
    q_valid = jnp.arange(T)[None, :] < jnp.array([[T - 56], [T]])
    k_valid = (jnp.arange(S)[None, :] % 3 != 1) & (jnp.arange(2)[:, None] == 0)
    return dict(q_valid=q_valid, k_valid=k_valid)


LENGTHS = dict(causal=True, k_lengths=jnp.array([100, 0], jnp.int32))  # row 1: no key
CASES = {
    "full": ({}, {}),
    "causal_three_tiles": (dict(T=384, S=384), dict(causal=True)),
    "causal_lengths": ({}, LENGTHS),
    "validity_vectors": ({}, _valid(256, 256)),
    "multi_query": (dict(K=1), dict(causal=True)),
    "cross_dk16_dv64": (
        dict(T=128, S=384, D=16, Dv=64),
        dict(k_lengths=jnp.array([300, 0], jnp.int32)),
    ),
    "scale": (dict(K=4), dict(causal=True, scale=0.3)),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_equals_xla_in_float32(case):
    shapes, kw = CASES[case]
    q, k, v = _qkv(**shapes)
    want = F.scaled_dot_product_attention(q, k, v, implementation="xla", **kw)
    got = F.scaled_dot_product_attention(q, k, v, implementation="splash", **kw)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    if "k_lengths" in kw or "k_valid" in kw:  # row 1 without keys gives zeros
        np.testing.assert_array_equal(got[1], 0.0)


@pytest.mark.parametrize("case", ["causal_lengths", "validity_vectors", "multi_query"])
def test_gradients_equal_xla_in_float32(case):
    shapes, kw = CASES[case]
    q, k, v = _qkv(**shapes)
    want_out, want_grads = _value_and_grads("xla", q, k, v, **kw)
    out, grads = _value_and_grads("splash", q, k, v, **kw)
    np.testing.assert_allclose(out, want_out, atol=1e-5, rtol=1e-5)
    for name, got, want in zip("qkv", grads, want_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_bfloat16_values_and_gradients_are_close_to_xla():
    """bfloat16 operands round differently in the two (splash scales q before its product):
    errors up to 2% of the largest magnitude, gradients included."""
    q, k, v = _qkv(dtype=jnp.bfloat16, seed=1)
    want_out, want_grads = _value_and_grads("xla", q, k, v, **LENGTHS)
    out, grads = _value_and_grads("splash", q, k, v, **LENGTHS)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    pairs = zip(["out", "dq", "dk", "dv"], (out, *grads), (want_out, *want_grads), strict=True)
    for name, got, want in pairs:
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), name
    np.testing.assert_array_equal(np.asarray(out[1], np.float32), 0.0)


REFUSED = {
    "dropout": (
        dict(dropout_rate=0.1, dropout_rng=jax.random.key(0)),
        BadValue,
        "has no attention dropout",
    ),
    "dense_mask": (dict(mask=jnp.ones((256, 256), bool)), BadValue, "takes no dense mask"),
    "bias": (dict(bias=jnp.zeros((256, 256))), BadValue, "takes no bias"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_calls_say_why_in_one_line(case):
    kw, error, words = REFUSED[case]
    q, k, v = _qkv(B=1, H=2, K=1, D=8)
    with pytest.raises(error, match=rf"^implementation='splash' {words}.*use implementation='xla'"):
        F.scaled_dot_product_attention(q, k, v, implementation="splash", **kw)


def test_refused_dtypes_lengths_and_devices(monkeypatch):
    q, k, v = _qkv(B=1, T=100, S=256, H=2, K=1, D=8)
    with pytest.raises(BadValue, match="lengths that are multiples of 128, got T=100, S=256"):
        F.scaled_dot_product_attention(q, k, v, implementation="splash")
    q16, k16, v16 = _qkv(B=1, H=2, K=1, D=8, dtype=jnp.float16)
    with pytest.raises(BadType, match=r"all float32 or all bfloat16, got \['float16'\]"):
        F.scaled_dot_product_attention(q16, k16, v16, implementation="splash")
    assert splash.splash_problem(q16.astype(jnp.bfloat16), k16, v16)[0] is BadType  # mixed
    assert splash.splash_problem(q16, k16, v16.astype(jnp.float32))[0] is BadType
    ok = _qkv(B=1, H=2, K=1, D=8)
    assert splash.splash_problem(*ok, padded=True) is None  # lengths are segment ids
    with jax.default_device(StandInDevice("gpu", "NVIDIA H100 80GB HBM3", "9.0")):
        assert splash.splash_problem(*ok)[1].startswith("needs a TPU")
        monkeypatch.setattr(splash, "INTERPRET", True)
        assert splash.splash_problem(*ok) is None


def test_interpret_mode_follows_the_backend_unless_set(monkeypatch):
    assert splash.interpret() == (jax.default_backend() == "cpu")
    monkeypatch.setattr(splash, "INTERPRET", False)
    assert not splash.interpret()


def test_forward_and_gradient_lower_to_the_tpu_kernel(monkeypatch):
    """Compiled (not interpreted), the forward is one Mosaic call and the gradient three:
    the forward keeping its residuals, dq, and dk with dv."""
    monkeypatch.setattr(splash, "INTERPRET", False)
    q, k, v = _qkv(D=128, dtype=jnp.bfloat16)

    def forward(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **LENGTHS, implementation="splash")

    def grads(q, k, v):
        return jax.grad(lambda *a: forward(*a).astype(jnp.float32).sum(), (0, 1, 2))(q, k, v)

    texts = [
        jax.export.export(jax.jit(f), platforms=["tpu"])(q, k, v).mlir_module()
        for f in (forward, grads)
    ]
    calls = [re.findall(r"custom_call @tpu_custom_call", text) for text in texts]
    assert [len(c) for c in calls] == [1, 3]
    assert "splash_mha_fwd_segmented_no_residuals" in texts[0]
    for kernel in ("fwd_segmented_residuals", "dq_segmented", "dkv_segmented"):
        assert f"splash_mha_{kernel}" in texts[1]


def test_packed_documents_reach_the_tpu_kernel_as_segment_ids(monkeypatch):
    """Lowered for a TPU, packed rows run splash's segmented kernels, forward and backward,
    and the program holds no boolean [T, S] array: the documents travel as ids."""
    monkeypatch.setattr(splash, "INTERPRET", False)
    q, k, v = _qkv(D=128, dtype=jnp.bfloat16)
    seg = jnp.stack([jnp.repeat(jnp.arange(1, 5), 64), jnp.repeat(jnp.array([3, 0]), 128)])
    kw = dict(causal=True, q_segments=seg, k_segments=seg, implementation="splash")

    def grads(q, k, v):
        total = lambda *a: F.scaled_dot_product_attention(*a, **kw).astype(jnp.float32).sum()  # noqa: E731
        return jax.grad(total, (0, 1, 2))(q, k, v)

    text = jax.export.export(jax.jit(grads), platforms=["tpu"])(q, k, v).mlir_module()
    for kernel in ("fwd_segmented_residuals", "dq_segmented", "dkv_segmented"):
        assert f"splash_mha_{kernel}" in text
    assert "256x256xi1>" not in text


@pytest.mark.devices(8)
@pytest.mark.parametrize(
    "axis_type, B, K, specs",
    [
        (AxisType.Auto, 4, 2, "P(('data', 'fsdp'), None, 'tensor', None)"),  # rows and heads
        (AxisType.Explicit, 2, 1, "P('data', None, None, None)"),  # B = 2, one key head
    ],
)
def test_under_a_mesh_it_runs_in_shard_map_and_gives_the_same(axis_type, B, K, specs):
    q, k, v = _qkv(B=B, K=K)
    kw = dict(causal=True, k_lengths=jnp.arange(B, dtype=jnp.int32) * 70)
    step = jax.jit(lambda q, k, v: _value_and_grads("splash", q, k, v, **kw))
    want = step(q, k, v)
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)
    with jax.set_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(step)(q, k, v))
        got = step(q, k, v)
    assert "shard_map" in jaxpr and specs in jaxpr
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-6)
