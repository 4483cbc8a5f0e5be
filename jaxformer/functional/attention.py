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
    check_shape,
)
from jaxformer.functional.chunked_attention import chunked_attention
from jaxformer.functional.masks import causal_mask, combine_masks, padding_mask, split_heads
from jaxformer.functional.matmul import einsum_f32
from jaxformer.functional.positions import apply_rope

IMPLEMENTATIONS = ("xla", "chunked", "cudnn")


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
    q_valid: jax.Array | None = None,
    k_valid: jax.Array | None = None,
    implementation: str = "xla",
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
      return_weights: also return the attention probabilities (before dropout); "xla" only.
      q_valid, k_valid: bool [B, T] and [B, S], True = real token: the same as
        `padding_mask(q_valid, k_valid)` in `mask`, but never formed at [T, S] by "chunked".
      implementation: one of IMPLEMENTATIONS, all computing the same function:
        "xla": the logits and weights materialised, [B, H, T, S] float32 (memory O(T S));
        "chunked": online softmax over tiles of queries and keys, memory O(T + S) in the
          forward and backward passes (see `chunked_attention`; dropout draws differ);
        "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`, NVIDIA GPUs
          with bfloat16/float16 inputs; no dropout, no return_weights.

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
    for name, valid, n in (("q_valid", q_valid, T), ("k_valid", k_valid, S)):
        if valid is not None:
            if jnp.result_type(valid) != jnp.bool_:
                raise TypeError(f"{name} must be boolean (True = real token), got {valid.dtype}")
            if valid.shape != (B, n):
                raise ValueError(f"{name} must have shape [B, {n}] = {(B, n)}, got {valid.shape}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation != "xla" and return_weights:
        raise ValueError(
            f"return_weights needs the materialised weights of implementation='xla', "
            f"got implementation={implementation!r}"
        )
    if implementation == "chunked":
        return chunked_attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            q_valid=q_valid,
            k_valid=k_valid,
            causal=causal,
            scale=scale,
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
        )
    if q_valid is not None or k_valid is not None:
        k_valid = jnp.ones((B, S), bool) if k_valid is None else k_valid
        mask = combine_masks(mask, padding_mask(q_valid, k_valid))
    if implementation == "cudnn":
        return _cudnn_attention(q, k, v, mask, bias, causal, scale, dropout_rate)
    if causal:
        mask = combine_masks(mask, causal_mask(T, S))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    G = H // K

    q_BTKGD = q.reshape(B, T, K, G, D)
    logits = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k, preferred_element_type=jnp.float32)
    logits = logits * jnp.float32(scale)
    if bias is not None:
        logits = logits + split_heads(bias.astype(jnp.float32), H, K)
    weights_BKGTS = masked_softmax(logits, None if mask is None else split_heads(mask, H, K))

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


def _cudnn_attention(q, k, v, mask, bias, causal, scale, dropout_rate):
    """`jax.nn.dot_product_attention` with cuDNN's fused kernel; rows with no key give 0."""
    if jax.default_backend() != "gpu":
        raise ValueError(
            "implementation='cudnn' needs an NVIDIA GPU (cuDNN), but the default JAX backend "
            f"is {jax.default_backend()!r}; use implementation='xla' or 'chunked'"
        )
    if q.dtype not in (jnp.bfloat16, jnp.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            "implementation='cudnn' needs q, k and v all bfloat16 or all float16, got "
            f"{q.dtype}, {k.dtype}, {v.dtype}; use dtype='bfloat16' or implementation='xla'"
        )
    if dropout_rate > 0.0:
        raise ValueError(
            "implementation='cudnn' has no attention dropout in jax.nn.dot_product_attention; "
            "use attention_dropout_rate=0 or implementation='xla' or 'chunked'"
        )
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=None if bias is None else bias.astype(q.dtype),
        mask=mask,
        scale=scale,
        is_causal=causal,
        implementation="cudnn",
    )
    if mask is None:
        return out
    full = combine_masks(mask, causal_mask(q.shape[1], k.shape[1])) if causal else mask
    any_key = jnp.any(full, axis=-1, keepdims=True)  # [.., H | 1, T | 1, 1]
    any_key = any_key.reshape((1,) * (4 - any_key.ndim) + any_key.shape)  # [B|1, H|1, T|1, 1]
    return jnp.where(jnp.swapaxes(any_key, 1, 2), out, jnp.zeros_like(out))


def masked_softmax(logits: jax.Array, mask: jax.Array | None, axis: int = -1) -> jax.Array:
    """Softmax over `axis` of float32 `logits`, zero where `mask` is False.

    Rows with nothing to attend to (all masked, or all -inf) give zeros; neither the
    value nor the gradient is ever NaN or inf.
    """
    logits = logits.astype(jnp.float32)
    if mask is not None:
        if jnp.result_type(mask) != jnp.bool_:
            raise TypeError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        check_broadcastable("mask", mask, logits.shape, "logits' shape")
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    unnorm = jnp.exp(logits - row_max)
    if mask is not None:
        unnorm = jnp.where(mask, unnorm, 0.0)
    total = jnp.sum(unnorm, axis=axis, keepdims=True)
    return unnorm / jnp.where(total == 0.0, 1.0, total)


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
    implementation: str = "xla",
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W^Q_i, ...).

    Self-attention: x_kv is x_q. Cross-attention: x_kv is the encoder output.

    Args:
      x_q: [B, T, E] queries' source; x_kv: [B, S, E] keys' and values' source.
      params: the projections; H query heads, K key/value heads.
      mask: boolean, broadcastable to [B, H, T, S].
      dropout_rate, rng: attention-weight dropout, applied only when rng is given.
      rope_positions: (q_positions, k_positions), [B, T] and [B, S], to rotate q and k
        with rotary embeddings; None for none.
      return_weights: also return the attention probabilities [B, H, T, S].
      implementation: the attention kernel, "xla" | "chunked" | "cudnn" (see
        `scaled_dot_product_attention`).

    Returns:
      [B, T, E], and with `return_weights` the weights.
    """
    check_rank("x_q", x_q, 3, "[B, T, E]")
    check_rank("x_kv", x_kv, 3, "[B, S, E]")
    _check_params(params)
    E = params.wq.shape[0]
    for name, x in (("x_q", x_q), ("x_kv", x_kv)):
        check_float(name, x)
        if x.shape[-1] != E:
            raise ValueError(f"{name} has model dim {x.shape[-1]}, the projections expect {E}")
    q, k, v = _project_qkv(x_q, x_kv, params)
    if rope_positions is not None:
        q = apply_rope(q, rope_positions[0])
        k = apply_rope(k, rope_positions[1])
    out = scaled_dot_product_attention(
        q,
        k,
        v,
        mask,
        dropout_rate=dropout_rate if rng is not None else 0.0,
        dropout_rng=rng,
        return_weights=return_weights,
        implementation=implementation,
    )
    if return_weights:
        out, weights = out
        return merge_heads(out, params.wo, params.bo), weights
    return merge_heads(out, params.wo, params.bo)


def _project_qkv(x_q, x_kv, p: AttentionParams):
    """q [B, T, H, Dk], k [B, S, K, Dk], v [B, S, K, Dv] with one matrix product per input.

    Self-attention concatenates W^Q, W^K, W^V along the head axis ([E, H + 2K, D]) and
    cross-attention W^K, W^V: fewer, larger products, faster on CPU, the same values.
    Needs d_k = d_v; otherwise three products.
    """
    H, K = p.wq.shape[1], p.wk.shape[1]
    if p.wk.shape[2] != p.wv.shape[2]:
        return (
            project_heads(x_q, p.wq, p.bq),
            project_heads(x_kv, p.wk, p.bk),
            project_heads(x_kv, p.wv, p.bv),
        )
    if x_kv is x_q:
        qkv = project_heads(x_q, *_stack_heads((p.wq, p.wk, p.wv), (p.bq, p.bk, p.bv)))
        return qkv[:, :, :H], qkv[:, :, H : H + K], qkv[:, :, H + K :]
    kv = project_heads(x_kv, *_stack_heads((p.wk, p.wv), (p.bk, p.bv)))
    return project_heads(x_q, p.wq, p.bq), kv[:, :, :K], kv[:, :, K:]


def _stack_heads(ws, bs):
    """Projections [E, n_i, D] and their biases [n_i, D] (or None) joined on the head axis."""
    w = jnp.concatenate(ws, axis=1)
    if all(b is None for b in bs):
        return w, None
    bs = [
        jnp.zeros(w_.shape[1:], w_.dtype) if b is None else b for w_, b in zip(ws, bs, strict=True)
    ]
    return w, jnp.concatenate(bs, axis=0)


def project_heads(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """x [B, T, E] @ w [E, H, D] (+ b [H, D]) -> [B, T, H, D], accumulated in float32."""
    check_rank("x", x, 3, "[B, T, E]")
    check_rank("w", w, 3, "[E, H, D]")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(f"x has model dim {x.shape[-1]}, w {w.shape} expects E={w.shape[0]}")
    return einsum_f32("bte,ehd->bthd", x, w, b)


def merge_heads(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """Concatenate heads and project: x [B, T, H, D] @ w [H, D, E] (+ b [E]) -> [B, T, E],
    accumulated in float32."""
    check_rank("x", x, 4, "[B, T, H, D]")
    check_rank("w", w, 3, "[H, D, E]")
    if x.shape[2:] != w.shape[:2]:
        raise ValueError(f"x has heads [H, D] = {x.shape[2:]}, w {w.shape} expects {w.shape[:2]}")
    return einsum_f32("bthd,hde->bte", x, w, b)


def _check_params(p: AttentionParams) -> None:
    """Shapes of the projections agree: wq [E, H, Dk], wk [E, K, Dk], wv [E, K, Dv],
    wo [H, Dv, E] and the biases [H, Dk], [K, Dk], [K, Dv], [E]."""
    for name, layout in (("wq", "[E, H, Dk]"), ("wk", "[E, K, Dk]"), ("wv", "[E, K, Dv]")):
        check_rank(f"params.{name}", getattr(p, name), 3, layout)
    E, H, Dk = p.wq.shape
    K, Dv = p.wk.shape[1], p.wv.shape[2]
    expected = {
        "wk": ((E, K, Dk), "[E, K, Dk]"),
        "wv": ((E, K, Dv), "[E, K, Dv]"),
        "wo": ((H, Dv, E), "[H, Dv, E]"),
        "bq": ((H, Dk), "[H, Dk]"),
        "bk": ((K, Dk), "[K, Dk]"),
        "bv": ((K, Dv), "[K, Dv]"),
        "bo": ((E,), "[E]"),
    }
    for name, (shape, layout) in expected.items():
        if getattr(p, name) is not None:
            check_shape(f"params.{name}", getattr(p, name), shape, layout)
