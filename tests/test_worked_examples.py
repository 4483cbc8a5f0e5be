"""The worked examples of popular Transformer explanations, recomputed with jaxformer and
checked against closed forms derived by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import functional as F


def attend(q, k, v):
    heads = lambda x: jnp.asarray(x, jnp.float32)[None, :, None, :]  # noqa: E731
    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    w = F.attention_weights(heads(q), heads(k))
    return np.asarray(out[0, :, 0]), np.asarray(w[0, 0])


def test_one_query_example():
    # scores [11, 18] / sqrt(2): the weights are a two-way softmax of a gap of 7 / sqrt(2).
    out, w = attend([[3, 4]], [[1, 2], [2, 3]], [[7, 8], [9, 10]])
    w0 = 1 / (1 + math.exp(7 / math.sqrt(2)))
    np.testing.assert_allclose(w[0], [w0, 1 - w0], rtol=1e-5)
    np.testing.assert_allclose(out[0], [7 * w0 + 9 * (1 - w0), 8 * w0 + 10 * (1 - w0)], rtol=1e-5)
    assert w[0, 0] == pytest.approx(0.00704, abs=1e-5)  # not the 0.2 a text assumes


def test_three_token_example():
    q = [[1, 0], [0, 1], [1, 1]]
    k = [[1, 1], [1, 0], [0, 1]]
    v = [[10, 0], [0, 10], [5, 5]]
    out, w = attend(q, k, v)
    a = math.exp(1 / math.sqrt(2))
    np.testing.assert_allclose(w[0], [a / (2 * a + 1), a / (2 * a + 1), 1 / (2 * a + 1)], rtol=1e-5)
    # (10 a + 5) / (2 a + 1) = 5 exactly, in both columns: the output is [5, 5].
    np.testing.assert_allclose(out[0], [5.0, 5.0], rtol=1e-5)


def test_positional_encoding_example():
    pe = np.asarray(F.sinusoidal_positions(2, 4))
    np.testing.assert_allclose(
        pe[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], rtol=1e-6
    )
