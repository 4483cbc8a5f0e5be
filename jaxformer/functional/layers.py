"""Feed-forward, normalisation, dropout, embeddings, and the encoder and decoder layers.

A layer is a composition of sub-layers, each wrapped as (section 5.4 and 3.1 of the paper)

    post-LN (the paper):  LayerNorm(x + Dropout(Sublayer(x)))
    pre-LN  (modern):     x + Dropout(Sublayer(LayerNorm(x)))

Parameters are NamedTuples of arrays; static choices one frozen `BlockOptions`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import (
    BadValue,
    check_choice,
    check_float_array,
    check_int_array,
    check_number,
    check_rank,
    check_shape,
)
from jaxformer.functional import sites
from jaxformer.functional.attention import (
    AttentionParams,
    KVCache,
    multi_head_attention,
    project_kv,
)
from jaxformer.functional.matmul import einsum_f32
from jaxformer.functional.registry import ACTIVATIONS, ATTENTION, NORMS
from jaxformer.functional.sites import scope, site

NORM_PLACEMENTS = ("post", "pre")
# The built-in feed-forward activations: gelu is exact (erf); gelu_tanh is its tanh
# approximation (GPT-2's "gelu_new"); silu is x * sigmoid(x) ("swish", Marian); swiglu is
# gated (Shazeer, 2020). More can be registered (see registry.py).
ACTIVATIONS.register("relu", jax.nn.relu)
ACTIVATIONS.register("gelu", partial(jax.nn.gelu, approximate=False))
ACTIVATIONS.register("gelu_tanh", partial(jax.nn.gelu, approximate=True))
ACTIVATIONS.register("silu", jax.nn.silu)
ACTIVATIONS.register("swiglu", lambda h, gate: jax.nn.silu(gate) * h, gated=True)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """Static choices of a layer (hashable, so usable as a `jit` static argument)."""

    norm: str = "layer"  # a registered norm: "layer" (the paper), "rms", ...
    norm_placement: str = "post"  # "post" (the paper) | "pre"
    norm_eps: float = 1e-6
    activation: str = "relu"  # a registered activation; relu is the paper's
    dropout_rate: float = 0.0  # residual dropout, P_drop
    attention_dropout_rate: float = 0.0
    attention_impl: str = "auto"  # "auto" or a registered kernel: see scaled_dot_product_attention

    def __post_init__(self):
        ATTENTION.check(self.attention_impl, what="attention_impl", also=("auto",))
        NORMS.check(self.norm)
        check_choice("norm_placement", self.norm_placement, NORM_PLACEMENTS)
        ACTIVATIONS.check(self.activation)
        check_number("dropout_rate", self.dropout_rate, "[0, 1)")
        check_number("attention_dropout_rate", self.attention_dropout_rate, "[0, 1)")
        check_number("norm_eps", self.norm_eps, "(0, inf)")


class NormParams(NamedTuple):
    scale: jax.Array  # [E]
    bias: jax.Array | None = None  # [E]; LayerNorm's beta (None for RMSNorm)


class FeedForwardParams(NamedTuple):
    """FFN(x) = act(x W1 + b1) W2 + b2 (eq. 2); SwiGLU: (silu(x W_gate) * x W1) W2 + b2."""

    w1: jax.Array  # [E, F]
    w2: jax.Array  # [F, E]
    b1: jax.Array | None = None  # [F]
    b2: jax.Array | None = None  # [E]
    w_gate: jax.Array | None = None  # [E, F], SwiGLU only


class EncoderLayerParams(NamedTuple):
    self_attn: AttentionParams
    ffn: FeedForwardParams
    norm1: NormParams
    norm2: NormParams


class DecoderLayerParams(NamedTuple):
    self_attn: AttentionParams
    cross_attn: AttentionParams | None  # None in a decoder-only model
    ffn: FeedForwardParams
    norm1: NormParams  # around self-attention
    norm2: NormParams | None  # around cross-attention (None in a decoder-only model)
    norm3: NormParams  # around the feed-forward network


class DecoderLayerCache(NamedTuple):
    """What a decoder layer keeps between decoding steps."""

    self_attn: KVCache  # [B, S_max, K, D]: keys and values of the tokens so far
    cross_attn: KVCache | None  # [B, S, K, D]: the memory's, projected once (None: no memory)


def decoder_layer_cache(
    params: DecoderLayerParams,
    batch_size: int,
    max_len: int,
    dtype,
    *,
    memory: jax.Array | None = None,
) -> DecoderLayerCache:
    """An empty self-attention cache of `max_len` slots per row and, given memory [B, S, E],
    the cross-attention keys and values of the memory."""
    if (memory is None) != (params.cross_attn is None):
        raise BadValue("memory must be given exactly when the layer has cross-attention")
    _, K, Dk = params.self_attn.wk.shape
    Dv = params.self_attn.wv.shape[-1]
    self_kv = KVCache(
        jnp.zeros((batch_size, max_len, K, Dk), dtype),
        jnp.zeros((batch_size, max_len, K, Dv), dtype),
    )
    cross_kv = None if memory is None else project_kv(memory.astype(dtype), params.cross_attn)
    return DecoderLayerCache(self_kv, cross_kv)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None = None, *, eps: float = 1e-6):
    """(x - mean) / sqrt(var + eps) * scale + bias over the last axis, in float32."""
    _check_norm_args(x, scale, bias)
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps) * _last_axis(scale, x.ndim)
    if bias is not None:
        y = y + _last_axis(bias, x.ndim)
    return y.astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * scale over the last axis, in float32."""
    _check_norm_args(x, scale, None)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return (y * _last_axis(scale, x.ndim)).astype(x.dtype)


def _last_axis(v: jax.Array, ndim: int) -> jax.Array:
    """v [E] in float32, shaped [1, ..., 1, E] to scale a rank-`ndim` array's last axis."""
    return v.astype(jnp.float32).reshape((1,) * (ndim - 1) + v.shape)


def _check_norm_args(x, scale, bias) -> None:
    check_float_array("x", x)
    E = x.shape[-1:]
    check_shape("scale", scale, E, "[E]")
    if bias is not None:
        check_shape("bias", bias, E, "[E]")


def normalize(x: jax.Array, params: NormParams, *, kind: str = "layer", eps: float = 1e-6):
    """The registered norm `kind` with `params`: LayerNorm ("layer"), RMSNorm ("rms",
    which has no bias), or one of your own (NORMS.register)."""
    variant = NORMS[kind]
    if params.bias is not None and not variant.options["bias"]:
        raise BadValue(f"norm {kind!r} has no bias, but NormParams.bias is given")
    return variant.fn(x, params, eps)


NORMS.register("layer", lambda x, p, eps: layer_norm(x, p.scale, p.bias, eps=eps), bias=True)
NORMS.register("rms", lambda x, p, eps: rms_norm(x, p.scale, eps=eps), bias=False)


def feed_forward(x: jax.Array, params: FeedForwardParams, *, activation: str = "relu"):
    """Position-wise feed-forward network (eq. 2): x [..., E] -> [..., E]; the products
    accumulate in float32 (`einsum_f32`), activations are in x's dtype."""
    check_float_array("x", x)
    variant = ACTIVATIONS[activation]
    gated = variant.options.get("gated", False)
    if gated and params.w_gate is None:
        raise BadValue(f"activation {activation!r} needs FeedForwardParams.w_gate (it is gated)")
    if not gated and params.w_gate is not None:
        raise BadValue(f"activation {activation!r} is not gated, but w_gate is given")
    check_rank("params.w1", params.w1, 2, "[E, F]")
    E, F = params.w1.shape
    if x.shape[-1] != E:
        raise BadValue(f"x has model dim {x.shape[-1]}, params.w1 {params.w1.shape} expects {E}")
    check_shape("params.w2", params.w2, (F, E), "[F, E]")
    x_NE = x.reshape(-1, E)
    h = einsum_f32("ne,ef->nf", x_NE, params.w1, params.b1)
    if gated:
        h = variant.fn(h, einsum_f32("ne,ef->nf", x_NE, params.w_gate))
    else:
        h = variant.fn(h)
    if sites.wanted("hidden"):  # the activations [..., F] as a site (functional/sites.py)
        h = site("hidden", h.reshape(*x.shape[:-1], F)).reshape(-1, F)
    return einsum_f32("nf,fe->ne", h, params.w2, params.b2).reshape(x.shape)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout: zero with probability `rate`, scale the rest by 1 / (1 - rate);
    the identity when rng is None or rate is 0."""
    check_number("rate", rate, "[0, 1)")
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def residual(
    x: jax.Array,
    sublayer: Callable[[jax.Array], jax.Array],
    norm: NormParams,
    opts: BlockOptions,
    rng: jax.Array | None,
) -> jax.Array:
    """One residual sub-layer with the norm placed as `opts.norm_placement` says:
    post: norm(x + dropout(sublayer(x))); pre: x + dropout(sublayer(norm(x)))."""
    return _residual_out(x, sublayer(_residual_in(x, norm, opts)), norm, opts, rng)


def _sublayer(name: str, x, sublayer, norm: NormParams, opts: BlockOptions, rng) -> jax.Array:
    """`residual` with the sites `<name>/in` and `<name>/out` (and the sub-layer's own
    sites under `<name>/`; see functional/sites.py)."""
    with scope(name):
        x = site("in", x)
        out = site("out", sublayer(_residual_in(x, norm, opts)))
    return _residual_out(x, out, norm, opts, rng)


def _residual_in(x: jax.Array, norm: NormParams, opts: BlockOptions) -> jax.Array:
    """What a residual sub-layer computes on: norm(x) with pre-LN, x with post-LN."""
    if opts.norm_placement == "post":
        return x
    return normalize(x, norm, kind=opts.norm, eps=opts.norm_eps)


def _residual_out(x, out, norm: NormParams, opts: BlockOptions, rng) -> jax.Array:
    """x + dropout(out), normalised with post-LN: the residual around sub-layer output `out`."""
    y = x + dropout(out, opts.dropout_rate, rng)
    if opts.norm_placement == "pre":
        return y
    return normalize(y, norm, kind=opts.norm, eps=opts.norm_eps)


def embed(tokens: jax.Array, table: jax.Array, *, scale: bool = True) -> jax.Array:
    """table[tokens] * sqrt(d_model) (section 3.4): tokens [...] int, table [V, E] -> [..., E]."""
    check_int_array("tokens", tokens)
    check_rank("table", table, 2, "[V, E]")
    out = jnp.take(table, tokens, axis=0)
    return out * jnp.asarray(math.sqrt(table.shape[-1]), out.dtype) if scale else out


def tied_logits(x: jax.Array, table: jax.Array) -> jax.Array:
    """Pre-softmax projection with the embedding matrix: x [..., E] @ table[V, E]^T ->
    [..., V] in x's dtype, accumulated in float32 (`einsum_f32`: in bfloat16 the backward
    products take bfloat16 operands too)."""
    check_rank("table", table, 2, "[V, E]")
    if x.shape[-1] != table.shape[1]:
        raise BadValue(
            f"x has model dim {x.shape[-1]}, table {table.shape} expects {table.shape[1]}"
        )
    logits_NV = einsum_f32("ne,ve->nv", x.reshape(-1, x.shape[-1]), table)
    return logits_NV.reshape(*x.shape[:-1], table.shape[0])


def encoder_layer(
    x: jax.Array,
    params: EncoderLayerParams,
    mask: jax.Array | None,
    opts: BlockOptions,
    *,
    rng: jax.Array | None = None,
    rope_positions: jax.Array | None = None,
) -> jax.Array:
    """Self-attention then feed-forward, each a residual sub-layer: x [B, T, E] -> [B, T, E];
    mask broadcastable to [B, H, T, T], rope_positions [B, T] with rotary embeddings."""
    check_rank("x", x, 3, "[B, T, E]")
    k_attn, k_res1, k_res2 = _split(rng, 3)
    rope = None if rope_positions is None else (rope_positions, rope_positions)

    def self_attention(h):
        return multi_head_attention(
            h,
            h,
            params.self_attn,
            mask,
            dropout_rate=opts.attention_dropout_rate,
            rng=k_attn,
            rope_positions=rope,
            implementation=opts.attention_impl,
        ).out

    x = _sublayer("self_attention", x, self_attention, params.norm1, opts, k_res1)
    ffn = partial(_feed_forward, params=params.ffn, opts=opts)
    return site("out", _sublayer("ffn", x, ffn, params.norm2, opts, k_res2))


class DecoderOutput(NamedTuple):
    """What a decoder layer (or a stack of them) returns, whatever its options."""

    y: jax.Array  # [B, T, E]
    cross_weights: jax.Array | None = None  # [B, H, T, S] ([L, B, H, T, S] from a stack)
    cache: DecoderLayerCache | None = None  # updated (a stack's: one per layer)


def decoder_layer(
    y: jax.Array,
    params: DecoderLayerParams,
    self_mask: jax.Array | None,
    opts: BlockOptions,
    *,
    memory: jax.Array | None = None,
    cross_mask: jax.Array | None = None,
    rng: jax.Array | None = None,
    rope_positions: jax.Array | None = None,
    return_cross_attention: bool = False,
    cache: DecoderLayerCache | None = None,
    cache_positions: jax.Array | None = None,
) -> DecoderOutput:
    """Masked self-attention, cross-attention over `memory`, feed-forward: [B, T, E] -> same.

    self_mask: broadcastable to [B, H, T, T] (include the causal mask).
    memory: [B, S, E] encoder output; None (and params.cross_attn None) in a decoder-only
    model. cross_mask: broadcastable to [B, H, T, S].
    return_cross_attention: also return the cross-attention weights [B, H, T, S].
    cache, cache_positions: decoding with a `decoder_layer_cache`: keys and values are
    written at cache_positions [B, T], self_mask ([B, H, T, S_max]) hides unwritten slots,
    and the memory comes from the cache (memory must be None)."""
    has_memory = _check_decoder_inputs(y, params, memory, cache, cache_positions)
    if return_cross_attention and not has_memory:
        raise BadValue("return_cross_attention needs a layer with cross-attention")
    k_self, k_cross, k_res1, k_res2, k_res3 = _split(rng, 5)
    rope = None if rope_positions is None else (rope_positions, rope_positions)
    attend = partial(multi_head_attention, dropout_rate=opts.attention_dropout_rate)
    outputs = {}

    def self_attention(h):
        outputs["self"] = attend(
            h,
            h,
            params.self_attn,
            self_mask,
            rng=k_self,
            rope_positions=rope,
            implementation=opts.attention_impl,
            cache_positions=cache_positions,
            kv_cache=None if cache is None else cache.self_attn,
        )
        return outputs["self"].out

    def cross_attention(h):
        outputs["cross"] = attend(
            h,
            memory,
            params.cross_attn,
            cross_mask,
            rng=k_cross,
            return_weights=return_cross_attention,
            # The weights exist only in the materialised implementation.
            implementation="xla" if return_cross_attention else opts.attention_impl,
            kv_cache=None if cache is None else cache.cross_attn,
        )
        return outputs["cross"].out

    y = _sublayer("self_attention", y, self_attention, params.norm1, opts, k_res1)
    if has_memory:
        y = _sublayer("cross_attention", y, cross_attention, params.norm2, opts, k_res2)
    ffn = partial(_feed_forward, params=params.ffn, opts=opts)
    y = site("out", _sublayer("ffn", y, ffn, params.norm3, opts, k_res3))
    cross_weights = outputs["cross"].weights if has_memory else None
    new_cache = None if cache is None else cache._replace(self_attn=outputs["self"].kv_cache)
    return DecoderOutput(y, cross_weights, new_cache)


def _feed_forward(h, params: FeedForwardParams, opts: BlockOptions) -> jax.Array:
    return feed_forward(h, params, activation=opts.activation)


def _check_decoder_inputs(y, params, memory, cache, cache_positions) -> bool:
    """Checks the arguments of `decoder_layer`; True when the layer attends to a memory."""
    check_rank("y", y, 3, "[B, T, E]")
    has_memory = memory is not None or (cache is not None and cache.cross_attn is not None)
    if has_memory != (params.cross_attn is not None):
        raise BadValue("memory must be given exactly when the layer has cross-attention")
    if cache is not None and (memory is not None or cache_positions is None):
        raise BadValue("with a cache, pass cache_positions and no memory (the cache holds it)")
    if memory is not None:
        check_rank("memory", memory, 3, "[B, S, E]")
        if memory.shape[-1] != y.shape[-1] or memory.shape[0] != y.shape[0]:
            raise BadValue(
                f"memory {memory.shape} must be [B, S, E] with y's B and E, y is {y.shape}"
            )
    return has_memory


def _split(rng: jax.Array | None, n: int) -> tuple[jax.Array | None, ...]:
    return (None,) * n if rng is None else tuple(jax.random.split(rng, n))
