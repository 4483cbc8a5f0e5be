"""The KV cache in the functional core: writing, cached self-attention fed in pieces with
per-row offsets, cross-attention over projected memory, and a cached decoder layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import functional as F
from tests import reference as ref

E, H, K, D, Dv = 16, 4, 2, 6, 5


def _params(rng):
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return F.AttentionParams(wq=w(E, H, D), wk=w(E, K, D), wv=w(E, K, Dv), wo=w(H, Dv, E))


def _empty(B, S_max):
    return F.KVCache(jnp.zeros((B, S_max, K, D)), jnp.zeros((B, S_max, K, Dv)))


def test_write_kv_matches_numpy():
    rng = np.random.default_rng(0)
    cache = F.KVCache(*(rng.standard_normal((3, 9, K, d)).astype(np.float32) for d in (D, Dv)))
    new = F.KVCache(*(rng.standard_normal((3, 2, K, d)).astype(np.float32) for d in (D, Dv)))
    positions = np.array([[0, 1], [4, 5], [7, 8]])
    got = jax.jit(F.write_kv)(cache, new, positions)
    for got_x, old, add in zip(got, cache, new, strict=True):
        want = old.copy()
        for b in range(3):
            want[b, positions[b]] = add[b]
        np.testing.assert_array_equal(got_x, want)


@pytest.mark.parametrize("rope", [False, True])
def test_cached_self_attention_in_pieces_equals_full_causal_attention(rope):
    """Rows of real lengths 2 and 4 (a padded prefill of 4), then single tokens: each row's
    outputs equal causal attention over its own unpadded sequence."""
    rng = np.random.default_rng(1)
    p = _params(rng)
    lengths, extra, S_max = np.array([2, 4]), 3, 8
    seqs = rng.standard_normal((2, 4 + extra, E)).astype(np.float32)  # row b: seqs[b, :len+extra]

    def full(b):
        x = seqs[b : b + 1, : lengths[b] + extra]
        T = x.shape[1]
        if not rope:
            return ref.mha(x, x, p, np.asarray(F.causal_mask(T)))[0]
        pos = np.arange(T)[None]
        return F.multi_head_attention(x, x, p, F.causal_mask(T), rope_positions=(pos, pos)).out[0]

    def cached(x, cache, offsets):
        T = x.shape[1]
        positions = offsets[:, None] + jnp.arange(T)[None, :]
        mask = F.causal_mask(T, S_max, offset=offsets[:, None, None, None])
        return F.multi_head_attention(
            x,
            x,
            p,
            mask,
            rope_positions=(positions, positions) if rope else None,
            kv_cache=cache,
            cache_positions=positions,
        )[::2]  # out, kv_cache

    out, cache = jax.jit(cached)(seqs[:, :4], _empty(2, S_max), jnp.zeros(2, jnp.int32))
    outs = [[out[b, : lengths[b]]] for b in range(2)]
    for t in range(extra):
        step_in = seqs[np.arange(2), lengths + t][:, None]
        out, cache = jax.jit(cached)(step_in, cache, jnp.asarray(lengths + t))
        for b in range(2):
            outs[b].append(out[b])
    for b in range(2):
        got = np.concatenate([np.reshape(o, (-1, E)) for o in outs[b]])
        np.testing.assert_allclose(got, full(b), atol=1e-5, rtol=1e-5)


def test_cross_attention_over_projected_memory_matches_reference():
    rng = np.random.default_rng(2)
    p = _params(rng)
    x = rng.standard_normal((2, 3, E)).astype(np.float32)
    memory = rng.standard_normal((2, 5, E)).astype(np.float32)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    mask = F.padding_mask(None, valid)
    out, weights, kv = F.multi_head_attention(x, None, p, mask, kv_cache=F.project_kv(memory, p))
    assert weights is None
    np.testing.assert_allclose(out, ref.mha(x, memory, p, np.asarray(mask)), atol=1e-5)
    np.testing.assert_allclose(kv.v, np.einsum("bse,ekd->bskd", memory, p.wv), atol=1e-6)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_cached_decoder_layer_equals_the_full_layer(placement):
    rng = np.random.default_rng(3)

    def norm():
        return F.NormParams(
            (1 + 0.1 * rng.standard_normal(E)).astype(np.float32),
            (0.1 * rng.standard_normal(E)).astype(np.float32),
        )

    ffn = F.FeedForwardParams(
        w1=(rng.standard_normal((E, 24)) / 4).astype(np.float32),
        w2=(rng.standard_normal((24, E)) / 5).astype(np.float32),
    )
    p = F.DecoderLayerParams(_params(rng), _params(rng), ffn, norm(), norm(), norm())
    opts = F.BlockOptions(norm_placement=placement)
    T, S = 5, 4
    y = rng.standard_normal((2, T, E)).astype(np.float32)
    memory = rng.standard_normal((2, S, E)).astype(np.float32)
    cross_mask = F.padding_mask(None, np.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool))
    want, want_weights, no_cache = F.decoder_layer(
        y,
        p,
        F.causal_mask(T),
        opts,
        memory=memory,
        cross_mask=cross_mask,
        return_cross_attention=True,
    )
    assert no_cache is None

    cache = F.decoder_layer_cache(p, 2, T, jnp.float32, memory=memory)
    for start, stop in ((0, 2), (2, 3), (3, 5)):
        positions = jnp.broadcast_to(jnp.arange(start, stop), (2, stop - start))
        got, weights, cache = F.decoder_layer(
            y[:, start:stop],
            p,
            F.causal_mask(stop - start, T, offset=start),
            opts,
            cross_mask=cross_mask,
            cache=cache,
            cache_positions=positions,
            return_cross_attention=True,
        )
        np.testing.assert_allclose(got, want[:, start:stop], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(weights, want_weights[:, :, start:stop], atol=1e-6)


def test_cache_arguments_are_checked():
    rng = np.random.default_rng(4)
    p = _params(rng)
    x = rng.standard_normal((1, 2, E)).astype(np.float32)
    with pytest.raises(ValueError, match="x_kv must be given"):
        F.multi_head_attention(x, None, p)
    with pytest.raises(ValueError, match="cache_positions shape"):
        F.multi_head_attention(
            x, x, p, kv_cache=_empty(1, 4), cache_positions=jnp.zeros((1, 3), jnp.int32)
        )
