"""The core functional pieces, each run eagerly and under `jit` (chex's variants), against
plain NumPy references written here: attention, masks, norms, feed-forward, positions.
With the test configuration's rank promotion set to "raise", a silent broadcast in any
of them is an error here."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import functional as F

B, T, S, H, D, E = 2, 5, 7, 4, 8, 16


def _np_attention(q, k, v, allowed):
    """softmax(q k^T / sqrt(D) over allowed keys) v, [B, T, H, D]."""
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", weights, v)


def _np_layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


class FunctionalVariantsTest(chex.TestCase):
    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(0)

    def normal(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_attention_with_padding_and_causal_masks(self):
        q, k, v = self.normal(B, T, H, D), self.normal(B, T, H, D), self.normal(B, T, H, D)
        valid = np.arange(T)[None, :] < np.array([[T], [3]])  # row 1: 3 real keys

        @self.variant
        def attend(q, k, v, valid):
            mask = F.combine_masks(F.causal_mask(T), F.padding_mask(None, valid))
            return F.scaled_dot_product_attention(q, k, v, mask)

        out = attend(q, k, v, valid)
        chex.assert_shape(out, (B, T, H, D))
        allowed = np.tril(np.ones((T, T), bool))[None, None] & valid[:, None, None, :]
        chex.assert_trees_all_close(out, _np_attention(q, k, v, allowed), atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_masks(self):
        q_valid = np.arange(T)[None, :] < np.array([[T], [2]])
        k_valid = np.arange(S)[None, :] < np.array([[4], [S]])
        offsets = np.array([0, 2]).reshape(B, 1, 1, 1)

        @self.variant
        def masks(q_valid, k_valid, offsets):
            return F.padding_mask(q_valid, k_valid), F.causal_mask(T, S, offsets)

        padding, causal = masks(q_valid, k_valid, offsets)
        chex.assert_shape([padding, causal], (B, 1, T, S))
        t, s = np.arange(T)[:, None], np.arange(S)[None, :]
        expected_causal = np.stack([s <= t + o for o in (0, 2)])[:, None]
        expected_padding = q_valid[:, None, :, None] & k_valid[:, None, None, :]
        chex.assert_trees_all_equal(padding, expected_padding)
        chex.assert_trees_all_equal(causal, expected_causal)

    @chex.variants(with_jit=True, without_jit=True)
    def test_norms_and_feed_forward(self):
        x, scale, bias = self.normal(B, T, E), self.normal(E), self.normal(E)
        params = F.FeedForwardParams(self.normal(E, 3 * E), self.normal(3 * E, E))
        params = params._replace(b1=self.normal(3 * E), b2=self.normal(E))

        @self.variant
        def layers(x, scale, bias, params):
            return (
                F.layer_norm(x, scale, bias, eps=1e-6),
                F.rms_norm(x, scale, eps=1e-6),
                F.feed_forward(x, params, activation="relu"),
            )

        layer, rms, ffn = layers(x, scale, bias, params)
        chex.assert_shape([layer, rms, ffn], (B, T, E))
        rms_ref = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * scale
        ffn_ref = np.maximum(x @ params.w1 + params.b1, 0) @ params.w2 + params.b2
        chex.assert_trees_all_close(layer, _np_layer_norm(x, scale, bias, 1e-6), atol=1e-5)
        chex.assert_trees_all_close(rms, rms_ref, atol=1e-5)
        chex.assert_trees_all_close(ffn, ffn_ref, atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rotary_positions(self):
        x = self.normal(B, T, H, D)
        positions = np.stack([np.arange(T), np.arange(T) + 3]).astype(np.int32)  # [B, T]

        @self.variant
        def rotate(x, positions):
            return F.apply_rope(x, positions)

        out = rotate(x, positions)
        chex.assert_shape(out, (B, T, H, D))
        angle = positions[:, :, None, None] / 10000.0 ** (np.arange(0, D, 2) / D)  # [B, T, 1, D/2]
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        expected = np.concatenate(
            [x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1
        )
        chex.assert_trees_all_close(out, expected, atol=1e-5)


def test_the_tests_refuse_implicit_rank_promotion():
    """conftest sets jax_numpy_rank_promotion="raise": [3] + [2, 3] is an error."""
    with pytest.raises(ValueError, match="rank_promotion"):
        jnp.ones(3) + jnp.ones((2, 3))
