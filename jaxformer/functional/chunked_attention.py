"""Chunked attention: the online softmax over blocks of keys, with memory linear in length.

Computes softmax(q k^T * scale + bias, masked) v one [block_q, block_k] tile at a time
(the flash-attention schedule, in pure JAX): the running row maximum, row sum and output
are carried across key blocks. The forward saves q, k, v, the output and the row
log-sum-exp [B, K, G, T]; the backward (`jax.custom_vjp`) recomputes each tile from them.
No [T, S] array is formed; masks and bias apply per tile (causal tiles above the diagonal
are skipped), padding and packed documents as ids compared per tile (`masks.segment_ids`). Dropout keep-masks are drawn per tile and redrawn in the backward, so they
match "xla" in distribution only. A query with nothing to attend to gets zero output."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import BadValue
from jaxformer.functional.masks import PAD_KEY, PAD_QUERY, segment_ids, split_heads

DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
_einsum_f32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


class _Tiles(NamedTuple):
    """Static settings of one chunked attention call (hashable: a custom_vjp nondiff arg)."""

    causal: bool
    scale: float
    dropout_rate: float
    block_q: int
    block_k: int


def chunked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    q_valid: jax.Array | None = None,
    k_valid: jax.Array | None = None,
    k_lengths: jax.Array | None = None,
    q_segments: jax.Array | None = None,
    k_segments: jax.Array | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
) -> jax.Array:
    """q [B, T, H, D], k [B, S, K, D], v [B, S, K, Dv] -> [B, T, H, Dv] in q's dtype.

    Arguments as in `scaled_dot_product_attention` (which checks them); block_q and block_k
    are the tile sizes (clipped to T and S; the sequences are zero-padded to a multiple of
    them, padded keys masked out)."""
    if dropout_rate > 0.0 and dropout_rng is None:
        raise BadValue("dropout_rate > 0 needs a dropout_rng")
    if block_q < 1 or block_k < 1:
        raise BadValue(f"block_q and block_k must be >= 1, got {block_q} and {block_k}")
    B, T, H, D = q.shape
    S, K, Dv = k.shape[1], k.shape[2], v.shape[3]
    ids = segment_ids(B, T, S, q_valid, k_valid, k_lengths, q_segments, k_segments)
    bq, bk = min(block_q, T), min(block_k, S)
    Tp, Sp = _round_up(T, bq), _round_up(S, bk)
    if Sp != S and ids is None:  # keys padded to whole tiles: ids keep them out
        ids = segment_ids(B, T, S, None, jnp.ones((B, S), bool), None, None, None)
    scale = float(1.0 / math.sqrt(D) if scale is None else scale)
    tiles = _Tiles(causal, scale, float(dropout_rate), block_q=bq, block_k=bk)
    q5 = _pad_axis(q, 1, Tp).reshape(B, Tp, K, H // K, D)
    mask5 = None if mask is None else _pad_ts(split_heads(mask, H, K), Tp, Sp)
    bias5 = None if bias is None else _pad_ts(split_heads(bias.astype(jnp.float32), H, K), Tp, Sp)
    out = _attend(
        tiles,
        q5,
        _pad_axis(k, 1, Sp),
        _pad_axis(v, 1, Sp),
        mask5,
        bias5,
        None if ids is None else _pad_axis(ids[0], 1, Tp, PAD_QUERY),
        None if ids is None else _pad_axis(ids[1], 1, Sp, PAD_KEY),
        dropout_rng if dropout_rate > 0.0 else None,
    )
    return out[:, :T].reshape(B, T, H, Dv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(tiles, q, k, v, mask, bias, q_ids, k_ids, rng):
    """q [B, Tp, K, G, D], k [B, Sp, K, D], v [B, Sp, K, Dv] -> [B, Tp, K, G, Dv]."""
    return _forward(tiles, q, k, v, mask, bias, q_ids, k_ids, rng)[0]


def _forward(tiles, q, k, v, mask, bias, q_ids, k_ids, rng):
    """The output [B, Tp, K, G, Dv] and the row log-sum-exp L [B, K, G, Tp] (float32)."""
    B, Tp, K, G, _ = q.shape
    Dv = v.shape[-1]
    bq, bk = tiles.block_q, tiles.block_k
    n_k = k.shape[1] // bk

    def query_block(i):
        q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=1)

        def key_block(j, carry):
            acc, m, l = carry
            k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=1)
            v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=1)
            s = _logits(tiles, q_i, k_j, i, j, mask, bias, q_ids, k_ids)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # all masked so far
            p = jnp.exp(s - m_safe[..., None])  # masked logits are -inf: p = 0
            alpha = jnp.exp(m - m_safe)
            l = alpha * l + jnp.sum(p, axis=-1)
            p = _drop(tiles, p, rng, i, j)
            pv = _einsum_f32("bkgqs,bskd->bkgqd", p.astype(v.dtype), v_j)
            return alpha[..., None] * acc + pv, m_new, l

        init = (
            jnp.zeros((B, K, G, bq, Dv), jnp.float32),
            jnp.full((B, K, G, bq), -jnp.inf, jnp.float32),
            jnp.zeros((B, K, G, bq), jnp.float32),
        )
        acc, m, l = jax.lax.fori_loop(0, _last_key_block(tiles, i, n_k), key_block, init)
        out = acc / jnp.where(l == 0.0, 1.0, l)[..., None]
        lse = jnp.where(l > 0.0, m + jnp.log(jnp.where(l > 0.0, l, 1.0)), 0.0)
        return jnp.moveaxis(out, 3, 1).astype(q.dtype), lse

    out, lse = jax.lax.map(query_block, jnp.arange(Tp // bq))
    out = jnp.moveaxis(out, 0, 1).reshape(B, Tp, K, G, Dv)  # [n_q, B, bq, ...] -> [B, Tp, ...]
    lse = jnp.moveaxis(lse, 0, 3).reshape(B, K, G, Tp)
    return out, lse


def _attend_fwd(tiles, q, k, v, mask, bias, q_ids, k_ids, rng):
    out, lse = _forward(tiles, q, k, v, mask, bias, q_ids, k_ids, rng)
    return out, (q, k, v, mask, bias, q_ids, k_ids, rng, out, lse)


def _attend_bwd(tiles, residuals, d_out):
    """Per key block j: dV_j, dK_j summed over query blocks; dQ (and dbias) accumulated."""
    q, k, v, mask, bias, q_ids, k_ids, rng, out, lse = residuals
    bq, bk = tiles.block_q, tiles.block_k
    n_q, n_k = q.shape[1] // bq, k.shape[1] // bk
    # delta = rowsum(dP * P) = rowsum(dO * O), [B, K, G, Tp].
    delta = jnp.einsum("btkgd,btkgd->bkgt", d_out.astype(jnp.float32), out.astype(jnp.float32))

    def key_block(carry, j):
        dq, dbias = carry
        k_j = jax.lax.dynamic_slice_in_dim(k, j * bk, bk, axis=1)
        v_j = jax.lax.dynamic_slice_in_dim(v, j * bk, bk, axis=1)

        def query_block(i, carry):
            dk_j, dv_j, dq, dbias = carry
            q_i = jax.lax.dynamic_slice_in_dim(q, i * bq, bq, axis=1)
            do_i = jax.lax.dynamic_slice_in_dim(d_out, i * bq, bq, axis=1)
            lse_i = jax.lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=3)
            delta_i = jax.lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=3)
            s = _logits(tiles, q_i, k_j, i, j, mask, bias, q_ids, k_ids)
            p = jnp.exp(s - lse_i[..., None])  # the softmax weights of this tile
            p_dropped = _drop(tiles, p, rng, i, j)
            dv_j = dv_j + _einsum_f32("bkgqs,bqkgd->bskd", p_dropped.astype(do_i.dtype), do_i)
            dp = _einsum_f32("bqkgd,bskd->bkgqs", do_i, v_j)
            dp = _drop(tiles, dp, rng, i, j)
            ds = p * (dp - delta_i[..., None])  # d loss / d (scaled logits + bias)
            if dbias is not None:
                dbias = _add_tile(dbias, ds, i * bq, j * bk)
            ds = ds * jnp.float32(tiles.scale)
            dq_i = _einsum_f32("bkgqs,bskd->bqkgd", ds.astype(k_j.dtype), k_j)
            dq = jax.lax.dynamic_update_slice_in_dim(
                dq, jax.lax.dynamic_slice_in_dim(dq, i * bq, bq, axis=1) + dq_i, i * bq, axis=1
            )
            dk_j = dk_j + _einsum_f32("bkgqs,bqkgd->bskd", ds.astype(q_i.dtype), q_i)
            return dk_j, dv_j, dq, dbias

        init = (jnp.zeros(k_j.shape, jnp.float32), jnp.zeros(v_j.shape, jnp.float32), dq, dbias)
        first = (j * bk) // bq if tiles.causal else 0  # query blocks that see key block j
        dk_j, dv_j, dq, dbias = jax.lax.fori_loop(first, n_q, query_block, init)
        return (dq, dbias), (dk_j, dv_j)

    init = (
        jnp.zeros(q.shape, jnp.float32),
        None if bias is None else jnp.zeros(bias.shape, jnp.float32),
    )
    (dq, dbias), (dk, dv) = jax.lax.scan(key_block, init, jnp.arange(n_k))
    dk = jnp.moveaxis(dk, 0, 1).reshape(k.shape)  # [n_k, B, bk, K, D] -> [B, Sp, K, D]
    dv = jnp.moveaxis(dv, 0, 1).reshape(v.shape)
    grads = dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
    return *grads, None, dbias, None, None, None  # mask, ids and rng: none


_attend.defvjp(_attend_fwd, _attend_bwd)


def _logits(tiles, q_i, k_j, i, j, mask, bias, q_ids, k_ids):
    """Scaled logits (+ bias) of tile (i, j), [B, K, G, bq, bk] float32; -inf where masked."""
    bq, bk = tiles.block_q, tiles.block_k
    s = _einsum_f32("bqkgd,bskd->bkgqs", q_i, k_j)
    s = s * jnp.float32(tiles.scale)
    if bias is not None:
        s = s + _tile(bias, i * bq, bq, j * bk, bk)
    keep = []
    if tiles.causal:
        q_pos = i * bq + jnp.arange(bq)
        k_pos = j * bk + jnp.arange(bk)
        keep.append((k_pos[None, :] <= q_pos[:, None])[None, None, None])  # [1, 1, 1, q, s]
    if q_ids is not None:  # ids of the tile's queries [B, 1, 1, bq, 1] and keys [B, 1, 1, 1, bk]
        q_id = jax.lax.dynamic_slice_in_dim(q_ids, i * bq, bq, axis=1)[:, None, None, :, None]
        k_id = jax.lax.dynamic_slice_in_dim(k_ids, j * bk, bk, axis=1)[:, None, None, None, :]
        keep.append(q_id == k_id)
    if mask is not None:
        keep.append(_tile(mask, i * bq, bq, j * bk, bk))
    if not keep:
        return s
    return jnp.where(functools.reduce(jnp.logical_and, keep), s, -jnp.inf)


def _drop(tiles, x, rng, i, j):
    """Inverted dropout of tile (i, j) with the tile's own key (the same in both passes)."""
    if rng is None:
        return x
    key = jax.random.fold_in(jax.random.fold_in(rng, i), j)
    keep = jax.random.bernoulli(key, 1.0 - tiles.dropout_rate, x.shape)
    return jnp.where(keep, x / (1.0 - tiles.dropout_rate), 0.0)


def _last_key_block(tiles, i, n_k):
    """One past the last key block query block i attends to."""
    if not tiles.causal:
        return n_k
    return jnp.minimum(n_k, ((i + 1) * tiles.block_q - 1) // tiles.block_k + 1)


def _tile(x, t0, bq, s0, bk):
    """Rows t0:t0+bq and columns s0:s0+bk of x [.., T | 1, S | 1] (size-1 axes broadcast)."""
    if x.shape[-2] > 1:
        x = jax.lax.dynamic_slice_in_dim(x, t0, bq, axis=x.ndim - 2)
    if x.shape[-1] > 1:
        x = jax.lax.dynamic_slice_in_dim(x, s0, bk, axis=x.ndim - 1)
    return x


def _add_tile(acc, ds, t0, s0):
    """acc [Bb, Kb, Gb, T | 1, S | 1] += ds [B, K, G, bq, bk] summed over acc's size-1 axes."""
    axes = tuple(a for a in range(ds.ndim) if acc.shape[a] == 1 and ds.shape[a] > 1)
    ds = jnp.sum(ds, axis=axes, keepdims=True)
    start = (0, 0, 0, t0 if acc.shape[3] > 1 else 0, s0 if acc.shape[4] > 1 else 0)
    old = jax.lax.dynamic_slice(acc, start, ds.shape)
    return jax.lax.dynamic_update_slice(acc, old + ds, start)


def _pad_ts(x: jax.Array, Tp: int, Sp: int) -> jax.Array:
    """Pad the T and S axes of x [.., T | 1, S | 1] (those not of size 1) to Tp and Sp."""
    if x.shape[-2] > 1:
        x = _pad_axis(x, x.ndim - 2, Tp)
    if x.shape[-1] > 1:
        x = _pad_axis(x, x.ndim - 1, Sp)
    return x


def _pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """Pad x along `axis` to `size` with `value` (zero, False)."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
