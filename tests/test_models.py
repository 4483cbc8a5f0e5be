import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

import jaxformer as jf

V = 37


def small(**overrides):
    fields = dict(
        num_encoder_layers=2, num_decoder_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=32
    )
    return jf.TransformerConfig(vocab_size=V, **(fields | overrides))


VARIANTS = {
    "paper": {},
    "pre_ln_rms_swiglu": dict(norm_placement="pre", norm="rms", activation="swiglu"),
    "gqa_rope": dict(num_kv_heads=2, position_embedding="rope"),
    "learned_unshared": dict(position_embedding="learned", share_embeddings=False),
    "dk_dv": dict(d_k=5, d_v=7, attention_bias=True),
    "hf_options": dict(  # what Marian, BART and GPT-2 need (see jaxformer.interop.hf)
        position_embedding="sinusoidal_halves",
        embed_scale=False,
        embed_norm=True,
        logits_bias=True,
        activation="gelu_tanh",
    ),
}

_MODELS = {}


def model(kind, variant="paper"):
    """Models are built once per (kind, variant) and shared by the tests."""
    key = (kind, variant)
    if key not in _MODELS:
        cls = {"transformer": jf.Transformer, "lm": jf.DecoderLM, "encoder": jf.Encoder}[kind]
        _MODELS[key] = cls(small(**VARIANTS[variant]), rngs=nnx.Rngs(0))
    return _MODELS[key]


def jitted(m):
    """m's forward pass under jit (compiled once per input shape)."""
    graphdef, state = nnx.split(m)
    fn = jax.jit(lambda state, *args, **kw: nnx.merge(graphdef, state)(*args, **kw))
    return lambda *args, **kw: fn(state, *args, **kw)


def tokens(seed, B, T):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (B, T)), jnp.int32)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_shapes_and_jit_equals_eager(variant):
    src, tgt = tokens(0, 2, 7), tokens(1, 2, 5)
    t = model("transformer", variant)
    logits = t(src, tgt)
    assert logits.shape == (2, 5, V) and logits.dtype == jnp.float32
    graphdef, state = nnx.split(t)
    jitted = jax.jit(lambda s, a, b: nnx.merge(graphdef, s)(a, b))(state, src, tgt)
    np.testing.assert_allclose(jitted, logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(t.decode(tgt, t.encode(src)), logits)
    assert model("lm", variant)(tgt).shape == (2, 5, V)
    assert model("encoder", variant)(src).shape == (2, 7, 32)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_property_decoder_is_causal(variant):
    """Changing tokens at positions >= t leaves the logits before t bit-identical."""
    T = 8
    lm, tr = jitted(model("lm", variant)), jitted(model("transformer", variant))

    @given(t=st.integers(1, T - 1), seed=st.integers(0, 2**16))
    def check(t, seed):
        a = tokens(seed, 2, T)
        b = a.at[:, t:].set(tokens(seed + 1, 2, T - t))
        np.testing.assert_array_equal(lm(a)[:, :t], lm(b)[:, :t])
        src = tokens(seed + 2, 2, 6)
        np.testing.assert_array_equal(tr(src, a)[:, :t], tr(src, b)[:, :t])

    check()


def test_causality_through_gradients():
    """d output[t] / d input[s] is exactly zero for every s > t."""
    stack = model("lm").decoder
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 6, 32)), jnp.float32)
    mask = jf.functional.causal_mask(6)
    jac = jax.jacrev(lambda x: stack(x, mask).y)(x)  # [1, 6, 32, 1, 6, 32]
    per_pair = np.abs(np.asarray(jac)).sum(axis=(0, 2, 3, 5))  # [t, s]
    assert (per_pair[np.triu_indices(6, k=1)] == 0).all()
    assert (per_pair[np.tril_indices(6)] > 0).all()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_property_source_padding_does_not_change_logits(variant):
    """Appending pad positions (any token ids, valid=False) to the source changes no logit."""
    tr = jitted(model("transformer", variant))

    @given(extra=st.sampled_from([1, 5]), seed=st.integers(0, 2**16))
    def check(extra, seed):
        src, tgt = tokens(seed, 2, 6), tokens(seed + 1, 2, 4)
        base = tr(src, tgt)
        padded = jnp.concatenate([src, tokens(seed + 2, 2, extra)], axis=1)
        valid = jnp.broadcast_to(jnp.arange(6 + extra) < 6, (2, 6 + extra))
        np.testing.assert_allclose(tr(padded, tgt, src_valid=valid), base, atol=1e-5, rtol=1e-5)

    check()


def test_target_and_lm_padding_do_not_change_real_logits():
    lm, tr = model("lm"), model("transformer")
    x = tokens(3, 2, 5)
    padded = jnp.concatenate([x, tokens(4, 2, 3)], axis=1)
    valid = jnp.broadcast_to(jnp.arange(8) < 5, (2, 8))
    np.testing.assert_allclose(lm(padded, valid)[:, :5], lm(x), atol=1e-5, rtol=1e-5)
    src = tokens(5, 2, 4)
    np.testing.assert_allclose(
        tr(src, padded, tgt_valid=valid)[:, :5], tr(src, x), atol=1e-5, rtol=1e-5
    )


def test_padding_must_be_right_padding():
    """The models pass padding to attention as lengths: a valid mask that is not a prefix
    of each row is refused where its values are known."""
    left_padded = jnp.array([[False, True, True, True, True], [True] * 5])
    with pytest.raises(ValueError, match="valid must mark a prefix of each row"):
        model("lm")(tokens(0, 2, 5), left_padded)
    with pytest.raises(ValueError, match="src_valid must mark a prefix of each row"):
        model("transformer")(tokens(0, 2, 5), tokens(1, 2, 5), left_padded)


def test_property_encoder_without_positions_is_permutation_equivariant():
    enc = jitted(jf.Encoder(small(position_embedding="none"), rngs=nnx.Rngs(1)))

    @given(seed=st.integers(0, 2**16))
    def check(seed):
        x = tokens(seed, 1, 6)
        perm = np.random.default_rng(seed).permutation(6)
        np.testing.assert_allclose(enc(x[:, perm]), np.asarray(enc(x))[:, perm], atol=1e-5)

    check()


def test_packed_lm_rows_equal_separate_rows():
    lm = model("lm", "gqa_rope")
    a, b = tokens(6, 1, 3), tokens(7, 1, 4)
    packed = jnp.concatenate([a, b], axis=1)
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 2]])
    pos = jnp.array([[0, 1, 2, 0, 1, 2, 3]])
    out = lm(packed, positions=pos, segment_ids=seg)
    np.testing.assert_allclose(out[:, :3], lm(a), atol=1e-5)
    np.testing.assert_allclose(out[:, 3:], lm(b), atol=1e-5)


def test_dropout_only_when_asked_and_seeded():
    tr = jf.Transformer(small(dropout_rate=0.3), rngs=nnx.Rngs(0))
    src, tgt = tokens(8, 2, 6), tokens(9, 2, 5)
    np.testing.assert_array_equal(tr(src, tgt), tr(src, tgt))
    with pytest.raises(ValueError, match="deterministic=False needs rng"):
        tr(src, tgt, deterministic=False)
    a = tr(src, tgt, deterministic=False, rng=jax.random.key(0))
    b = tr(src, tgt, deterministic=False, rng=jax.random.key(0))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, tr(src, tgt))


def test_bfloat16_compute_is_close_to_float32():
    f32 = jf.Transformer(small(), rngs=nnx.Rngs(0))
    bf16 = jf.Transformer(small(dtype="bfloat16"), rngs=nnx.Rngs(0))
    src, tgt = tokens(10, 2, 6), tokens(11, 2, 5)
    a, b = f32(src, tgt), bf16(src, tgt)
    assert b.dtype == jnp.float32 and np.isfinite(np.asarray(b)).all()
    assert np.corrcoef(np.asarray(a).ravel(), np.asarray(b).ravel())[0, 1] > 0.99


def test_count_params_matches_the_formula():
    c = small()
    E, Fd, N = c.d_model, c.d_ff, 2
    ffn = 2 * E * Fd + Fd + E
    enc_layer = 4 * E * E + ffn + 2 * 2 * E
    dec_layer = 8 * E * E + ffn + 3 * 2 * E
    assert jf.count_params(jf.Transformer(c, rngs=nnx.Rngs(0))) == V * E + N * (
        enc_layer + dec_layer
    )
    assert jf.count_params(jf.DecoderLM(c, rngs=nnx.Rngs(0))) == V * E + N * (enc_layer)
    unshared = jf.Transformer(small(share_embeddings=False), rngs=nnx.Rngs(0))
    assert jf.count_params(unshared) == 3 * V * E + N * (enc_layer + dec_layer)
    # A norm after each stack's embeddings (scale and bias) and a bias on the logits.
    extras = jf.Transformer(small(embed_norm=True, logits_bias=True), rngs=nnx.Rngs(0))
    assert jf.count_params(extras) == V * E + N * (enc_layer + dec_layer) + 2 * 2 * E + V


@pytest.mark.parametrize(
    "call,error,match",
    [
        (
            lambda t: t(jnp.ones((2, 5)), tokens(0, 2, 3)),
            TypeError,
            "src_tokens must be an integer",
        ),
        (
            lambda t: t(tokens(0, 2, 5)[0], tokens(0, 2, 3)),
            ValueError,
            "src_tokens must have rank 2",
        ),
        (lambda t: t(tokens(0, 2, 5), tokens(0, 3, 3)), ValueError, "batch"),
        (lambda t: t(tokens(0, 2, 40), tokens(0, 2, 3)), ValueError, "length 40 > max_len=32"),
        (
            lambda t: t(tokens(0, 2, 5), tokens(0, 2, 3), src_valid=jnp.ones((2, 4), bool)),
            ValueError,
            r"src_valid shape \(2, 4\) != src_tokens shape \(2, 5\)",
        ),
        (
            lambda t: t(tokens(0, 2, 5), tokens(0, 2, 3), src_valid=jnp.ones((2, 5))),
            TypeError,
            "src_valid must be a boolean array",
        ),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call(model("transformer"))


def test_models_need_layers():
    with pytest.raises(ValueError, match="num_encoder_layers >= 1"):
        jf.Transformer(small(num_encoder_layers=0), rngs=nnx.Rngs(0))
    assert jf.DecoderLM(small(num_encoder_layers=0), rngs=nnx.Rngs(0)) is not None
    with pytest.raises(TypeError, match="config must be a TransformerConfig"):
        jf.Encoder({"vocab_size": 3}, rngs=nnx.Rngs(0))


@pytest.mark.slow  # test_capture checks the same weights against the capture in the quick suite
def test_cross_attention_weights_are_returned():
    tr = model("transformer")
    src, tgt = tokens(12, 2, 6), tokens(13, 2, 4)
    valid = jnp.broadcast_to(jnp.arange(6) < 4, (2, 6))
    weights = tr.cross_attention_weights(src, tgt, valid)
    assert weights.shape == (2, 2, 4, 4, 6)  # [L, B, H, T, S]
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert (weights[..., 4:] == 0).all()  # padded source positions get no attention
