import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxformer import functional as F
from tests import reference as ref

E, F_DIM, H = 16, 32, 4


def _attn_params(rng, with_bias=False):
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return F.AttentionParams(
        wq=w(E, H, E // H),
        wk=w(E, H, E // H),
        wv=w(E, H, E // H),
        wo=w(H, E // H, E) / 2,
        bq=w(H, E // H) if with_bias else None,
        bk=None,
        bv=w(H, E // H) if with_bias else None,
        bo=w(E) if with_bias else None,
    )


def _ffn_params(rng, gate=False):
    return F.FeedForwardParams(
        w1=(rng.standard_normal((E, F_DIM)) / 4).astype(np.float32),
        w2=(rng.standard_normal((F_DIM, E)) / 6).astype(np.float32),
        b1=rng.standard_normal(F_DIM).astype(np.float32) * 0.1,
        b2=rng.standard_normal(E).astype(np.float32) * 0.1,
        w_gate=(rng.standard_normal((E, F_DIM)) / 4).astype(np.float32) if gate else None,
    )


def _norm_params(rng):
    return F.NormParams(
        scale=(1 + 0.1 * rng.standard_normal(E)).astype(np.float32),
        bias=(0.1 * rng.standard_normal(E)).astype(np.float32),
    )


def test_layer_norm_and_rms_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, E)).astype(np.float32) * 3 + 1
    p = _norm_params(rng)
    np.testing.assert_allclose(
        F.layer_norm(x, p.scale, p.bias, eps=1e-6),
        ref.layer_norm(x, p.scale, p.bias, 1e-6),
        atol=1e-5,
    )
    rms = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * p.scale
    np.testing.assert_allclose(F.rms_norm(x, p.scale, eps=1e-6), rms, atol=1e-5)
    xb = jnp.asarray(x, jnp.bfloat16)
    assert F.layer_norm(xb, p.scale, p.bias).dtype == jnp.bfloat16


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "swiglu"])
def test_feed_forward(activation):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, E)).astype(np.float32)
    p = _ffn_params(rng, gate=activation == "swiglu")
    out = jax.jit(lambda x, p: F.feed_forward(x, p, activation=activation))(x, p)
    np.testing.assert_allclose(out, ref.ffn(x, p, activation), atol=1e-5, rtol=1e-5)


def test_dropout():
    x = jnp.ones((100, 100))
    assert F.dropout(x, 0.5, None) is x
    y = np.asarray(F.dropout(x, 0.25, jax.random.key(0)))
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.75).item()}
    assert abs((y == 0).mean() - 0.25) < 0.02


def _np_encoder_layer(x, p, mask, placement, eps=1e-6):
    def norm(h, n):
        return ref.layer_norm(h, n.scale, n.bias, eps)

    def sub(h, fn, n):
        return norm(h + fn(h), n) if placement == "post" else h + fn(norm(h, n))

    h = sub(x, lambda z: ref.mha(z, z, p.self_attn, mask), p.norm1)
    return sub(h, lambda z: ref.ffn(z, p.ffn), p.norm2)


@pytest.mark.parametrize("placement", ["post", "pre"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_encoder_layer_matches_reference(placement, jit):
    rng = np.random.default_rng(2)
    p = F.EncoderLayerParams(
        _attn_params(rng, with_bias=True), _ffn_params(rng), _norm_params(rng), _norm_params(rng)
    )
    x = rng.standard_normal((2, 6, E)).astype(np.float32)
    valid = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], bool)
    mask = F.padding_mask(None, valid)
    opts = F.BlockOptions(norm_placement=placement)
    fn = lambda x, p, m: F.encoder_layer(x, p, m, opts)  # noqa: E731
    out = (jax.jit(fn) if jit else fn)(x, p, mask)
    want = _np_encoder_layer(x, p, np.asarray(mask), placement)
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_decoder_layer_matches_reference(placement):
    rng = np.random.default_rng(3)
    p = F.DecoderLayerParams(
        self_attn=_attn_params(rng),
        cross_attn=_attn_params(rng),
        ffn=_ffn_params(rng),
        norm1=_norm_params(rng),
        norm2=_norm_params(rng),
        norm3=_norm_params(rng),
    )
    T, S = 5, 7
    y = rng.standard_normal((2, T, E)).astype(np.float32)
    memory = rng.standard_normal((2, S, E)).astype(np.float32)
    src_valid = np.ones((2, S), bool)
    src_valid[1, 4:] = False
    self_mask = F.causal_mask(T)
    cross_mask = F.padding_mask(None, src_valid)
    opts = F.BlockOptions(norm_placement=placement)
    out = F.decoder_layer(y, p, self_mask, opts, memory=memory, cross_mask=cross_mask).y

    def norm(h, n):
        return ref.layer_norm(h, n.scale, n.bias, 1e-6)

    def sub(h, fn, n):
        return norm(h + fn(h), n) if placement == "post" else h + fn(norm(h, n))

    h = sub(y, lambda z: ref.mha(z, z, p.self_attn, np.asarray(self_mask)), p.norm1)
    h = sub(h, lambda z: ref.mha(z, memory, p.cross_attn, np.asarray(cross_mask)), p.norm2)
    h = sub(h, lambda z: ref.ffn(z, p.ffn), p.norm3)
    np.testing.assert_allclose(out, h, atol=1e-4, rtol=1e-4)


def test_encoder_layer_gradients_match_finite_differences():
    rng = np.random.default_rng(4)
    p = F.EncoderLayerParams(
        _attn_params(rng), _ffn_params(rng), _norm_params(rng), _norm_params(rng)
    )
    x = jnp.asarray(rng.standard_normal((1, 3, E)), jnp.float32)
    opts = F.BlockOptions(activation="gelu")  # smooth, so finite differences are meaningful

    def f(x, wq, w1):
        q = p._replace(self_attn=p.self_attn._replace(wq=wq), ffn=p.ffn._replace(w1=w1))
        return F.encoder_layer(x, q, F.causal_mask(3), opts)

    check_grads(
        f, (x, p.self_attn.wq, p.ffn.w1), order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2
    )


def test_layer_dropout_is_seeded():
    rng = np.random.default_rng(5)
    p = F.EncoderLayerParams(
        _attn_params(rng), _ffn_params(rng), _norm_params(rng), _norm_params(rng)
    )
    x = rng.standard_normal((2, 4, E)).astype(np.float32)
    opts = F.BlockOptions(dropout_rate=0.2, attention_dropout_rate=0.1)
    run = jax.jit(lambda key: F.encoder_layer(x, p, None, opts, rng=key))
    np.testing.assert_array_equal(run(jax.random.key(0)), run(jax.random.key(0)))
    assert not np.allclose(run(jax.random.key(0)), run(jax.random.key(1)))
    no_dropout = F.encoder_layer(x, p, None, opts)
    np.testing.assert_allclose(no_dropout, _np_encoder_layer(x, p, None, "post"), atol=1e-4)


def test_block_options_are_checked():
    with pytest.raises(ValueError, match="norm_placement must be one of"):
        F.BlockOptions(norm_placement="middle")
    with pytest.raises(ValueError, match="dropout_rate must be in"):
        F.BlockOptions(dropout_rate=1.0)
    with pytest.raises(ValueError, match="activation must be one of"):
        F.feed_forward(
            np.zeros((1, E), np.float32), _ffn_params(np.random.default_rng(0)), activation="tanh"
        )
