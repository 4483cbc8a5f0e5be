"""Attention masks. Boolean, True = may attend, broadcastable to [B, H, T, S]."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.checks import (
    BadValue,
    check_bool_array,
    check_int,
    check_int_array,
    check_rank,
    check_shape,
)

# segment_ids' ids: real tokens keep their document's id (REAL without documents; a
# document's id is >= 0); padded keys and queries get ids that match nothing.
REAL, PAD_KEY, PAD_QUERY = 1, -1, -2


def causal_mask(T: int, S: int | None = None, offset: int | jax.Array = 0) -> jax.Array:
    """[T, S] mask where query t (at absolute position t + offset) sees keys s <= t + offset;
    S defaults to T. `offset` may be traced (decoding: queries at offset, offset + 1, ... of
    a cache of S slots); a per-row offset [B, 1, 1, 1] gives a [B, 1, T, S] mask."""
    S = T if S is None else S
    check_int("causal_mask's T", T)
    check_int("causal_mask's S", S)
    lead = (1,) * max(jnp.ndim(offset) - 2, 0)  # [B, 1] of a per-row offset
    q_pos = jnp.arange(T).reshape(*lead, T, 1) + offset
    return jnp.arange(S).reshape(*lead, 1, S) <= q_pos


def padding_mask(q_valid: jax.Array | None, k_valid: jax.Array) -> jax.Array:
    """[B, 1, T, S] mask from q_valid [B, T] and k_valid [B, S]: a pair attends when both
    are real. With q_valid None only keys are masked ([B, 1, 1, S]); padded queries then
    still give (ignored) outputs."""
    check_rank("k_valid", k_valid, 2)
    check_bool_array("k_valid", k_valid, "(True = real token)")
    mask = k_valid[:, None, None, :]
    if q_valid is None:
        return mask
    check_rank("q_valid", q_valid, 2)
    check_bool_array("q_valid", q_valid, "(True = real token)")
    if q_valid.shape[0] != k_valid.shape[0]:
        raise BadValue(
            f"padding_mask: batch sizes differ: q_valid {q_valid.shape}, k_valid {k_valid.shape}"
        )
    return q_valid[:, None, :, None] & mask


def length_mask(lengths: jax.Array, S: int) -> jax.Array:
    """[B, 1, 1, S] mask of the keys s < lengths[b] ([B] int): right padding as a mask."""
    return (jnp.arange(S)[None, :] < lengths[:, None])[:, None, None, :]


def check_lengths(name: str, lengths, B: int) -> None:
    """lengths is an integer array [B]."""
    check_int_array(name, lengths, "of lengths")
    check_shape(name, lengths, (B,), "[B]")


def check_segments(q_segments, k_segments, B: int, T: int, S: int) -> None:
    """Segment ids are integer arrays q_segments [B, T] and k_segments [B, S]; k_segments
    None with q_segments given means the same ids (self-attention: S = T)."""
    if q_segments is None and k_segments is not None:
        raise BadValue("k_segments needs q_segments (the queries' segment ids)")
    if q_segments is not None:
        check_int_array("q_segments", q_segments, "of segment ids")
        check_shape("q_segments", q_segments, (B, T), "[B, T]")
        k_segments = q_segments if k_segments is None else k_segments
        check_int_array("k_segments", k_segments, "of segment ids")
        check_shape("k_segments", k_segments, (B, S), "[B, S] (q_segments' when not given)")


def padding_lengths(valid: jax.Array | None) -> jax.Array | None:
    """The lengths [B] int32 of right-padded rows, valid [B, S] (a prefix of each row is
    True); None for None."""
    return None if valid is None else jnp.sum(valid, axis=1, dtype=jnp.int32)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k_lengths", "q_segments", "k_segments", "dense"],
    meta_fields=["causal"],
)
@dataclasses.dataclass(frozen=True)
class AttentionMask:
    """Who may attend to whom, as the structure kernels take natively (a pytree, `causal`
    static); `multi_head_attention` takes one wherever it takes a mask array.

      causal: query t sees keys s <= t (a flag);
      k_lengths: [B] int, keys s >= k_lengths[b] are padding;
      q_segments, k_segments: [B, T] and [B, S] int ids >= 0 of packed documents (k_segments
        None: q_segments', self-attention): a query attends to the keys of its own id; id 0
        is padding, seeing nothing;
      dense: boolean, broadcastable to [B, H, T, S], for what none of these express, or None."""

    causal: bool = False
    k_lengths: jax.Array | None = None
    q_segments: jax.Array | None = None
    k_segments: jax.Array | None = None
    dense: jax.Array | None = None

    def as_array(self, T: int, S: int) -> jax.Array | None:
        """The same mask as one boolean array broadcastable to [B, H, T, S] (None: none)."""
        B = 1 if self.q_segments is None else self.q_segments.shape[0]
        structure = dict(q_segments=self.q_segments, k_segments=self.k_segments)
        return fold_masks(
            B, T, S, self.dense, k_lengths=self.k_lengths, causal=self.causal, **structure
        )


def segment_ids(B: int, T: int, S: int, q_valid, k_valid, k_lengths, q_segments, k_segments):
    """Padding and packed documents (segment ids [B, T], [B, S], 0 = padding) as one pair
    of ids, (q_ids [B, T], kv_ids [B, S]) int32, or None when there is neither: query t may
    see key s iff q_ids[t] == kv_ids[s] (what splash takes, and "chunked" per tile)."""
    if all(x is None for x in (q_valid, k_valid, k_lengths, q_segments)):
        return None
    real_k = jnp.ones((B, S), bool) if k_valid is None else k_valid
    if k_lengths is not None:
        real_k = real_k & (jnp.arange(S)[None, :] < k_lengths[:, None])
    real_q = jnp.ones((B, T), bool) if q_valid is None else q_valid
    q_doc, k_doc = REAL, REAL
    if q_segments is not None:
        k_segments = q_segments if k_segments is None else k_segments
        q_doc, k_doc = q_segments, k_segments
        real_q, real_k = real_q & (q_segments != 0), real_k & (k_segments != 0)
    q_ids = jnp.where(real_q, q_doc, PAD_QUERY).astype(jnp.int32)
    return q_ids, jnp.where(real_k, k_doc, PAD_KEY).astype(jnp.int32)


def segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """[B, 1, T, S] mask keeping packed sequences apart: q_segments [B, T] and k_segments
    [B, S] (int ids) attend iff equal; id 0 marks padding and attends to nothing."""
    check_rank("q_segments", q_segments, 2)
    check_rank("k_segments", k_segments, 2)
    check_int_array("q_segments", q_segments, "of segment ids")
    check_int_array("k_segments", k_segments, "of segment ids")
    if q_segments.shape[0] != k_segments.shape[0]:
        raise BadValue(
            f"segment_mask: batch sizes differ: q_segments {q_segments.shape}, "
            f"k_segments {k_segments.shape}"
        )
    same = q_segments[:, None, :, None] == k_segments[:, None, None, :]
    return same & (k_segments[:, None, None, :] != 0)


def fold_masks(
    B: int,
    T: int,
    S: int,
    mask: jax.Array | None = None,
    *,
    q_valid: jax.Array | None = None,
    k_valid: jax.Array | None = None,
    k_lengths: jax.Array | None = None,
    q_segments: jax.Array | None = None,
    k_segments: jax.Array | None = None,
    causal: bool = False,
) -> jax.Array | None:
    """One boolean mask, broadcastable to [B, H, T, S], from a mask and the structure
    (validity vectors [B, T] and [B, S], key lengths [B], segment ids [B, T] and [B, S],
    the causal flag): what an implementation that takes no structure forms inside itself."""
    if q_segments is not None:
        k_segments = q_segments if k_segments is None else k_segments
        mask = combine_masks(mask, segment_mask(q_segments, k_segments))
    if q_valid is not None or k_valid is not None:
        k_valid = jnp.ones((B, S), bool) if k_valid is None else k_valid
        mask = combine_masks(mask, padding_mask(q_valid, k_valid))
    if k_lengths is not None:
        mask = combine_masks(mask, length_mask(k_lengths, S))
    return combine_masks(mask, causal_mask(T, S)) if causal else mask


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the masks that are not None (None when all are None)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for i, m in enumerate(present):
        check_bool_array(f"masks[{i}]", m)
    try:
        np.broadcast_shapes(*(np.shape(m) for m in present))
    except ValueError:
        shapes = [tuple(np.shape(m)) for m in present]
        raise BadValue(f"combine_masks: the masks' shapes {shapes} do not broadcast") from None
    rank = max(jnp.ndim(m) for m in present)  # lead with 1s explicitly: [T, S] -> [1, 1, T, S]
    out, *rest = (jnp.reshape(m, (1,) * (rank - jnp.ndim(m)) + jnp.shape(m)) for m in present)
    for m in rest:
        out = jnp.logical_and(out, m)
    return out


def split_heads(x: jax.Array, H: int, K: int) -> jax.Array:
    """A mask or bias broadcastable to [B, H, T, S] -> [B | 1, K | 1, G | 1, T | 1, S | 1],
    query head h = k * G + g reading key/value head k (G = H / K)."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    b, h, t, s = x.shape
    if h == H and H > 1:
        return x.reshape(b, K, H // K, t, s)
    return x.reshape(b, 1, 1, t, s)
