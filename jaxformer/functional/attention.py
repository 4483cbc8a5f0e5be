"""Scaled dot-product attention (Vaswani et al., 2017, eq. 1), with grouped key/value heads.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Layout follows `jax.nn.dot_product_attention`: q [B, T, H, D], k [B, S, K, D],
v [B, S, K, Dv]. H query heads share K key/value heads in groups of G = H / K
(K = H: multi-head, K = 1: multi-query, otherwise grouped-query attention);
query head h reads key/value head h // G."""

from __future__ import annotations

import functools
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import (
    BadType,
    BadValue,
    as_given,
    check_bool_array,
    check_broadcastable,
    check_divisible,
    check_float_array,
    check_number,
    check_rank,
    check_shape,
)
from jaxformer.functional import sites
from jaxformer.functional.chunked_attention import chunked_attention
from jaxformer.functional.kernels import (
    AUTO_RULES,
    NO_SEGMENTS,
    attention_device,
    device_families,
    device_problem,
    mosaic_problem,
    zero_rows_without_keys,
)
from jaxformer.functional.masks import (
    AttentionMask,
    check_lengths,
    check_segments,
    fold_masks,
    split_heads,
)
from jaxformer.functional.matmul import einsum_f32, einsum_to_f32
from jaxformer.functional.positions import apply_rope
from jaxformer.functional.registry import ATTENTION
from jaxformer.functional.splash import splash_problem

# "auto" runs "chunked" instead of "xla" when the float32 logits [B, H, T, S] of the plain
# implementation would take more than this many bytes (the weights take as much again).
AUTO_CHUNKED_BYTES = 1 << 30
_log = logging.getLogger("jaxformer.attention")


def scaled_dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    bias: jax.Array | None = None,
    causal: bool = False,
    k_lengths: jax.Array | None = None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    q_valid: jax.Array | None = None,
    k_valid: jax.Array | None = None,
    q_segments: jax.Array | None = None,
    k_segments: jax.Array | None = None,
    implementation: str = "auto",
) -> jax.Array:
    """softmax(q k^T * scale + bias, masked) v: [B, T, H, Dv] in q's dtype.

    Args:
      q: [B, T, H, D] queries; k: [B, S, K, D] keys, K dividing H; v: [B, S, K, Dv] values.
      mask: boolean, broadcastable to [B, H, T, S]; True = may attend.
      bias: float, broadcastable to [B, H, T, S]; added to the scaled logits.
      causal: query t sees keys s <= t only, as a flag kernels apply without a [T, S] mask.
      k_lengths: [B] int, keys s >= k_lengths[b] are padding.
      scale: logit scale; default 1 / sqrt(D).
      dropout_rate: dropout on the attention weights (needs `dropout_rng` when > 0).
      q_valid, k_valid: bool [B, T] and [B, S], True = real token.
      q_segments, k_segments: int [B, T] and [B, S], packed documents' ids (k_segments None:
        q_segments', self-attention): a query sees the keys of its own id only; id 0
        (padding) sees nothing.
      implementation: "auto" (`choose_implementation`) or a kernel in ATTENTION: "xla"
        ([B, H, T, S] float32 weights), "chunked" (online softmax, memory O(T + S)),
        "cudnn", "tokamax_*" (functional/kernels.py) or "splash" (TPU); same function.

    The softmax runs in float32; a query with no key to attend to gives zero output."""
    _check_attention(q, k, v, mask, bias, q_valid, k_valid, k_lengths)
    check_segments(q_segments, k_segments, *_bts(q, k))
    check_number("dropout_rate", dropout_rate, "[0, 1)")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise BadValue("dropout_rate > 0 needs a dropout_rng")
    ATTENTION.check(implementation, also=("auto",))
    if implementation == "auto":
        explicit = any(x is not None for x in (mask, bias, q_valid, k_valid))
        segmented = q_segments is not None
        implementation = choose_implementation(
            q,
            k,
            v,
            masked=explicit or causal or k_lengths is not None or segmented,
            dropout_rate=dropout_rate,
            padded=k_lengths is not None,
            explicit=explicit,
            dense=mask is not None or bias is not None,
            segmented=segmented,
        )
    kernel = ATTENTION[implementation]
    kw = dict(bias=bias, scale=scale, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    structure = dict(q_valid=q_valid, k_valid=k_valid, k_lengths=k_lengths, causal=causal)
    structure |= dict(q_segments=q_segments, k_segments=k_segments)
    if kernel.options.get("raw_masks"):
        return kernel.fn(q, k, v, mask=mask, **structure, **kw)
    return kernel.fn(q, k, v, mask=fold_masks(*_bts(q, k), mask, **structure), **kw)


@functools.partial(ATTENTION.register, "xla", raw_masks=True)
def _plain_attention(q, k, v, *, mask, bias, scale, dropout_rate, dropout_rng, **structure):
    """The logits and weights materialised: [B, H, T, S] float32; the mask is formed here,
    from the flag, lengths and segment ids (name scope "xla_attention")."""
    kw = dict(bias=bias, scale=scale, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    with jax.named_scope("xla_attention"):
        mask = fold_masks(*_bts(q, k), mask, **structure)
        weights_BKGTS = _weights(q, k, mask, kw["bias"], kw["scale"])
        return _weighted_values(weights_BKGTS, v, q.dtype, kw["dropout_rate"], kw["dropout_rng"])


ATTENTION.register("chunked", chunked_attention, raw_masks=True)


def attention_weights(
    q: jax.Array,
    k: jax.Array,
    mask: jax.Array | None = None,
    *,
    bias: jax.Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> jax.Array:
    """softmax(q k^T * scale + bias, masked): the attention probabilities [B, H, T, S]
    (float32) of `scaled_dot_product_attention` with the same arguments (before dropout)."""
    _check_attention(q, k, k, mask, bias, None, None, None)
    B, T, H, _ = q.shape
    weights_BKGTS = _weights(q, k, fold_masks(*_bts(q, k), mask, causal=causal), bias, scale)
    return weights_BKGTS.reshape(B, H, T, k.shape[1])


def _bts(q, k) -> tuple[int, int, int]:
    """B, T, S of q [B, T, H, D] and k [B, S, K, D]."""
    return q.shape[0], q.shape[1], k.shape[1]


def _weights(q, k, mask, bias, scale):
    """The softmax weights [B, K, G, T, S] (float32) of grouped heads h = k * G + g."""
    B, T, H, D = q.shape
    K = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_BTKGD = q.reshape(B, T, K, H // K, D)
    logits = einsum_to_f32("btkgd,bskd->bkgts", q_BTKGD, k)
    logits = logits * jnp.float32(scale)
    if bias is not None:
        logits = logits + split_heads(bias.astype(jnp.float32), H, K)
    return masked_softmax(logits, None if mask is None else split_heads(mask, H, K))


def _weighted_values(weights_BKGTS, v, dtype, dropout_rate, dropout_rng):
    """The weights (after dropout) times the values: [B, T, H, Dv] in `dtype`."""
    B, K, G, T, _ = weights_BKGTS.shape
    probs = weights_BKGTS
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = einsum_f32("bkgts,bskd->btkgd", probs.astype(v.dtype), v)
    return out.reshape(B, T, K * G, v.shape[-1]).astype(dtype)


def choose_implementation(
    q,
    k,
    v,
    *,
    masked: bool,
    dropout_rate: float,
    padded: bool = False,
    explicit: bool = False,
    dense: bool = False,
    segmented: bool = False,
) -> str:
    """The implementation "auto" runs (masked: any masking; padded: key lengths; explicit:
    a mask, bias or validity vectors; dense: a mask or bias; segmented: packed documents'
    segment ids): the first row of `AUTO_RULES` for the target device whose kernel takes
    the call; else "chunked" when the plain logits would exceed AUTO_CHUNKED_BYTES; else
    "xla". Logged (INFO) with each refused row's reason, once per shape and reason."""
    B, T, H, _ = q.shape
    S = k.shape[1]
    families = device_families(*attention_device())
    refused = []
    for rule in AUTO_RULES:
        if rule.family not in families or (rule.max_keys is not None and S > rule.max_keys):
            continue
        flags = dict(padded=padded, explicit=explicit, dense=dense, segmented=segmented)
        problem = _problem(rule.implementation, q, k, v, masked, dropout_rate, **flags)
        if problem is None:
            choice, reason = rule.implementation, f"{families[0]}: {rule.evidence}"
            break
        refused.append(f"no {rule.implementation}: {problem[1]}")
    else:
        logits_mib = 4 * B * H * T * S / 2**20
        if logits_mib * 2**20 > AUTO_CHUNKED_BYTES:
            budget = AUTO_CHUNKED_BYTES / 2**20
            choice, reason = "chunked", f"plain logits need {logits_mib:.0f} MiB > {budget:.0f} MiB"
        else:
            choice, reason = "xla", f"plain logits need {logits_mib:.1f} MiB"
    reason = "; ".join([reason, *refused])
    _log_once(f"attention on {families[0]}, q {q.shape} k {k.shape} {q.dtype}: {choice} ({reason})")
    return choice


@functools.cache
def _log_once(message: str) -> None:
    """Log `message` (INFO) the first time it is asked for in this process."""
    _log.info(message)


def _problem(implementation, q, k, v, masked, dropout_rate, *, padded, explicit, dense, segmented):
    """Why `implementation` (a row of AUTO_RULES) cannot take this call, or None."""
    if implementation == "splash":
        return splash_problem(q, k, v, explicit=dense, dropout_rate=dropout_rate)
    if implementation == "cudnn":
        return _cudnn_problem(q, k, v, masked, dropout_rate, segmented)
    if implementation == "tokamax_mosaic":
        flags = dict(padded=padded, explicit=explicit, segmented=segmented)
        return mosaic_problem(q, k, v, dropout_rate=dropout_rate, **flags)
    return None


def _cudnn_problem(q, k, v, masked, dropout_rate, segmented) -> tuple[type, str] | None:
    """Why cuDNN's fused attention cannot take this call (error type, reason), or None."""
    if segmented:
        return BadValue, f"takes no segment ids: {NO_SEGMENTS.format('jax.nn')}"
    backend, device = attention_device()
    if backend != "gpu" or "nvidia" not in device.device_kind.lower():
        return BadValue, f"needs an NVIDIA GPU, the backend is {backend!r}"
    if q.dtype not in (jnp.bfloat16, jnp.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        dtypes = f"{q.dtype}, {k.dtype}, {v.dtype}"
        return BadType, f"needs q, k and v all bfloat16 or all float16, got {dtypes}"
    if dropout_rate > 0.0:
        return BadValue, "has no attention dropout in jax.nn.dot_product_attention"
    D, Dv = q.shape[-1], v.shape[-1]
    if D != Dv or D > 128 or D % 8:
        return BadValue, f"takes equal q/v head dims <= 128, multiples of 8; got {D}, {Dv}"
    if masked and (q.shape[1] % 2 or k.shape[1] % 2):
        return (
            BadValue,
            f"takes a mask with even lengths only; got T={q.shape[1]}, S={k.shape[1]}",
        )
    return device_problem("cudnn", device)


@functools.partial(ATTENTION.register, "cudnn", raw_masks=True)
def _cudnn_attention(
    q, k, v, *, mask, q_valid, k_valid, k_lengths, q_segments, k_segments, causal, bias, scale,
    dropout_rate, dropout_rng,
):  # fmt: skip
    """`jax.nn.dot_product_attention` with cuDNN's fused kernel: causality as is_causal and
    key lengths as key_value_seq_lengths inside it; rows with no key give 0."""
    del dropout_rng, k_segments  # no dropout, no segments: refused below
    B, T, S = _bts(q, k)
    mask = fold_masks(B, T, S, mask, q_valid=q_valid, k_valid=k_valid)
    masked = mask is not None or bias is not None or causal or k_lengths is not None
    problem = _cudnn_problem(q, k, v, masked, dropout_rate, q_segments is not None)
    if problem is not None:
        error, reason = problem
        impl = functools.partial(as_given, "implementation")
        raise error(f"{impl('cudnn')} {reason}; use {impl('xla')} or 'chunked'")
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=None if bias is None else _full_lengths(bias.astype(q.dtype), T, S),
        mask=None if mask is None else _full_lengths(mask, T, S),
        scale=scale,
        is_causal=causal,
        key_value_seq_lengths=k_lengths,
        implementation="cudnn",
    )
    return zero_rows_without_keys(out, mask, causal, k_lengths)


def _full_lengths(x, T: int, S: int):
    """A mask or bias [.., H | 1, T | 1, S | 1] as [B | 1, H | 1, T, S]: cuDNN takes a bias
    with both lengths whole (jax turns a mask into such a bias)."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    return jnp.broadcast_to(x, x.shape[:2] + (T, S))


def masked_softmax(logits: jax.Array, mask: jax.Array | None, axis: int = -1) -> jax.Array:
    """Softmax over `axis` of float32 `logits`, zero where `mask` is False; rows with
    nothing to attend to (all masked, or all -inf) give zeros, and neither the value nor
    the gradient is ever NaN or inf."""
    logits = logits.astype(jnp.float32)
    if mask is not None:
        check_bool_array("mask", mask)
        check_broadcastable("mask", mask, logits.shape, "logits' shape")
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    row_max = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    unnorm = jnp.exp(logits - row_max)
    if mask is not None:
        unnorm = jnp.where(mask, unnorm, 0.0)
    total = jnp.sum(unnorm, axis=axis, keepdims=True)
    return unnorm / jnp.where(total == 0.0, 1.0, total)


def _check_attention(q, k, v, mask, bias, q_valid, k_valid, k_lengths) -> None:
    """Ranks, dtypes and matching sizes of q, k, v, the mask, bias, validity and lengths."""
    check_rank("q", q, 4, "[B, T, H, D]")
    check_rank("k", k, 4, "[B, S, K, D]")
    check_rank("v", v, 4, "[B, S, K, Dv]")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_array(name, x)
    B, T, H, D = q.shape
    _, S, K, _ = k.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise BadValue(f"batch sizes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[3] != D:
        raise BadValue(
            f"q head dim D={D} (q shape {q.shape}) != k head dim {k.shape[3]} (k shape {k.shape})"
        )
    if v.shape[1:3] != (S, K):
        raise BadValue(f"v shape {v.shape} must match k's [B, S, K] = {k.shape[:3]} in S and K")
    check_divisible("query heads H", H, "key/value heads K", K)
    if mask is not None:
        check_bool_array("mask", mask)
        check_broadcastable("mask", mask, (B, H, T, S), "[B, H, T, S]")
    if bias is not None:
        check_float_array("bias", bias)
        check_broadcastable("bias", bias, (B, H, T, S), "[B, H, T, S]")
    for name, valid, n in (("q_valid", q_valid, T), ("k_valid", k_valid, S)):
        if valid is not None:
            check_bool_array(name, valid, "(True = real token)")
            check_shape(name, valid, (B, n), f"[B, {n}]")
    if k_lengths is not None:
        check_lengths("k_lengths", k_lengths, B)


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


class AttentionOutput(NamedTuple):
    """What `multi_head_attention` returns, whatever its options."""

    out: jax.Array  # [B, T, E]
    weights: jax.Array | None = None  # [B, H, T, S] float32, with return_weights
    kv_cache: KVCache | None = None  # the updated cache, when given one


def multi_head_attention(
    x_q: jax.Array,
    x_kv: jax.Array | None,
    params: AttentionParams,
    mask: jax.Array | None = None,
    *,
    dropout_rate: float = 0.0,
    rng: jax.Array | None = None,
    rope_positions: tuple[jax.Array, jax.Array] | None = None,
    return_weights: bool = False,
    implementation: str = "auto",
    kv_cache: KVCache | None = None,
    cache_positions: jax.Array | None = None,
) -> AttentionOutput:
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W^Q_i, ...).

    Args:
      x_q: [B, T, E] queries' source; x_kv: [B, S, E] keys' and values' source.
      params: the projections; H query heads, K key/value heads.
      mask: boolean, broadcastable to [B, H, T, S] ([B, H, T, S_max] with a cache), or an
        `AttentionMask` (the causal flag, key lengths and segment ids as structure).
      dropout_rate, rng: attention-weight dropout, applied only when rng is given.
      rope_positions: (q_positions [B, T], k_positions [B, S]) for rotary embeddings, or None.
      return_weights: also return the attention probabilities (runs "xla"; "auto" allows it).
      implementation: the attention kernel (see `scaled_dot_product_attention`).
      kv_cache: for decoding: with `cache_positions` [B, T], x_kv's keys and values are
        written at those slots; without, it holds `project_kv`'s memory and x_kv is None.

    Returns:
      AttentionOutput(out [B, T, E], weights or None, updated kv_cache or None)."""
    _check_inputs(x_q, x_kv, params, kv_cache, cache_positions)
    if return_weights and implementation not in ("xla", "auto"):
        raise BadValue(
            "return_weights needs the materialised weights of implementation='xla', "
            f"got {as_given('implementation', implementation)}"
        )
    if x_kv is None:
        q, kv = project_heads(x_q, params.wq, params.bq), kv_cache
    else:
        q, kv = _project_qkv(x_q, x_kv, params)
    if rope_positions is not None:
        q = apply_rope(q, rope_positions[0])
        if x_kv is not None:
            kv = kv._replace(k=apply_rope(kv.k, rope_positions[1]))
    if x_kv is not None and kv_cache is not None:
        kv = kv_cache = write_kv(kv_cache, kv, cache_positions)
    dropout_rate = dropout_rate if rng is not None else 0.0
    structure = mask if isinstance(mask, AttentionMask) else AttentionMask(dense=mask)
    weights = None
    if return_weights or sites.wanted("weights"):
        heads, weights = attention_with_weights(q, kv.k, kv.v, structure, dropout_rate, rng)
    else:
        heads = scaled_dot_product_attention(
            q,
            kv.k,
            kv.v,
            structure.dense,
            causal=structure.causal,
            k_lengths=structure.k_lengths,
            q_segments=structure.q_segments,
            k_segments=structure.k_segments,
            dropout_rate=dropout_rate,
            dropout_rng=rng,
            implementation=implementation,
        )
    heads = sites.site("heads", heads)
    out = merge_heads(heads, params.wo, params.bo)
    return AttentionOutput(out, weights if return_weights else None, kv_cache)


def attention_with_weights(
    q, k, v, structure: AttentionMask, dropout_rate: float = 0.0, dropout_rng=None
) -> tuple[jax.Array, jax.Array]:
    """`scaled_dot_product_attention` as "xla" computes it, for when the weights are wanted:
    (heads [B, T, H, Dv] in q's dtype, weights [B, H, T, S] float32 before dropout), the
    weights passed through the "weights" site, where a capture reads or replaces them."""
    B, T, S = _bts(q, k)
    if structure.k_lengths is not None:
        check_lengths("mask.k_lengths", structure.k_lengths, B)
    check_segments(structure.q_segments, structure.k_segments, B, T, S)
    dense = structure.as_array(T, S)
    _check_attention(q, k, v, dense, None, None, None, None)
    weights_BKGTS = _weights(q, k, dense, None, None)
    weights = sites.site("weights", weights_BKGTS.reshape(B, q.shape[2], T, S))
    heads = _weighted_values(
        weights.reshape(weights_BKGTS.shape), v, q.dtype, dropout_rate, dropout_rng
    )
    return heads, weights


def _check_inputs(x_q, x_kv, params, kv_cache, cache_positions) -> None:
    """x_q [B, T, E] and x_kv [B, S, E] (or a cache instead) fit the projections."""
    check_rank("x_q", x_q, 3, "[B, T, E]")
    if x_kv is not None:
        check_rank("x_kv", x_kv, 3, "[B, S, E]")
    _check_params(params)
    E = params.wq.shape[0]
    named = (("x_q", x_q),) if x_kv is None else (("x_q", x_q), ("x_kv", x_kv))
    for name, x in named:
        check_float_array(name, x)
        if x.shape[-1] != E:
            raise BadValue(f"{name} has model dim {x.shape[-1]}, the projections expect {E}")
    if (x_kv is None) != (kv_cache is not None and cache_positions is None):
        raise BadValue(
            "x_kv must be given, except with a kv_cache and no cache_positions "
            "(attention over keys and values projected before)"
        )


class KVCache(NamedTuple):
    """Keys and values of one attention layer for decoding; slot s holds position s."""

    k: jax.Array  # [B, S_max, K, Dk]
    v: jax.Array  # [B, S_max, K, Dv]


def project_kv(
    x_kv: jax.Array, params: AttentionParams, rope_positions: jax.Array | None = None
) -> KVCache:
    """The keys and values of x_kv [B, S, E]: k [B, S, K, Dk] (rotated when rope_positions
    [B, S] is given), v [B, S, K, Dv]; one matrix product when Dk = Dv."""
    K = params.wk.shape[1]
    if params.wk.shape[2] == params.wv.shape[2]:
        kv = project_heads(x_kv, *_stack_heads((params.wk, params.wv), (params.bk, params.bv)))
        k, v = kv[:, :, :K], kv[:, :, K:]
    else:
        k, v = project_heads(x_kv, params.wk, params.bk), project_heads(x_kv, params.wv, params.bv)
    if rope_positions is not None:
        k = apply_rope(k, rope_positions)
    return KVCache(k, v)


def write_kv(cache: KVCache, new: KVCache, positions: jax.Array) -> KVCache:
    """Write new keys and values [B, T, K, D] into slots `positions` [B, T] of each row;
    fixed shapes, so it runs under jit with traced positions (each row its own)."""
    check_rank("cache_positions", positions, 2, "[B, T]")
    if positions.shape != new.k.shape[:2]:
        raise BadValue(
            f"cache_positions shape {positions.shape} != the new keys' [B, T] {new.k.shape[:2]}"
        )
    rows = jnp.arange(positions.shape[0])[:, None]
    return KVCache(
        cache.k.at[rows, positions].set(new.k.astype(cache.k.dtype)),
        cache.v.at[rows, positions].set(new.v.astype(cache.v.dtype)),
    )


def _project_qkv(x_q, x_kv, p: AttentionParams) -> tuple[jax.Array, KVCache]:
    """q [B, T, H, Dk] and the keys and values. Self-attention with Dk = Dv runs one product
    of W^Q, W^K, W^V concatenated on the head axis ([E, H + 2K, D]): the same values, faster
    on CPU; otherwise q is one product and k, v come from `project_kv`."""
    H, K = p.wq.shape[1], p.wk.shape[1]
    if x_kv is x_q and p.wk.shape[2] == p.wv.shape[2]:
        qkv = project_heads(x_q, *_stack_heads((p.wq, p.wk, p.wv), (p.bq, p.bk, p.bv)))
        return qkv[:, :, :H], KVCache(qkv[:, :, H : H + K], qkv[:, :, H + K :])
    return project_heads(x_q, p.wq, p.bq), project_kv(x_kv, p)


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
        raise BadValue(f"x has model dim {x.shape[-1]}, w {w.shape} expects E={w.shape[0]}")
    return einsum_f32("bte,ehd->bthd", x, w, b)


def merge_heads(x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """Concatenate heads and project: x [B, T, H, D] @ w [H, D, E] (+ b [E]) -> [B, T, E],
    accumulated in float32."""
    check_rank("x", x, 4, "[B, T, H, D]")
    check_rank("w", w, 3, "[H, D, E]")
    if x.shape[2:] != w.shape[:2]:
        raise BadValue(f"x has heads [H, D] = {x.shape[2:]}, w {w.shape} expects {w.shape[:2]}")
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
