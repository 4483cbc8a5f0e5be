"""Feed-forward, norms, encoder and decoder layers, the layer stacks, and the two stacks
together (`EncoderDecoder`, torch.nn.Transformer's shape), as NNX modules.

A layer holds its `BlockOptions`; the attention, feed-forward and norm modules inside it
hold parameters only and take options as call arguments."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer import functional as F
from jaxformer.checks import BadValue, as_given, check_instance, check_int
from jaxformer.config import LORA_TARGETS, TransformerConfig, lora_targets
from jaxformer.nn.attention import MultiHeadAttention
from jaxformer.nn.parameters import dropout_rng, dtype_of, lora_weight, param
from jaxformer.nn.sharding import constrain_batch


class FeedForward(nnx.Module):
    """W1 [E, F], W2 [F, E] (biases b1, b2 unless `use_bias=False`); `gated` adds
    W_gate [E, F] for SwiGLU. The call computes FFN(x) = act(x W1 + b1) W2 + b2."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        gated: bool = False,
        use_bias: bool = True,
        dtype: str = "float32",
        param_dtype: str = "float32",
        rngs: nnx.Rngs,
    ):
        check_int("d_model", d_model)
        check_int("d_ff", d_ff)
        E, pdt = d_model, dtype_of("param_dtype", param_dtype)
        init = nnx.initializers.xavier_uniform()
        self.w1 = param(rngs, init, (E, d_ff), ("embed", "mlp"), pdt)
        self.w2 = param(rngs, init, (d_ff, E), ("mlp", "embed"), pdt)
        if gated:
            self.w_gate = param(rngs, init, (E, d_ff), ("embed", "mlp"), pdt)
        if use_bias:
            self.b1 = param(rngs, nnx.initializers.zeros, (d_ff,), ("mlp",), pdt)
            self.b2 = param(rngs, nnx.initializers.zeros, (E,), ("embed",), pdt)
        self.gated, self.use_bias = gated, use_bias
        self.dtype = dtype_of("dtype", dtype)

    def params(self) -> F.FeedForwardParams:
        names = ("w1", "w2") + (("b1", "b2") if self.use_bias else ())
        names += ("w_gate",) if self.gated else ()
        return F.FeedForwardParams(**{n: lora_weight(self, n).astype(self.dtype) for n in names})

    def __call__(self, x: jax.Array, *, activation: str = "relu") -> jax.Array:
        """x [..., E] -> [..., E]; a gated activation (swiglu) needs a gated module."""
        return F.feed_forward(x, self.params(), activation=activation)


class Norm(nnx.Module):
    """The scale [E] (and bias [E] unless `use_bias=False`) of a LayerNorm or, without
    bias, an RMSNorm; the call normalises the last axis."""

    def __init__(
        self, d_model: int, *, use_bias: bool = True, param_dtype: str = "float32", rngs: nnx.Rngs
    ):
        check_int("d_model", d_model)
        pdt = dtype_of("param_dtype", param_dtype)
        self.scale = param(rngs, nnx.initializers.ones, (d_model,), ("norm",), pdt)
        if use_bias:
            self.bias = param(rngs, nnx.initializers.zeros, (d_model,), ("norm",), pdt)
        self.use_bias = use_bias

    def params(self) -> F.NormParams:
        return F.NormParams(self.scale[...], self.bias[...] if self.use_bias else None)

    def __call__(self, x: jax.Array, *, kind: str = "layer", eps: float = 1e-6) -> jax.Array:
        """x [..., E] -> [..., E]: LayerNorm (kind "layer") or RMSNorm ("rms")."""
        return F.normalize(x, self.params(), kind=kind, eps=eps)


def _attention(config: TransformerConfig, rngs: nnx.Rngs) -> MultiHeadAttention:
    return MultiHeadAttention(
        config.d_model,
        config.num_heads,
        num_kv_heads=config.num_kv_heads,
        key_dim=config.key_dim,
        value_dim=config.value_dim,
        use_bias=config.attention_bias,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        rngs=rngs,
    )


def _ffn(config: TransformerConfig, rngs: nnx.Rngs) -> FeedForward:
    return FeedForward(
        config.d_model,
        config.d_ff,
        gated=F.ACTIVATIONS[config.activation].options.get("gated", False),
        use_bias=config.ffn_bias,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        rngs=rngs,
    )


def make_norm(config: TransformerConfig, rngs: nnx.Rngs) -> Norm:
    """The Norm a config's layers use (no bias for a norm without one, as RMSNorm, or
    with norm_bias False)."""
    use_bias = F.NORMS[config.norm].options["bias"] and config.norm_bias
    return Norm(config.d_model, use_bias=use_bias, param_dtype=config.param_dtype, rngs=rngs)


class EncoderLayer(nnx.Module):
    """Self-attention and feed-forward sub-layers with residuals and norms (section 3.1)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        check_instance("config", config, TransformerConfig)
        self.self_attn = _attention(config, rngs)
        self.ffn = _ffn(config, rngs)
        self.norm1 = make_norm(config, rngs)
        self.norm2 = make_norm(config, rngs)
        self.opts = config.block_options()

    def params(self) -> F.EncoderLayerParams:
        return F.EncoderLayerParams(
            self.self_attn.params(), self.ffn.params(), self.norm1.params(), self.norm2.params()
        )

    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
        rope_positions: jax.Array | None = None,
    ) -> jax.Array:
        """x [B, T, E], mask broadcastable to [B, H, T, T] (or an AttentionMask) -> [B, T, E]."""
        return F.encoder_layer(
            x,
            self.params(),
            mask,
            self.opts,
            rng=dropout_rng(deterministic, rng),
            rope_positions=rope_positions,
        )


class DecoderLayer(nnx.Module):
    """Masked self-attention, cross-attention (unless `cross_attention=False`, as in a
    decoder-only model) and feed-forward sub-layers (section 3.1)."""

    def __init__(self, config: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        check_instance("config", config, TransformerConfig)
        self.self_attn = _attention(config, rngs)
        self.ffn = _ffn(config, rngs)
        self.norm1 = make_norm(config, rngs)
        self.norm3 = make_norm(config, rngs)
        if cross_attention:
            self.cross_attn = _attention(config, rngs)
            self.norm2 = make_norm(config, rngs)
        self.cross_attention = cross_attention
        self.opts = config.block_options()

    def params(self) -> F.DecoderLayerParams:
        cross = self.cross_attention
        return F.DecoderLayerParams(
            self_attn=self.self_attn.params(),
            cross_attn=self.cross_attn.params() if cross else None,
            ffn=self.ffn.params(),
            norm1=self.norm1.params(),
            norm2=self.norm2.params() if cross else None,
            norm3=self.norm3.params(),
        )

    def init_cache(self, batch_size: int, max_len: int, memory=None) -> F.DecoderLayerCache:
        """An empty cache of max_len positions (and the memory's projected keys/values)."""
        dtype = self.self_attn.dtype
        return F.decoder_layer_cache(self.params(), batch_size, max_len, dtype, memory=memory)

    def __call__(
        self,
        y: jax.Array,
        self_mask: jax.Array | None = None,
        *,
        memory: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
        deterministic: bool = True,
        rng: jax.Array | None = None,
        rope_positions: jax.Array | None = None,
        return_cross_attention: bool = False,
        cache: F.DecoderLayerCache | None = None,
        cache_positions: jax.Array | None = None,
    ) -> F.DecoderOutput:
        """y [B, T, E], memory [B, S, E] (encoder output) -> DecoderOutput, as
        `functional.decoder_layer`."""
        return F.decoder_layer(
            y,
            self.params(),
            self_mask,
            self.opts,
            memory=memory,
            cross_mask=cross_mask,
            rng=dropout_rng(deterministic, rng),
            rope_positions=rope_positions,
            return_cross_attention=return_cross_attention,
            cache=cache,
            cache_positions=cache_positions,
        )


class _Stack(nnx.Module):
    """N layers, then a final norm when the config asks for one (pre-LN); `scan_layers`
    stacks their parameters [N, ...] for one scan, `remat` recomputes each in the backward."""

    def __init__(self, layers: list[nnx.Module], config: TransformerConfig, rngs: nnx.Rngs):
        self.layers = _stacked(layers) if config.scan_layers else nnx.List(layers)
        self.num_layers, self.scan, self.remat = len(layers), config.scan_layers, config.remat
        self.final_norm = make_norm(config, rngs) if config.use_final_norm else None
        if self.final_norm is not None:
            self.final_norm_kind, self.final_norm_eps = config.norm, config.norm_eps

    def _final(self, y: jax.Array) -> jax.Array:
        if self.final_norm is None:
            return y
        return self.final_norm(y, kind=self.final_norm_kind, eps=self.final_norm_eps)


class EncoderStack(_Stack):
    """`num_encoder_layers` encoder layers, then the final norm if any."""

    site_name = "encoder"  # its layers' sites are encoder/<i>/... (functional/sites.py)

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        check_instance("config", config, TransformerConfig)
        layers = [EncoderLayer(config, rngs=rngs) for _ in range(config.num_encoder_layers)]
        super().__init__(layers, config, rngs)

    def __call__(self, x, mask=None, *, rng=None, rope_positions=None) -> jax.Array:
        """x [B, S, E] -> [B, S, E]. Dropout is applied when rng is given."""

        def call(layer, x, key, _):
            y = layer(x, mask, deterministic=key is None, rng=key, rope_positions=rope_positions)
            return F.DecoderOutput(y)

        return self._final(_run_layers(self, call, x, rng).y)


class DecoderStack(_Stack):
    """`num_decoder_layers` decoder layers (with or without cross-attention), then the
    final norm if any."""

    site_name = "decoder"

    def __init__(self, config: TransformerConfig, *, cross_attention: bool = True, rngs: nnx.Rngs):
        check_instance("config", config, TransformerConfig)
        layers = [
            DecoderLayer(config, cross_attention=cross_attention, rngs=rngs)
            for _ in range(config.num_decoder_layers)
        ]
        super().__init__(layers, config, rngs)

    def init_cache(self, batch_size: int, max_len: int, memory=None) -> tuple:
        """One `DecoderLayerCache` per layer."""
        return tuple(
            layer.init_cache(batch_size, max_len, memory) for layer in _layer_modules(self)
        )

    def __call__(
        self,
        y,
        self_mask=None,
        *,
        memory=None,
        cross_mask=None,
        rng=None,
        rope_positions=None,
        return_cross_attention=False,
        cache=None,
        cache_positions=None,
    ) -> F.DecoderOutput:
        """y [B, T, E] -> DecoderOutput(y, cross-attention weights [L, B, H, T, S] with
        `return_cross_attention`, the updated caches with `cache` (from `init_cache`) and
        cache_positions [B, T]); dropout when rng is given."""

        def call(layer, y, key, layer_cache):
            return layer(
                y,
                self_mask,
                memory=memory,
                cross_mask=cross_mask,
                deterministic=key is None,
                rng=key,
                rope_positions=rope_positions,
                return_cross_attention=return_cross_attention,
                cache=layer_cache,
                cache_positions=cache_positions,
            )

        out = _run_layers(self, call, y, rng, cache=cache)
        return out._replace(y=self._final(out.y))


class EncoderDecoder(nnx.Module):
    """The body of the Transformer (figure 1 without embeddings, positions or the output
    projection): an `EncoderStack` over already-embedded sources and a `DecoderStack`
    with cross-attention over its output. The counterpart of `torch.nn.Transformer`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        check_instance("config", config, TransformerConfig)
        self.encoder = EncoderStack(config, rngs=rngs)
        self.decoder = DecoderStack(config, cross_attention=True, rngs=rngs)

    def __call__(
        self,
        src: jax.Array,
        tgt: jax.Array,
        src_mask: jax.Array | None = None,
        tgt_mask: jax.Array | None = None,
        memory_mask: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """src [B, S, E], tgt [B, T, E] -> [B, T, E]; dropout when rng is given.

        Masks: boolean (True = may attend), broadcastable to src_mask [B, H, S, S], tgt_mask
        [B, H, T, T], memory_mask [B, H, T, S], or `functional.AttentionMask`s. As in torch,
        nothing is causal unless tgt_mask says so (`functional.AttentionMask(causal=True)`)."""
        k_enc, k_dec = (None, None) if rng is None else tuple(jax.random.split(rng))
        memory = self.encoder(src, src_mask, rng=k_enc)
        return self.decoder(tgt, tgt_mask, memory=memory, cross_mask=memory_mask, rng=k_dec).y


# jax.checkpoint policies by `TransformerConfig.remat`: "full" saves nothing.
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _run_layers(stack: _Stack, call, x, rng, *, cache=None) -> F.DecoderOutput:
    """x through `stack.layers` by `call(layer, x, key, layer_cache) -> DecoderOutput`:
    the last output, cross-attention weights stacked [N, ...] and per-layer caches (or None).

    Stacked layers without a cache run as one jax.lax.scan over the layer's state (not
    nnx.scan / nnx.remat, which refuse arrays from an enclosing trace); with one, one by one."""

    def step(layer, x, key, layer_cache):
        out = call(layer, x, key, layer_cache)
        return out._replace(y=constrain_batch(out.y))

    if stack.remat != "none":
        step = _rematerialised(step, REMAT_POLICIES[stack.remat])
    keys = None if rng is None else jax.random.split(rng, stack.num_layers)
    if stack.scan and cache is None:
        if F.sites.active():
            raise BadValue(
                "sites are named per layer: capture and intervene with scan_layers=False"
            )
        graphdef, stacked = nnx.split(stack.layers)

        def body(x, layer_and_key):
            out = step(nnx.merge(graphdef, layer_and_key[0]), x, layer_and_key[1], None)
            return out.y, out.cross_weights

        return F.DecoderOutput(*jax.lax.scan(body, x, (stacked, keys)))
    keys = [None] * stack.num_layers if keys is None else list(keys)
    caches = [None] * stack.num_layers if cache is None else list(cache)
    outs = []
    for i, (layer, key, layer_cache) in enumerate(
        zip(_layer_modules(stack), keys, caches, strict=True)
    ):
        with F.sites.scope(f"{stack.site_name}/{i}"):
            outs.append(step(layer, x, key, layer_cache))
        x = outs[-1].y
    weights = [o.cross_weights for o in outs if o.cross_weights is not None]
    return F.DecoderOutput(
        x,
        jnp.stack(weights) if weights else None,
        None if cache is None else tuple(o.cache for o in outs),
    )


def _layer_modules(stack) -> list[nnx.Module]:
    """The layers of a stack one by one (slices of stacked parameters with scan_layers)."""
    if not stack.scan:
        return list(stack.layers)
    graphdef, stacked = nnx.split(stack.layers)
    return [
        nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked))
        for i in range(stack.num_layers)
    ]


def _rematerialised(step, policy):
    """`step(layer, *args)` under jax.checkpoint: its intermediates are recomputed in the
    backward pass, except those `policy` saves."""

    def run(layer, *args):
        graphdef, state = nnx.split(layer)
        pure = lambda state, *args: step(nnx.merge(graphdef, state), *args)  # noqa: E731
        return jax.checkpoint(pure, policy=policy)(state, *args)

    return run


def _stacked(layers: list[nnx.Module]) -> nnx.Module:
    """One layer module holding the parameters of `layers` stacked [N, ...] in order (the
    same values as unstacked: the same initialisation), logical axes led by "layers"."""
    graphdef, _ = nnx.split(layers[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.split(la)[1] for la in layers))
    for _, variable in nnx.to_flat_state(stacked):
        variable.set_metadata(out_sharding=("layers", *variable.get_metadata()["out_sharding"]))
    return nnx.merge(graphdef, stacked)


def add_lora(model: nnx.Module, rank: int, *, alpha=None, targets: str | None = None, seed=0):
    """`model`, its projections that `targets` names ("q,v", LORA_TARGETS) given `nnx.LoRA`
    adapters in place: A [d_in, r] he-uniform, B [r, d_out] zero (nnx.LoRAParam), the weight
    W + (alpha / r) A B (alpha default r). Stacked layers (scan_layers) get stacked ones."""
    check_int("lora_rank", rank)
    targets = lora_targets(targets)
    rngs, scale = nnx.Rngs(seed), (rank if alpha is None else alpha) / rank
    axes = dict(out_sharding=(None, None), eager_sharding=False)  # replicated
    meta = dict(a_metadata=axes, b_metadata=axes)
    for module in _projection_modules(model):
        kept = 3 if isinstance(module, MultiHeadAttention) else 2  # a layer's weight's axes
        for name in (n for t in targets for n in LORA_TARGETS[t] if hasattr(module, n)):
            shape = getattr(module, name).shape
            n_in = 2 if name == "wo" else 1
            d_in, d_out = math.prod(shape[-kept:][:n_in]), math.prod(shape[-kept:][n_in:])
            if rank > min(d_in, d_out):
                raise BadValue(
                    f"{as_given('lora_rank', rank)} is more than {name}'s min(d_in, d_out) = "
                    f"min({d_in}, {d_out})"
                )
            new = functools.partial(nnx.LoRA, d_in, rank, d_out, rngs=rngs, **meta)
            lora = _stacked([new() for _ in range(shape[0])]) if len(shape) > kept else new()
            lora.scale = scale
            setattr(module, f"{name}_lora", lora)
    return model


def merge_lora(model: nnx.Module) -> nnx.Module:
    """A copy of `model` whose adapted weights hold W + (alpha / r) A B, without adapters
    (what an export writes); a model without adapters is copied unchanged."""
    model = nnx.clone(model)
    for module in _projection_modules(model):
        for name in [n for n in vars(module) if n.endswith("_lora")]:
            weight = name.removesuffix("_lora")
            getattr(module, weight).set_value(lora_weight(module, weight))
            delattr(module, name)
    return model


def _projection_modules(model: nnx.Module) -> list[nnx.Module]:
    kinds = MultiHeadAttention | FeedForward
    return [m for _, m in nnx.iter_graph(model) if isinstance(m, kinds)]
