import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.test_util import check_grads

from jaxformer import functional as F
from tests import reference as ref

# (B, T, S, H, K, D, Dv): multi-head, grouped-query, multi-query, T != S, Dv != D.
SHAPES = [
    (2, 5, 5, 4, 4, 8, 8),
    (1, 3, 7, 6, 2, 4, 4),
    (3, 4, 6, 8, 1, 8, 16),
    (2, 1, 9, 2, 2, 16, 4),
]


def _qkv(rng, B, T, S, H, K, D, Dv, dtype=np.float32):
    q = rng.standard_normal((B, T, H, D)).astype(dtype)
    k = rng.standard_normal((B, S, K, D)).astype(dtype)
    v = rng.standard_normal((B, S, K, Dv)).astype(dtype)
    return q, k, v


def _run(jit, fn, *args, **kwargs):
    if jit:
        return jax.jit(lambda *a: fn(*a, **kwargs))(*args)
    return fn(*args, **kwargs)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_numpy_reference(shape, jit):
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, *shape)
    out = _run(jit, F.scaled_dot_product_attention, q, k, v)
    w = _run(jit, F.attention_weights, q, k)
    want_out, want_w = ref.attention(q, k, v)
    np.testing.assert_allclose(out, want_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(w, want_w, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape", SHAPES)
def test_padding_and_causal_masks(shape, jit):
    B, T, S, H, K, D, Dv = shape
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, *shape)
    k_valid = rng.random((B, S)) < 0.7
    k_valid[:, 0] = True
    q_valid = rng.random((B, T)) < 0.8
    mask = F.combine_masks(F.padding_mask(q_valid, k_valid), F.causal_mask(T, S))
    out = _run(jit, F.scaled_dot_product_attention, q, k, v, mask)
    want, _ = ref.attention(q, k, v, np.asarray(mask))
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
    # causal=True is the same as passing the causal mask.
    out2 = _run(
        jit, F.scaled_dot_product_attention, q, k, v, F.padding_mask(q_valid, k_valid), causal=True
    )
    np.testing.assert_array_equal(out, out2)


def test_bias_scale_and_per_head_mask():
    B, T, S, H, K, D, Dv = 2, 4, 5, 4, 2, 8, 8
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, B, T, S, H, K, D, Dv)
    bias = rng.standard_normal((1, H, T, S)).astype(np.float32)
    mask = rng.random((B, H, T, S)) < 0.6
    out = F.scaled_dot_product_attention(q, k, v, mask, bias=bias, scale=0.3)
    w = F.attention_weights(q, k, mask, bias=bias, scale=0.3)
    want, want_w = ref.attention(q, k, v, mask, bias=bias, scale=0.3)
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(w, want_w, atol=1e-6)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    B, T, S, H, D = 2, 3, 4, 2, 8
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, B, T, S, H, H, D, D)
    mask = np.ones((B, 1, T, S), bool)
    mask[0, :, 1, :] = False  # query 1 of batch 0 sees nothing
    out = F.scaled_dot_product_attention(q, k, v, mask)
    w = F.attention_weights(q, k, mask)
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(w[0, :, 1], 0.0)

    def loss(q, k, v):
        return jnp.sum(F.scaled_dot_product_attention(q, k, v, mask) ** 2)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(grads[0][0, 1], 0.0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_huge_logits_stay_finite(dtype):
    """Logits of magnitude ~1e4, bf16 inputs, a fully masked row: no NaN or inf anywhere."""
    B, T, S, H, D = 1, 4, 6, 2, 4
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 100, dtype)
    k = jnp.asarray(rng.standard_normal((B, S, H, D)) * 100, dtype)
    v = jnp.asarray(rng.standard_normal((B, S, H, D)), dtype)
    mask = np.tril(np.ones((T, S), bool))
    mask[2] = False

    def loss(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, mask)
        return jnp.sum(out.astype(jnp.float32))

    out = F.scaled_dot_product_attention(q, k, v, mask)
    assert out.dtype == dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    for g in jax.grad(loss, argnums=(0, 1, 2))(q, k, v):
        assert np.isfinite(np.asarray(g, np.float32)).all()


def test_bfloat16_close_to_float32():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 2, 8, 8, 4, 4, 16, 16)
    out32 = F.scaled_dot_product_attention(q, k, v, causal=True)
    out16 = F.scaled_dot_product_attention(
        *(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)), causal=True
    )
    np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2)


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(6)
    q, k, v = (jnp.asarray(a, jnp.float32) for a in _qkv(rng, 1, 3, 4, 4, 2, 4, 4))
    mask = F.causal_mask(3, 4, offset=1)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, mask)

    check_grads(f, (q, k, v), order=1, modes=["fwd", "rev"], atol=1e-2, rtol=1e-2, eps=1e-3)


def test_dropout_is_seeded_and_unbiased():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 1, 4, 4, 2, 2, 8, 8)
    plain = F.scaled_dot_product_attention(q, k, v)
    attend = jax.jit(
        lambda key: F.scaled_dot_product_attention(q, k, v, dropout_rate=0.3, dropout_rng=key)
    )
    a, b = attend(jax.random.key(0)), attend(jax.random.key(0))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, attend(jax.random.key(1)))
    mean = jnp.mean(jax.vmap(attend)(jax.random.split(jax.random.key(2), 4000)), axis=0)
    np.testing.assert_allclose(mean, plain, atol=0.1)
    with pytest.raises(ValueError, match="dropout_rng"):
        F.scaled_dot_product_attention(q, k, v, dropout_rate=0.1)


@given(
    B=st.integers(1, 3),
    T=st.integers(1, 6),
    S=st.integers(1, 6),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4)]),
    seed=st.integers(0, 2**16),
)
def test_property_weights_sum_to_one_over_attended_keys(B, T, S, heads, seed):
    H, K = heads
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, B, T, S, H, K, 4, 4)
    mask = rng.random((B, 1, T, S)) < 0.6
    w = np.asarray(F.attention_weights(q, k, mask))
    row_has_key = np.broadcast_to(mask.any(-1), w.shape[:-1])
    sums = w.sum(-1)
    np.testing.assert_allclose(sums[row_has_key], 1.0, atol=1e-5)
    np.testing.assert_array_equal(sums[~row_has_key], 0.0)
    assert (w[~np.broadcast_to(mask, w.shape)] == 0).all()


@given(T=st.integers(2, 8), seed=st.integers(0, 2**16))
def test_property_self_attention_is_permutation_equivariant(T, seed):
    """Without positions, permuting the inputs permutes the outputs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, T, 2, 4)).astype(np.float32)
    perm = rng.permutation(T)
    out = F.scaled_dot_product_attention(x, x, x)
    out_perm = F.scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm])
    np.testing.assert_allclose(out_perm, np.asarray(out)[:, perm], atol=1e-5)


def test_multi_head_attention_matches_reference():
    rng = np.random.default_rng(8)
    B, T, S, E, H, K, Dk, Dv = 2, 4, 6, 16, 4, 2, 8, 5
    p = F.AttentionParams(
        wq=rng.standard_normal((E, H, Dk)).astype(np.float32) * 0.3,
        wk=rng.standard_normal((E, K, Dk)).astype(np.float32) * 0.3,
        wv=rng.standard_normal((E, K, Dv)).astype(np.float32) * 0.3,
        wo=rng.standard_normal((H, Dv, E)).astype(np.float32) * 0.3,
        bq=rng.standard_normal((H, Dk)).astype(np.float32),
        bk=rng.standard_normal((K, Dk)).astype(np.float32),
        bv=rng.standard_normal((K, Dv)).astype(np.float32),
        bo=rng.standard_normal((E,)).astype(np.float32),
    )
    xq = rng.standard_normal((B, T, E)).astype(np.float32)
    xkv = rng.standard_normal((B, S, E)).astype(np.float32)
    mask = F.padding_mask(None, rng.random((B, S)) < 0.8)
    out = jax.jit(F.multi_head_attention)(xq, xkv, p, mask).out
    np.testing.assert_allclose(out, ref.mha(xq, xkv, p, np.asarray(mask)), atol=1e-4, rtol=1e-4)


BAD = [
    ("q must have rank 4", dict(q=np.zeros((2, 3, 4)))),
    ("q head dim D=8 .* != k head dim 4", dict(k=np.zeros((2, 5, 2, 4), np.float32))),
    (
        "query heads H=4 is not divisible by key/value heads K=3",
        dict(k=np.zeros((2, 5, 3, 8), np.float32), v=np.zeros((2, 5, 3, 8), np.float32)),
    ),
    ("v shape .* must match k", dict(v=np.zeros((2, 6, 2, 8), np.float32))),
    ("batch sizes differ", dict(k=np.zeros((1, 5, 2, 8), np.float32))),
    ("mask of shape .* not broadcastable", dict(mask=np.ones((2, 4, 3, 4), bool))),
    ("q must be a floating-point array", dict(q=np.zeros((2, 3, 4, 8), np.int32))),
]


@pytest.mark.parametrize("match,change", BAD, ids=[b[0][:24] for b in BAD])
def test_bad_input_is_named(match, change):
    args = (
        dict(
            q=np.zeros((2, 3, 4, 8), np.float32),
            k=np.zeros((2, 5, 2, 8), np.float32),
            v=np.zeros((2, 5, 2, 8), np.float32),
            mask=None,
        )
        | change
    )
    with pytest.raises((ValueError, TypeError), match=match):
        jax.jit(F.scaled_dot_product_attention)(**args)


def test_mask_must_be_boolean():
    q = np.zeros((1, 2, 1, 4), np.float32)
    with pytest.raises(TypeError, match="mask must be a boolean array"):
        F.scaled_dot_product_attention(q, q, q, np.ones((2, 2), np.int32))
