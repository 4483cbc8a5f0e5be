"""Scaled dot-product attention (Vaswani et al., 2017, eq. 1), with grouped key/value heads.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Layout follows `jax.nn.dot_product_attention`: q [B, T, H, D], k [B, S, K, D],
v [B, S, K, Dv]. H query heads share K key/value heads in groups of G = H / K
(K = H: multi-head, K = 1: multi-query, otherwise grouped-query attention);
query head h reads key/value head h // G.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.functional._checks import (
    check_broadcastable,
    check_float,
    check_rank,
)
from jaxformer.functional.masks import causal_mask, combine_masks
from jaxformer.functional.positions import apply_rope


def scaled_dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    bias: jax.Array | None = None,
    causal: bool = False,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """softmax(q k^T * scale + bias, masked) v.

    Args:
      q: [B, T, H, D] queries.
      k: [B, S, K, D] keys; K must divide H.
      v: [B, S, K, Dv] values.
      mask: boolean, broadcastable to [B, H, T, S]; True = may attend.
      bias: float, broadcastable to [B, H, T, S]; added to the scaled logits.
      causal: also apply `causal_mask(T, S)` (query t sees keys s <= t).
      scale: logit scale; default 1 / sqrt(D).
      dropout_rate: dropout on the attention weights (needs `dropout_rng` when > 0).
      return_weights: also return the attention probabilities (before dropout).

    Returns:
      [B, T, H, Dv] in q's dtype, and with `return_weights` the weights [B, H, T, S]
      (float32). The softmax runs in float32 with the row maximum subtracted; a query
      with no key to attend to gets all-zero weights and a zero output.
    """
    B, T, H, D, S, K = _check_qkv(q, k, v)
    if mask is not None:
        if jnp.result_type(mask) != jnp.bool_:
            raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        check_broadcastable("mask", mask, (B, H, T, S), "[B, H, T, S]")
    if bias is not None:
        check_float("bias", bias)
        check_broadcastable("bias", bias, (B, H, T, S), "[B, H, T, S]")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("dropout_rate > 0 needs a dropout_rng")
    if causal:
        mask = combine_masks(mask, causal_mask(T, S))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = H // K

    q_BTKGD = q.reshape(B, T, K, G, D)
    logits = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k, preferred_element_type=jnp.float32)
    logits = logits * jnp.float32(scale)
    if bias is not None:
        logits = logits + _split_heads(bias.astype(jnp.float32), H, K)
    weights_BKGTS = masked_softmax(logits, None if mask is None else _split_heads(mask, H, K))

    probs = weights_BKGTS
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = jnp.einsum(
        "bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    out = out.reshape(B, T, H, v.shape[-1]).astype(q.dtype)
    if return_weights:
        return out, weights_BKGTS.reshape(B, H, T, S)
    return out


def masked_softmax(logits: jax.Array, mask: jax.Array | None, axis: int = -1) -> jax.Array:
    """Softmax over `axis` of float32 `logits`, zero where `mask` is False.

    Rows with nothing to attend to (all masked, or all -inf) give zeros; neither the
    value nor the gradient is ever NaN or inf.
    """
    logits = logits.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    unnorm = jnp.exp(logits - row_max)
    if mask is not None:
        unnorm = jnp.where(mask, unnorm, 0.0)
    total = jnp.sum(unnorm, axis=axis, keepdims=True)
    return unnorm / jnp.where(total == 0.0, 1.0, total)


def _split_heads(x: jax.Array, H: int, K: int) -> jax.Array:
    """[.., H | 1, T, S] (broadcastable to [B, H, T, S]) -> [.., K | 1, G | 1, T, S]."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    b, h, t, s = x.shape
    if h == H and H > 1:
        return x.reshape(b, K, H // K, t, s)
    return x.reshape(b, 1, 1, t, s)


def _check_qkv(q, k, v):
    check_rank("q", q, 4, "[B, T, H, D]")
    check_rank("k", k, 4, "[B, S, K, D]")
    check_rank("v", v, 4, "[B, S, K, Dv]")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float(name, x)
    B, T, H, D = q.shape
    _, S, K, _ = k.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[3] != D:
        raise ValueError(
            f"q head dim D={D} (q shape {q.shape}) != k head dim {k.shape[3]} (k shape {k.shape})"
        )
    if v.shape[1:3] != (S, K):
        raise ValueError(f"v shape {v.shape} must match k's [B, S, K] = {k.shape[:3]} in S and K")
    if K < 1 or H % K != 0:
        raise ValueError(f"the number of key/value heads K={K} must divide the query heads H={H}")
    return B, T, H, D, S, K


class AttentionParams(NamedTuple):
    """Multi-head attention projections (section 3.2.2): W^Q, W^K, W^V per head, then W^O."""

    wq: jax.Array  # [E, H, Dk]
    wk: jax.Array  # [E, K, Dk]
    wv: jax.Array  # [E, K, Dv]
    wo: jax.Array  # [H, Dv, E]
    bq: jax.Array | None = None  # [H, Dk]
    bk: jax.Array | None = None  # [K, Dk]
    bv: jax.Array | None = None  # [K, Dv]
    bo: jax.Array | None = None  # [E]


def multi_head_attention(
    x_q: jax.Array,
    x_kv: jax.Array,
    params: AttentionParams,
    mask: jax.Array | None = None,
    *,
    dropout_rate: float = 0.0,
    rng: jax.Array | None = None,
    rope_positions: tuple[jax.Array, jax.Array] | None = None,
    return_weights: bool = False,
    kv_cache: KVCache | None = None,
    cache_positions: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, ...]:
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W^Q_i, ...).

    Self-attention: x_kv is x_q. Cross-attention: x_kv is the encoder output.

    Args:
      x_q: [B, T, E] queries' source; x_kv: [B, S, E] keys' and values' source.
      params: the projections; H query heads, K key/value heads.
      mask: boolean, broadcastable to [B, H, T, S] ([B, H, T, S_max] with a cache).
      dropout_rate, rng: attention-weight dropout, applied only when rng is given.
      rope_positions: (q_positions, k_positions), [B, T] and [B, S], to rotate q and k
        with rotary embeddings; None for none.
      return_weights: also return the attention probabilities [B, H, T, S].
      kv_cache: for decoding. With `cache_positions` [B, T] (cached self-attention) the
        keys and values of x_kv are written into the cache at those slots and the queries
        attend over the whole cache; `mask` must hide the slots not yet written. Without
        (cross-attention over a fixed memory) the cache holds the memory's keys and values
        from `project_kv` and x_kv must be None.

    Returns:
      [B, T, E]; then the weights with `return_weights`; then, with a kv_cache, the
      updated cache: out, (out, weights), (out, cache) or (out, weights, cache).
    """
    check_rank("x_q", x_q, 3, "[B, T, E]")
    if x_kv is not None:
        check_rank("x_kv", x_kv, 3, "[B, S, E]")
    E = params.wq.shape[0]
    named = (("x_q", x_q),) if x_kv is None else (("x_q", x_q), ("x_kv", x_kv))
    for name, x in named:
        check_float(name, x)
        if x.shape[-1] != E:
            raise ValueError(f"{name} has model dim {x.shape[-1]}, the projections expect {E}")
    if (x_kv is None) != (kv_cache is not None and cache_positions is None):
        raise ValueError(
            "x_kv must be given, except with a kv_cache and no cache_positions "
            "(attention over keys and values projected before)"
        )
    q = project_heads(x_q, params.wq, params.bq)
    if rope_positions is not None:
        q = apply_rope(q, rope_positions[0])
    if x_kv is None:
        kv = kv_cache
    else:
        kv = project_kv(x_kv, params, None if rope_positions is None else rope_positions[1])
        if kv_cache is not None:
            kv = kv_cache = write_kv(kv_cache, kv, cache_positions)
    out = scaled_dot_product_attention(
        q,
        kv.k,
        kv.v,
        mask,
        dropout_rate=dropout_rate if rng is not None else 0.0,
        dropout_rng=rng,
        return_weights=return_weights,
    )
    if return_weights:
        out, weights = out
    out = merge_heads(out, params.wo, params.bo)
    result = (
        (out,) + ((weights,) if return_weights else ()) + (() if kv_cache is None else (kv_cache,))
    )
    return result if len(result) > 1 else out


class KVCache(NamedTuple):
    """Keys and values of one attention layer for decoding; slot s holds position s."""

    k: jax.Array  # [B, S_max, K, Dk]
    v: jax.Array  # [B, S_max, K, Dv]


def project_kv(
    x_kv: jax.Array, params: AttentionParams, rope_positions: jax.Array | None = None
) -> KVCache:
    """The keys and values of x_kv [B, S, E]: k [B, S, K, Dk] (rotated when rope_positions
    [B, S] is given), v [B, S, K, Dv]."""
    k = project_heads(x_kv, params.wk, params.bk)
    if rope_positions is not None:
        k = apply_rope(k, rope_positions)
    return KVCache(k, project_heads(x_kv, params.wv, params.bv))


def write_kv(cache: KVCache, new: KVCache, positions: jax.Array) -> KVCache:
    """Write new keys and values [B, T, K, D] into slots `positions` [B, T] of each row.

    Fixed shapes, so it runs under jit with traced positions (each row has its own).
    """
    check_rank("cache_positions", positions, 2, "[B, T]")
    if positions.shape != new.k.shape[:2]:
        raise ValueError(
            f"cache_positions shape {positions.shape} != the new keys' [B, T] {new.k.shape[:2]}"
        )
    rows = jnp.arange(positions.shape[0])[:, None]
    return KVCache(
        cache.k.at[rows, positions].set(new.k.astype(cache.k.dtype)),
        cache.v.at[rows, positions].set(new.v.astype(cache.v.dtype)),
    )


def project_heads(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """x [B, T, E] @ w [E, H, D] (+ b [H, D]) -> [B, T, H, D]."""
    out = jnp.einsum("bte,ehd->bthd", x, w)
    return out if b is None else out + b


def merge_heads(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """Concatenate heads and project: x [B, T, H, D] @ w [H, D, E] (+ b [E]) -> [B, T, E]."""
    out = jnp.einsum("bthd,hde->bte", x, w)
    return out if b is None else out + b
