import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import TransformerConfig, nn
from jaxformer import functional as F
from tests import reference as ref


def test_attention_shapes_axes_and_math():
    mha = nn.MultiHeadAttention(
        24, 6, num_kv_heads=2, key_dim=5, value_dim=7, use_bias=True, rngs=nnx.Rngs(0)
    )
    assert mha.wq.shape == (24, 6, 5)
    assert mha.wk.shape == (24, 2, 5)
    assert mha.wv.shape == (24, 2, 7)
    assert mha.wo.shape == (6, 7, 24)
    assert mha.wq.get_metadata()["out_sharding"] == ("embed", "heads", "kv")
    assert mha.wo.get_metadata()["out_sharding"] == ("heads", "kv", "embed")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 24)).astype(np.float32)
    mem = rng.standard_normal((2, 5, 24)).astype(np.float32)
    p = jax.tree.map(np.asarray, mha.params())
    np.testing.assert_allclose(mha(x).out, ref.mha(x, x, p), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(mha(x, mem).out, ref.mha(x, mem, p), atol=1e-4, rtol=1e-4)
    weights = mha(x, mem, return_weights=True).weights
    assert weights.shape == (2, 6, 3, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


def test_attention_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3"):
        nn.MultiHeadAttention(16, 4, num_kv_heads=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        nn.MultiHeadAttention(10, 4, rngs=nnx.Rngs(0))


def test_attention_dropout_needs_rng():
    mha = nn.MultiHeadAttention(8, 2, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (1, 3, 8))
    with pytest.raises(ValueError, match="deterministic=False needs rng"):
        mha(x, dropout_rate=0.5, deterministic=False)
    np.testing.assert_array_equal(mha(x).out, mha(x).out)
    dropped = mha(x, dropout_rate=0.5, deterministic=False, rng=jax.random.key(0)).out
    assert not np.allclose(dropped, mha(x).out)


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_feed_forward_module(activation):
    ffn = nn.FeedForward(8, 32, gated=activation == "swiglu", rngs=nnx.Rngs(0))
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    p = jax.tree.map(np.asarray, ffn.params())
    np.testing.assert_allclose(ffn(x, activation=activation), ref.ffn(x, p, activation), atol=1e-5)
    assert ffn.w1.get_metadata()["out_sharding"] == ("embed", "mlp")
    assert (activation == "swiglu") == hasattr(ffn, "w_gate")


def test_embed_scales_by_sqrt_d_model_and_ties_output():
    emb = nn.Embed(11, 16, rngs=nnx.Rngs(0))
    tokens = jnp.array([[3, 0, 10]])
    table = np.asarray(emb.table[...])
    np.testing.assert_allclose(emb(tokens), table[[[3, 0, 10]]] * 4.0, rtol=1e-6)
    x = np.random.default_rng(0).standard_normal((1, 2, 16)).astype(np.float32)
    np.testing.assert_allclose(emb.attend(x), x @ table.T, rtol=1e-5, atol=1e-5)
    assert emb.table.get_metadata()["out_sharding"] == ("vocab", "embed")
    with pytest.raises(TypeError, match="tokens must be an integer array"):
        emb(jnp.ones((1, 2)))


def test_layer_modules_call_the_functional_layers():
    c = TransformerConfig.tiny(50, d_model=32, num_heads=4, d_ff=64, norm_placement="pre")
    layer = nn.DecoderLayer(c, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(2)
    y = rng.standard_normal((2, 4, 32)).astype(np.float32)
    mem = rng.standard_normal((2, 6, 32)).astype(np.float32)
    out = layer(y, F.causal_mask(4), memory=mem)
    want = F.decoder_layer(y, layer.params(), F.causal_mask(4), c.block_options(), memory=mem)
    np.testing.assert_array_equal(out.y, want.y)
    assert out.cross_weights is None and out.cache is None
    lm_layer = nn.DecoderLayer(c, cross_attention=False, rngs=nnx.Rngs(0))
    assert not hasattr(lm_layer, "cross_attn")
    assert lm_layer(y, F.causal_mask(4)).y.shape == (2, 4, 32)


def test_options_live_in_the_module_whose_call_reads_them():
    """A layer holds its BlockOptions; its attention, feed-forward and norm modules hold
    parameters only, so no nested option can disagree with the one the call uses."""
    c = TransformerConfig.tiny(50, d_model=32, num_heads=4, d_ff=64, activation="swiglu")
    layer = nn.EncoderLayer(c, rngs=nnx.Rngs(0))
    assert layer.opts == c.block_options()
    options = {"dropout_rate", "attention_impl", "activation", "opts", "kind", "eps"}
    for sub in (layer.self_attn, layer.ffn, layer.norm1, layer.norm2):
        assert not options & set(vars(sub)), (type(sub).__name__, options & set(vars(sub)))
    assert layer.ffn.gated and layer.norm1.use_bias


def test_bfloat16_compute_keeps_float32_params():
    c = TransformerConfig.tiny(50, d_model=32, num_heads=4, d_ff=64, dtype="bfloat16")
    layer = nn.EncoderLayer(c, rngs=nnx.Rngs(0))
    assert layer.self_attn.wq[...].dtype == jnp.float32
    out = layer(jnp.ones((1, 3, 32), jnp.bfloat16))
    assert out.dtype == jnp.bfloat16
