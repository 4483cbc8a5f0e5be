import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer import functional as F
from jaxformer.functional import masks


@pytest.mark.parametrize("T,S,offset", [(4, None, 0), (3, 5, 0), (3, 5, 2), (1, 6, 5)])
def test_causal_mask(T, S, offset):
    S_ = T if S is None else S
    want = np.array([[s <= t + offset for s in range(S_)] for t in range(T)])
    np.testing.assert_array_equal(F.causal_mask(T, S, offset), want)


def test_causal_mask_with_traced_offset():
    m = jax.jit(lambda o: F.causal_mask(1, 4, o))(jnp.int32(2))
    np.testing.assert_array_equal(m, [[True, True, True, False]])


def test_padding_mask():
    q = np.array([[True, True, False]])
    k = np.array([[True, False]])
    m = F.padding_mask(q, k)
    assert m.shape == (1, 1, 3, 2)
    np.testing.assert_array_equal(m[0, 0], [[True, False], [True, False], [False, False]])
    np.testing.assert_array_equal(F.padding_mask(None, k), k[:, None, None, :])


def test_segment_mask():
    seg = np.array([[1, 1, 2, 0]])
    m = np.asarray(F.segment_mask(seg, seg))[0, 0]
    want = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(m, want)


def test_combine_masks():
    a = np.array([True, True, False])
    b = np.array([True, False, True])
    assert F.combine_masks(None, None) is None
    np.testing.assert_array_equal(F.combine_masks(None, a), a)
    np.testing.assert_array_equal(F.combine_masks(a, None, b), a & b)


def test_mask_errors():
    with pytest.raises(TypeError, match="k_valid must be a boolean"):
        F.padding_mask(None, np.ones((1, 3), np.int32))
    with pytest.raises(ValueError, match="k_valid must have rank 2"):
        F.padding_mask(None, np.ones((3,), bool))
    with pytest.raises(ValueError, match="batch sizes differ"):
        F.padding_mask(np.ones((2, 3), bool), np.ones((1, 3), bool))
    with pytest.raises(TypeError, match=r"masks\[1\] must be a boolean"):
        F.combine_masks(np.ones(2, bool), np.ones(2, np.float32))


def test_attention_mask_as_array_is_the_combined_dense_mask():
    lengths = jnp.array([3, 5], jnp.int32)
    segments = jnp.array([[1, 1, 2, 2, 0], [1, 1, 1, 2, 2]])
    structure = F.AttentionMask(
        causal=True, k_lengths=lengths, q_segments=segments, k_segments=segments
    )
    seg = np.asarray(segments)  # NumPy: same document, not padding, key < length, causal
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
    want = same & (np.arange(5) < np.asarray(lengths)[:, None])[:, None, :] & np.tri(5, dtype=bool)
    np.testing.assert_array_equal(structure.as_array(5, 5), want[:, None])
    assert F.AttentionMask().as_array(5, 5) is None
    valid = np.arange(5) < np.asarray(lengths)[:, None]
    np.testing.assert_array_equal(F.padding_lengths(jnp.asarray(valid)), lengths)


def test_segment_ids_join_padding_as_one_pair_of_ids():
    """masks.segment_ids: a query sees a key iff their ids are equal; padding (validity,
    lengths, segment 0) matches nothing, not even other padding."""
    seg = np.array([[1, 1, 2, 0, 2, 3]], np.int32)
    q_valid = np.array([[True, True, True, True, True, False]])
    q_ids, k_ids = masks.segment_ids(1, 6, 6, q_valid, None, jnp.array([5]), seg, seg)
    same = np.asarray(q_ids)[0, :, None] == np.asarray(k_ids)[0, None, :]
    want = (seg[0, :, None] == seg[0, None, :]) & (seg[0, None, :] > 0) & q_valid[0, :, None]
    np.testing.assert_array_equal(same, want & (np.arange(6) < 5)[None, :])
    assert masks.segment_ids(1, 6, 6, None, None, None, None, None) is None


def test_attention_mask_is_a_pytree_with_a_static_flag():
    structure = F.AttentionMask(causal=True, k_lengths=jnp.array([2, 4], jnp.int32))
    assert len(jax.tree.leaves(structure)) == 1  # the lengths; causal is static

    @jax.jit
    def dense(m):
        assert m.causal is True  # a Python bool under jit, not a tracer
        return m.as_array(4, 4)

    np.testing.assert_array_equal(dense(structure), structure.as_array(4, 4))
