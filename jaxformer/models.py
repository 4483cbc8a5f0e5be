"""The models, all from the same blocks: the paper's encoder-decoder `Transformer`, the
decoder-only `DecoderLM`, and the encoder-only `Encoder`.

Models are deterministic unless called with `deterministic=False` and an `rng`. Token
arrays are int [B, T]; `valid` arrays bool [B, T] (True = real token; None = all real)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import functional as F
from jaxformer.checks import (
    BadType,
    BadValue,
    as_given,
    check_bool_array,
    check_float_array,
    check_instance,
    check_int,
    check_int_array,
    check_rank,
    check_shape,
)
from jaxformer.config import TransformerConfig
from jaxformer.nn import DecoderStack, Embed, EncoderStack, LearnedPositions, make_norm
from jaxformer.nn.parameters import dropout_rng, dtype_of, param
from jaxformer.nn.sharding import constrain_batch


class _Inputs(nnx.Module):
    """Token embedding (* sqrt(E) with `embed_scale`) + positions, an optional norm
    (`embed_norm`), then dropout (sections 3.4, 3.5, 5.4)."""

    def __init__(self, config: TransformerConfig, embed: Embed | None, *, rngs: nnx.Rngs):
        c = config
        self.embed = embed or _embed(config, rngs)
        learned = c.position_embedding == "learned"
        self.positions = (
            LearnedPositions(c.max_len, c.d_model, param_dtype=c.param_dtype, rngs=rngs)
            if learned
            else None
        )
        self.norm = make_norm(c, rngs) if c.embed_norm else None
        self.config = c

    def __call__(self, tokens, positions, rng):
        """tokens [B, T], positions [B, T] -> [B, T, E]."""
        c = self.config
        x = self.embed(tokens)
        if c.position_embedding in F.POSITIONS.names:
            x = x + _position_table(c)[positions].astype(x.dtype)
        elif c.position_embedding == "learned":
            x = x + self.positions(positions).astype(x.dtype)
        if self.norm is not None:
            x = self.norm(x, kind=c.norm, eps=c.norm_eps)
        return constrain_batch(F.dropout(x, c.dropout_rate, rng))


def _position_table(c: TransformerConfig) -> jax.Array:
    """The registered table [max_len, d_model] of `c.position_embedding`, checked."""
    table = jnp.asarray(F.POSITIONS[c.position_embedding].fn(c.max_len, c.d_model))
    if table.shape != (c.max_len, c.d_model) or not jnp.issubdtype(table.dtype, jnp.floating):
        raise BadValue(
            f"position_embedding {c.position_embedding!r} gave a {table.dtype} table of shape "
            f"{table.shape}; it must be a float [max_len, d_model] = [{c.max_len}, {c.d_model}]"
        )
    return table


class DecodeCache(NamedTuple):
    """The decoder's state between steps: a pytree with the batch leading every leaf (so
    beam search can reorder it); row b's next token takes position `lengths[b]`."""

    layers: tuple[F.DecoderLayerCache, ...]  # per decoder layer; self-attention [B, S_max, ..]
    lengths: jax.Array  # [B] int32: tokens held per row
    src_valid: jax.Array | None  # [B, S] bool: real source tokens (encoder-decoder only)


class Transformer(nnx.Module):
    """The encoder-decoder of Vaswani et al. (2017), figure 1; with `share_embeddings` (the
    paper) one matrix embeds source and target tokens and produces the logits."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        _need_layers(config, encoder=True, decoder=True)
        self.config = config
        self.src_inputs = _Inputs(config, None, rngs=rngs)
        shared = self.src_inputs.embed if config.share_embeddings else None
        self.tgt_inputs = _Inputs(config, shared, rngs=rngs)
        self.output_embed = None if config.share_embeddings else _embed(config, rngs)
        self.logits_bias = _logits_bias(config, rngs)
        self.encoder = EncoderStack(config, rngs=rngs)
        self.decoder = DecoderStack(config, cross_attention=True, rngs=rngs)

    def encode(
        self,
        src_tokens: jax.Array,
        src_valid: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """src_tokens [B, S] -> memory [B, S, E]."""
        _check_tokens(self.config, "src_tokens", src_tokens, src_valid, "src_valid")
        rng = dropout_rng(deterministic, rng)
        return _encode(self.src_inputs, self.encoder, self.config, src_tokens, src_valid, rng)

    def decode(
        self,
        tgt_tokens: jax.Array,
        memory: jax.Array,
        src_valid: jax.Array | None = None,
        tgt_valid: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """tgt_tokens [B, T] (shifted right), memory [B, S, E] -> logits [B, T, V] (float32)."""
        rng = dropout_rng(deterministic, rng)
        y = self._decoder(tgt_tokens, memory, src_valid, tgt_valid, rng, False).y
        return _logits(self, self.tgt_inputs, y)

    def cross_attention_weights(
        self,
        src_tokens: jax.Array,
        tgt_tokens: jax.Array,
        src_valid: jax.Array | None = None,
        tgt_valid: jax.Array | None = None,
    ) -> jax.Array:
        """Every decoder layer's encoder-decoder attention weights [L, B, H, T, S] for
        sources [B, S] and (shifted) targets [B, T]: what the model aligned."""
        memory = self.encode(src_tokens, src_valid)
        return self._decoder(tgt_tokens, memory, src_valid, tgt_valid, None, True).cross_weights

    def _decoder(self, tgt_tokens, memory, src_valid, tgt_valid, rng, return_cross_attention):
        """The decoder stack over the target inputs: F.DecoderOutput."""
        _check_tokens(self.config, "tgt_tokens", tgt_tokens, tgt_valid, "tgt_valid")
        _check_memory(self.config, memory, tgt_tokens, src_valid)
        k_in, k_layers = _split2(rng)
        positions = _default_positions(tgt_tokens)
        y = self.tgt_inputs(tgt_tokens, positions, k_in)
        return self.decoder(
            y,
            F.AttentionMask(causal=True, k_lengths=F.padding_lengths(tgt_valid)),
            memory=memory.astype(y.dtype),
            cross_mask=F.AttentionMask(k_lengths=F.padding_lengths(src_valid)),
            rng=k_layers,
            rope_positions=_rope(self.config, positions),
            return_cross_attention=return_cross_attention,
        )

    def __call__(
        self,
        src_tokens: jax.Array,
        tgt_tokens: jax.Array,
        src_valid: jax.Array | None = None,
        tgt_valid: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """src_tokens [B, S], tgt_tokens [B, T] -> logits [B, T, V] (float32)."""
        y = self.hidden(
            src_tokens, tgt_tokens, src_valid, tgt_valid, deterministic=deterministic, rng=rng
        )
        return _logits(self, self.tgt_inputs, y)

    def hidden(
        self,
        src_tokens: jax.Array,
        tgt_tokens: jax.Array,
        src_valid: jax.Array | None = None,
        tgt_valid: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The decoder's last outputs [B, T, E], before the output projection (`output_head`):
        what `__call__` turns into logits."""
        _check_tokens(self.config, "src_tokens", src_tokens, src_valid, "src_valid")
        _check_tokens(self.config, "tgt_tokens", tgt_tokens, tgt_valid, "tgt_valid")
        if src_tokens.shape[:1] != tgt_tokens.shape[:1]:
            raise BadValue(
                f"src_tokens batch {src_tokens.shape[:1]} != tgt_tokens batch {tgt_tokens.shape[:1]}"
            )
        rng = dropout_rng(deterministic, rng)
        k_enc, k_dec = _split2(rng)
        memory = self.encode(src_tokens, src_valid, deterministic=deterministic, rng=k_enc)
        k_dec = dropout_rng(deterministic, k_dec)
        return self._decoder(tgt_tokens, memory, src_valid, tgt_valid, k_dec, False).y

    def output_head(self) -> tuple[jax.Array, jax.Array | None]:
        """The output projection: (table [V, E] in the compute dtype, bias [V] float32 or
        None); logits = y @ table^T + bias."""
        return _head(self, self.tgt_inputs)

    def init_cache(
        self, src_tokens: jax.Array, src_valid: jax.Array | None = None, *, max_len: int
    ) -> DecodeCache:
        """Encode src_tokens [B, S] once and prepare to decode up to `max_len` target
        tokens (BOS included): every layer's cross-attention keys and values of the memory,
        and empty self-attention caches."""
        _check_cache_len(self.config, max_len)
        memory = self.encode(src_tokens, src_valid)
        layers = self.decoder.init_cache(src_tokens.shape[0], max_len, memory)
        return DecodeCache(layers, jnp.zeros(src_tokens.shape[:1], jnp.int32), src_valid)

    def extend(
        self, tgt_tokens: jax.Array, cache: DecodeCache, tgt_valid: jax.Array | None = None
    ) -> tuple[jax.Array, DecodeCache]:
        """Decode tgt_tokens [B, T] after the tokens in `cache`: (logits [B, T, V], cache);
        prefill and one step (T = 1) alike, without dropout."""
        return _extend(self, self.tgt_inputs, tgt_tokens, cache, tgt_valid)


class DecoderLM(nnx.Module):
    """A decoder-only language model: causal self-attention layers, tied output projection
    (unless `share_embeddings=False`). Uses `config.num_decoder_layers`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        _need_layers(config, encoder=False, decoder=True)
        self.config = config
        self.inputs = _Inputs(config, None, rngs=rngs)
        self.output_embed = None if config.share_embeddings else _embed(config, rngs)
        self.logits_bias = _logits_bias(config, rngs)
        self.decoder = DecoderStack(config, cross_attention=False, rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,
        valid: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """tokens [B, T] -> next-token logits [B, T, V] (float32). Packed rows pass
        `segment_ids` [B, T] (1, 2, ... per document, 0 = padding; the attention kernel
        takes them as ids, and `valid` is then not needed) and `positions` [B, T]
        restarting at 0 in each document."""
        kw = dict(positions=positions, segment_ids=segment_ids, deterministic=deterministic)
        y = self.hidden(tokens, valid, **kw, rng=rng)
        return _logits(self, self.inputs, y)

    def hidden(
        self,
        tokens: jax.Array,
        valid: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The last layer's outputs [B, T, E], before the output projection (`output_head`):
        what `__call__` turns into logits."""
        _check_tokens(self.config, "tokens", tokens, valid, "valid")
        for name, ids in (("positions", positions), ("segment_ids", segment_ids)):
            if ids is not None:
                check_int_array(name, ids, f"of {name.replace('_', ' ')}")
                if ids.shape != tokens.shape:
                    raise BadValue(f"{name} shape {ids.shape} != tokens shape {tokens.shape}")
        if positions is None:
            positions = _default_positions(tokens)
        rng = dropout_rng(deterministic, rng)
        k_in, k_layers = _split2(rng)
        x = self.inputs(tokens, positions, k_in)
        lengths = F.padding_lengths(valid)  # packed documents travel as ids, not as a mask
        mask = F.AttentionMask(True, lengths, q_segments=segment_ids)  # keys: the same ids
        return self.decoder(x, mask, rng=k_layers, rope_positions=_rope(self.config, positions)).y

    def output_head(self) -> tuple[jax.Array, jax.Array | None]:
        """The output projection: (table [V, E] in the compute dtype, bias [V] float32 or
        None); logits = y @ table^T + bias."""
        return _head(self, self.inputs)

    def init_cache(self, batch_size: int, *, max_len: int) -> DecodeCache:
        """Empty caches for `batch_size` rows of up to `max_len` tokens (prompt included)."""
        _check_cache_len(self.config, max_len)
        layers = self.decoder.init_cache(batch_size, max_len)
        return DecodeCache(layers, jnp.zeros((batch_size,), jnp.int32), None)

    def extend(
        self, tokens: jax.Array, cache: DecodeCache, valid: jax.Array | None = None
    ) -> tuple[jax.Array, DecodeCache]:
        """Run tokens [B, T] after the tokens in `cache`: (next-token logits [B, T, V], cache).

        Prefill (T = the prompt's length) and a step (T = 1) alike, without dropout. Row b's
        tokens take positions and cache slots lengths[b], lengths[b] + 1, ...; `valid`
        [B, T] (right padding) advances lengths by its row sums (T without it), so a padded
        slot is overwritten by the row's next token before anything attends to it. The
        caller keeps lengths + T <= the cache's max_len."""
        return _extend(self, self.inputs, tokens, cache, valid)


class Encoder(nnx.Module):
    """An encoder-only model: token embeddings, positions and encoder layers. Returns the
    contextual representations [B, S, E]. Uses `config.num_encoder_layers`."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        _need_layers(config, encoder=True, decoder=False)
        self.config = config
        self.inputs = _Inputs(config, None, rngs=rngs)
        self.encoder = EncoderStack(config, rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,
        valid: jax.Array | None = None,
        *,
        deterministic: bool = True,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """tokens [B, S] -> [B, S, E]."""
        _check_tokens(self.config, "tokens", tokens, valid, "valid")
        rng = dropout_rng(deterministic, rng)
        return _encode(self.inputs, self.encoder, self.config, tokens, valid, rng)


def _encode(inputs: _Inputs, encoder: EncoderStack, config, tokens, valid, rng) -> jax.Array:
    """The encoder stack over the inputs of tokens [B, S]: [B, S, E]."""
    k_in, k_layers = _split2(rng)
    positions = _default_positions(tokens)
    mask = F.AttentionMask(k_lengths=F.padding_lengths(valid))
    x = inputs(tokens, positions, k_in)
    return encoder(x, mask, rng=k_layers, rope_positions=_rope(config, positions))


def _extend(model, inputs: _Inputs, tokens, cache: DecodeCache, valid):
    """The cached decoder pass shared by `Transformer.extend` and `DecoderLM.extend`."""
    _check_tokens(model.config, "tokens", tokens, valid, "valid")
    if not isinstance(cache, DecodeCache):
        raise BadType(f"cache must be a DecodeCache from init_cache, got {type(cache).__name__}")
    B, T = tokens.shape
    S_max = cache.layers[0].self_attn.k.shape[1]
    if cache.lengths.shape != (B,):
        raise BadValue(f"tokens batch {B} != the cache's batch {cache.lengths.shape[0]}")
    if T > S_max:
        raise BadValue(f"{T} tokens do not fit a cache of max_len={S_max}")
    positions = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    x = inputs(tokens, positions, None)
    self_mask = F.causal_mask(T, S_max, offset=cache.lengths[:, None, None, None])
    cross_mask = F.AttentionMask(k_lengths=F.padding_lengths(cache.src_valid))
    out = model.decoder(
        x,
        self_mask,
        cross_mask=cross_mask,
        rope_positions=_rope(model.config, positions),
        cache=cache.layers,
        cache_positions=positions,
    )
    logits = _logits(model, inputs, out.y)
    advance = T if valid is None else jnp.sum(valid, axis=1, dtype=jnp.int32)
    return logits, cache._replace(layers=out.cache, lengths=cache.lengths + advance)


def _check_cache_len(config: TransformerConfig, max_len) -> None:
    check_int("max_len", max_len)
    if config.position_table and max_len > config.max_len:
        raise BadValue(
            f"a cache of max_len={max_len} positions exceeds the model's max_len="
            f"{config.max_len} ({config.position_embedding} position table)"
        )


MODEL_KINDS = {"Transformer": Transformer, "DecoderLM": DecoderLM, "Encoder": Encoder}


def count_params(model: nnx.Module, kind=nnx.Param) -> int:
    """The number of scalar parameters (a shared matrix counts once), of `kind` (a LoRA
    run's nnx.LoRAParam: what it trains)."""
    check_instance("model", model, nnx.Module)
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, kind)))


def _logits(model, inputs: _Inputs, y: jax.Array) -> jax.Array:
    """y [B, T, E] -> logits [B, T, V] (float32): the output projection (the embedding
    matrix unless untied), plus the logits bias if the model has one."""
    logits = (model.output_embed or inputs.embed).attend(y).astype(jnp.float32)
    if model.logits_bias is not None:
        logits = logits + model.logits_bias[...].astype(jnp.float32)[None, None, :]
    return logits


def _head(model, inputs: _Inputs) -> tuple[jax.Array, jax.Array | None]:
    """`output_head`: the matrix and bias `_logits` applies, for a loss applying them."""
    embed = model.output_embed or inputs.embed
    bias = None if model.logits_bias is None else model.logits_bias[...].astype(jnp.float32)
    return embed.table[...].astype(embed.dtype), bias


def _logits_bias(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.Param | None:
    if not config.logits_bias:
        return None
    pdt = dtype_of("param_dtype", config.param_dtype)
    return param(rngs, nnx.initializers.zeros, (config.vocab_size,), ("vocab",), pdt)


def _embed(config: TransformerConfig, rngs: nnx.Rngs) -> Embed:
    return Embed(
        config.vocab_size,
        config.d_model,
        scale=config.embed_scale,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
        rngs=rngs,
    )


def _need_layers(config: TransformerConfig, *, encoder: bool, decoder: bool) -> None:
    check_instance("config", config, TransformerConfig)
    if encoder and config.num_encoder_layers < 1:
        raise BadValue("this model needs num_encoder_layers >= 1")
    if decoder and config.num_decoder_layers < 1:
        raise BadValue("this model needs num_decoder_layers >= 1")


def _check_tokens(config, name, tokens, valid, valid_name) -> None:
    check_rank(name, tokens, 2, "[B, T]")
    check_int_array(name, tokens)
    if valid is not None:
        if valid.shape != tokens.shape:
            raise BadValue(f"{valid_name} shape {valid.shape} != {name} shape {tokens.shape}")
        check_bool_array(valid_name, valid, "(True = real token)")
        _check_right_padding(valid_name, valid)
    T = tokens.shape[1]
    if T < 1:
        raise BadValue(f"{name} has length 0; sequences need at least one token")
    if config.position_table and T > config.max_len:
        raise BadValue(
            f"{name} has length {T} > {as_given('max_len', config.max_len)} of the "
            f"{config.position_embedding} position table; raise {as_given('max_len')}"
        )


def _check_right_padding(valid_name, valid) -> None:
    """valid [B, T] marks a prefix of each row: the models pass padding to attention as
    lengths (`functional.padding_lengths`). Checked when the values are known (not traced)."""
    if isinstance(valid, jax.core.Tracer):
        return
    valid = np.asarray(valid)
    lengths = valid.sum(axis=1)
    if (valid != (np.arange(valid.shape[1]) < lengths[:, None])).any():
        raise BadValue(
            f"{valid_name} must mark a prefix of each row (right padding); padding is "
            "passed to attention as lengths"
        )


def _check_memory(config, memory, tgt_tokens, src_valid) -> None:
    check_rank("memory", memory, 3, "[B, S, E]")
    check_float_array("memory", memory)
    if memory.shape[2] != config.d_model:
        raise BadValue(
            f"memory has model dim {memory.shape[2]}, the model's d_model is {config.d_model}"
        )
    if memory.shape[0] != tgt_tokens.shape[0]:
        raise BadValue(f"memory batch {memory.shape[0]} != tgt_tokens batch {tgt_tokens.shape[0]}")
    if src_valid is not None:
        check_shape("src_valid", src_valid, memory.shape[:2], "memory's [B, S]")


def _default_positions(tokens: jax.Array) -> jax.Array:
    B, T = tokens.shape
    return jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def _rope(config: TransformerConfig, positions: jax.Array) -> jax.Array | None:
    return positions if config.position_embedding == "rope" else None


def _split2(rng):
    return (None, None) if rng is None else tuple(jax.random.split(rng))
