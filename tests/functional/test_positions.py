import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import functional as F
from tests import reference as ref


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
@pytest.mark.parametrize("length,d_model", [(1, 2), (7, 4), (50, 16), (128, 512)])
def test_sinusoids_follow_the_paper(length, d_model, layout):
    table = F.sinusoidal_positions(length, d_model, layout=layout)
    assert table.shape == (length, d_model) and table.dtype == jnp.float32
    np.testing.assert_allclose(table, ref.sinusoid(length, d_model, layout), atol=1e-6)


def test_sinusoid_layouts_hold_the_same_columns():
    interleaved = np.asarray(F.sinusoidal_positions(9, 8))
    halves = np.asarray(F.sinusoidal_positions(9, 8, layout="halves"))
    np.testing.assert_array_equal(
        halves, np.concatenate([interleaved[:, 0::2], interleaved[:, 1::2]], 1)
    )
    with pytest.raises(ValueError, match="layout must be one of"):
        F.sinusoidal_positions(9, 8, layout="blocks")


def test_sinusoid_worked_values():
    """pos=1, d_model=4: angles 1 and 1/10000^(2/4) = 0.01."""
    row = np.asarray(F.sinusoidal_positions(2, 4))[1]
    np.testing.assert_allclose(row, [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)], atol=1e-7)


@pytest.mark.parametrize("d_model", [3, 0, -2])
def test_sinusoids_reject_odd_or_nonpositive_d_model(d_model):
    with pytest.raises(ValueError, match="(need an even d_model|d_model must be >= 2), got"):
        F.sinusoidal_positions(4, d_model)


def _rope_numpy(x, pos, base=10000.0):
    D = x.shape[-1]
    half = D // 2
    out = np.empty_like(x, dtype=np.float64)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for j in range(half):
                theta = pos[b, t] * base ** (-2 * j / D)
                c, s = np.cos(theta), np.sin(theta)
                x1, x2 = x[b, t, :, j], x[b, t, :, j + half]
                out[b, t, :, j] = x1 * c - x2 * s
                out[b, t, :, j + half] = x2 * c + x1 * s
    return out


def test_rope_matches_reference_and_preserves_norm():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    pos = np.stack([np.arange(5), np.arange(3, 8)])
    out = F.apply_rope(x, pos)
    np.testing.assert_allclose(out, _rope_numpy(x, pos), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)

    def score(pq, pk):
        rq = F.apply_rope(q, np.array([pq]))
        rk = F.apply_rope(k, np.array([pk]))
        return float(jnp.sum(rq * rk))

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-4)
    assert score(0, 0) == pytest.approx(float(np.sum(q * k)), abs=1e-5)


def test_rope_errors():
    with pytest.raises(ValueError, match="even head dim"):
        F.apply_rope(np.zeros((1, 2, 1, 3), np.float32), np.arange(2))
    with pytest.raises(ValueError, match="positions must be"):
        F.apply_rope(np.zeros((1, 2, 1, 4), np.float32), np.arange(3))
