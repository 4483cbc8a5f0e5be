"""Bad input across the public API. Each case asserts the exception type and that the
message names the offending argument (and what was given or expected).

Sections: functional, nn modules, models, configs, training, decoding, token ids, data
files, the CLI and checkpoints.
"""

import functools
import gc
import json
import pathlib
import re
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints, data, decode, files, nn, train
from jaxformer import functional as F
from jaxformer.checks import InputError
from jaxformer.cli import main
from tests import hf_tokenizers as hf

V = 11  # vocabulary of the tiny models


def f32(*shape):
    return jnp.ones(shape, jnp.float32)


def i32(*shape):
    return jnp.ones(shape, jnp.int32)


def b(*shape):
    return jnp.ones(shape, bool)


def config(**overrides):
    fields = dict(
        vocab_size=V,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_model=8,
        d_ff=16,
        num_heads=2,
        max_len=8,
    )
    return jf.TransformerConfig(**(fields | overrides))


@functools.cache
def model(kind="transformer"):
    cls = {"transformer": jf.Transformer, "lm": jf.DecoderLM, "encoder": jf.Encoder}[kind]
    return cls(config(), rngs=nnx.Rngs(0))


@functools.cache
def layer(kind):
    make = {
        "mha": lambda: nn.MultiHeadAttention(8, 2, rngs=nnx.Rngs(0)),
        "encoder_layer": lambda: nn.EncoderLayer(config(), rngs=nnx.Rngs(0)),
        "decoder_layer": lambda: nn.DecoderLayer(config(), rngs=nnx.Rngs(0)),
        "embed": lambda: nn.Embed(V, 8, rngs=nnx.Rngs(0)),
        "positions": lambda: nn.LearnedPositions(8, 8, rngs=nnx.Rngs(0)),
    }
    return make[kind]()


ATTN = F.AttentionParams(f32(8, 2, 4), f32(8, 2, 4), f32(8, 2, 4), f32(2, 4, 8))
FFN = F.FeedForwardParams(f32(8, 16), f32(16, 8))
q = f32(2, 3, 4, 8)

FUNCTIONAL = [
    ("sdpa q rank", lambda: F.scaled_dot_product_attention(f32(2, 3, 8), q, q), ValueError, r"q must have rank 4 \[B, T, H, D\], got shape \(2, 3, 8\)"),
    ("sdpa q dtype", lambda: F.scaled_dot_product_attention(i32(2, 3, 4, 8), q, q), TypeError, "q must be a floating-point array, got dtype int32"),
    ("sdpa k head dim", lambda: F.scaled_dot_product_attention(q, f32(2, 3, 4, 6), q), ValueError, "k head dim 6"),
    ("sdpa v shape", lambda: F.scaled_dot_product_attention(q, q, f32(2, 5, 4, 8)), ValueError, "v shape"),
    ("sdpa batch", lambda: F.scaled_dot_product_attention(q, f32(1, 3, 4, 8), f32(1, 3, 4, 8)), ValueError, "batch sizes differ"),
    ("sdpa kv heads", lambda: F.scaled_dot_product_attention(q, f32(2, 3, 3, 8), f32(2, 3, 3, 8)), ValueError, "query heads H=4 is not divisible by key/value heads K=3"),
    ("sdpa mask dtype", lambda: F.scaled_dot_product_attention(q, q, q, i32(3, 3)), TypeError, "mask must be a boolean array"),
    ("sdpa implementation", lambda: F.scaled_dot_product_attention(q, q, q, implementation="flash"), ValueError, r"implementation must be one of \('auto', .*'xla', 'chunked', 'cudnn'.*\), got 'flash'"),
    ("sdpa dropout_rate type", lambda: F.scaled_dot_product_attention(q, q, q, dropout_rate="0.1"), TypeError, "dropout_rate must be a number, got '0.1'"),
    ("attention_weights k rank", lambda: F.attention_weights(q, f32(2, 3, 8)), ValueError, r"k must have rank 4"),
    ("sdpa mask shape", lambda: F.scaled_dot_product_attention(q, q, q, b(5, 3)), ValueError, r"mask of shape \(5, 3\) is not broadcastable to \[B, H, T, S\]"),
    ("sdpa bias dtype", lambda: F.scaled_dot_product_attention(q, q, q, bias=i32(3, 3)), TypeError, "bias must be a floating-point"),
    ("sdpa dropout_rate", lambda: F.scaled_dot_product_attention(q, q, q, dropout_rate=1.0), ValueError, r"dropout_rate must be in \[0, 1\), got 1.0"),
    ("sdpa dropout_rng", lambda: F.scaled_dot_product_attention(q, q, q, dropout_rate=0.1), ValueError, "dropout_rate > 0 needs a dropout_rng"),
    ("masked_softmax mask dtype", lambda: F.masked_softmax(f32(2, 3), i32(2, 3)), TypeError, "mask must be a boolean array"),
    ("masked_softmax mask shape", lambda: F.masked_softmax(f32(2, 3), b(4)), ValueError, r"mask of shape \(4,\) is not broadcastable"),
    ("mha x_q rank", lambda: F.multi_head_attention(f32(3, 8), f32(2, 3, 8), ATTN), ValueError, r"x_q must have rank 3 \[B, T, E\]"),
    ("mha x_kv model dim", lambda: F.multi_head_attention(f32(2, 3, 8), f32(2, 3, 6), ATTN), ValueError, "x_kv has model dim 6, the projections expect 8"),
    ("mha x_q dtype", lambda: F.multi_head_attention(i32(2, 3, 8), f32(2, 3, 8), ATTN), TypeError, "x_q must be a floating-point"),
    ("mha params.wq rank", lambda: F.multi_head_attention(f32(2, 3, 8), f32(2, 3, 8), ATTN._replace(wq=f32(8, 8))), ValueError, r"params.wq must have rank 3 \[E, H, Dk\]"),
    ("mha params.wo shape", lambda: F.multi_head_attention(f32(2, 3, 8), f32(2, 3, 8), ATTN._replace(wo=f32(2, 5, 8))), ValueError, r"params.wo must have shape \[H, Dv, E\] = \(2, 4, 8\), got \(2, 5, 8\)"),
    ("mha params.bq shape", lambda: F.multi_head_attention(f32(2, 3, 8), f32(2, 3, 8), ATTN._replace(bq=f32(8))), ValueError, r"params.bq must have shape \[H, Dk\]"),
    ("project_heads x dim", lambda: F.project_heads(f32(2, 3, 7), f32(8, 2, 4)), ValueError, "x has model dim 7, w"),
    ("merge_heads heads", lambda: F.merge_heads(f32(2, 3, 2, 5), f32(2, 4, 8)), ValueError, r"x has heads \[H, D\] = \(2, 5\)"),
    ("causal_mask T=0", lambda: F.causal_mask(0), ValueError, "causal_mask's T must be >= 1, got 0"),
    ("causal_mask float T", lambda: F.causal_mask(2.5), TypeError, "causal_mask's T must be an int, got 2.5"),
    ("padding_mask dtype", lambda: F.padding_mask(None, i32(2, 3)), TypeError, "k_valid must be a boolean array"),
    ("padding_mask rank", lambda: F.padding_mask(None, b(3)), ValueError, "k_valid must have rank 2"),
    ("padding_mask batch", lambda: F.padding_mask(b(3, 3), b(2, 3)), ValueError, "batch sizes differ: q_valid"),
    ("segment_mask dtype", lambda: F.segment_mask(f32(2, 3), f32(2, 3)), TypeError, "q_segments must be an integer array of segment ids"),
    ("segment_mask batch", lambda: F.segment_mask(i32(2, 3), i32(3, 3)), ValueError, "batch sizes differ: q_segments"),
    ("combine_masks dtype", lambda: F.combine_masks(b(2, 3), i32(2, 3)), TypeError, r"masks\[1\] must be a boolean array"),
    ("combine_masks shapes", lambda: F.combine_masks(b(2, 3), b(4, 5)), ValueError, r"shapes \[\(2, 3\), \(4, 5\)\] do not broadcast"),
    ("sinusoidal odd d_model", lambda: F.sinusoidal_positions(4, 5), ValueError, "sinusoidal positions need an even d_model, got 5"),
    ("sinusoidal length", lambda: F.sinusoidal_positions(-1, 4), ValueError, "length must be >= 0, got -1"),
    ("sinusoidal length type", lambda: F.sinusoidal_positions(4.0, 4), TypeError, "length must be an int, got 4.0"),
    ("rope x rank", lambda: F.apply_rope(f32(2, 3, 8), jnp.arange(3)), ValueError, r"x must have rank 4 \[B, T, H, D\]"),
    ("rope odd head dim", lambda: F.apply_rope(f32(1, 2, 1, 3), jnp.arange(2)), ValueError, "rotary embeddings need an even head dim D, got 3"),
    ("rope positions dtype", lambda: F.apply_rope(f32(1, 2, 1, 4), f32(2)), TypeError, "positions must be an integer array of positions"),
    ("rope positions length", lambda: F.apply_rope(f32(1, 2, 1, 4), jnp.arange(3)), ValueError, r"positions must be \[T\] or \[B, T\] with T=2"),
    ("layer_norm scale", lambda: F.layer_norm(f32(2, 8), f32(7)), ValueError, r"scale must have shape \[E\] = \(8,\), got \(7,\)"),
    ("layer_norm bias", lambda: F.layer_norm(f32(2, 8), f32(8), f32(4)), ValueError, r"bias must have shape \[E\] = \(8,\)"),
    ("layer_norm x dtype", lambda: F.layer_norm(i32(2, 8), f32(8)), TypeError, "x must be a floating-point"),
    ("rms_norm scale", lambda: F.rms_norm(f32(2, 8), f32(7)), ValueError, r"scale must have shape \[E\]"),
    ("feed_forward x dim", lambda: F.feed_forward(f32(2, 7), FFN), ValueError, "x has model dim 7, params.w1"),
    ("feed_forward w2", lambda: F.feed_forward(f32(2, 8), FFN._replace(w2=f32(15, 8))), ValueError, r"params.w2 must have shape \[F, E\] = \(16, 8\)"),
    ("feed_forward activation", lambda: F.feed_forward(f32(2, 8), FFN, activation="tanh"), ValueError, "activation must be one of .* got 'tanh'"),
    ("feed_forward swiglu", lambda: F.feed_forward(f32(2, 8), FFN, activation="swiglu"), ValueError, "swiglu' needs FeedForwardParams.w_gate"),
    ("feed_forward stray gate", lambda: F.feed_forward(f32(2, 8), FFN._replace(w_gate=f32(8, 16))), ValueError, "activation 'relu' is not gated, but w_gate is given"),
    ("feed_forward activation type", lambda: F.feed_forward(f32(2, 8), FFN, activation=None), TypeError, "activation must be a string"),
    ("normalize kind", lambda: F.normalize(f32(2, 8), F.NormParams(f32(8)), kind="batch"), ValueError, "norm must be one of"),
    ("normalize rms bias", lambda: F.normalize(f32(2, 8), F.NormParams(f32(8), f32(8)), kind="rms"), ValueError, "norm 'rms' has no bias"),
    ("dropout rate", lambda: F.dropout(f32(3), 1.0, jax.random.key(0)), ValueError, r"rate must be in \[0, 1\), got 1.0"),
    ("dropout rate type", lambda: F.dropout(f32(3), "0.1", jax.random.key(0)), TypeError, "rate must be a number"),
    ("embed tokens dtype", lambda: F.embed(f32(2, 3), f32(5, 8)), TypeError, "tokens must be an integer array of token ids"),
    ("embed table rank", lambda: F.embed(i32(2, 3), f32(5)), ValueError, r"table must have rank 2 \[V, E\]"),
    ("tied_logits dim", lambda: F.tied_logits(f32(2, 7), f32(5, 8)), ValueError, "x has model dim 7, table"),
    ("BlockOptions norm", lambda: F.BlockOptions(norm="batch"), ValueError, "norm must be one of"),
    ("BlockOptions eps", lambda: F.BlockOptions(norm_eps=0), ValueError, "norm_eps must be > 0"),
    ("BlockOptions eps type", lambda: F.BlockOptions(norm_eps="1e-6"), TypeError, "norm_eps must be a number, got '1e-6'"),
    ("BlockOptions impl", lambda: F.BlockOptions(attention_impl="flash"), ValueError, "attention_impl must be one of"),
    ("BlockOptions dropout type", lambda: F.BlockOptions(dropout_rate="0.1"), TypeError, "dropout_rate must be a number"),
    ("encoder_layer x rank", lambda: layer("encoder_layer")(f32(3, 8)), ValueError, r"x must have rank 3 \[B, T, E\]"),
    ("encoder_layer mask", lambda: layer("encoder_layer")(f32(1, 3, 8), b(2, 3)), ValueError, r"mask of shape \(2, 3\) is not broadcastable"),
    ("decoder_layer memory missing", lambda: layer("decoder_layer")(f32(1, 3, 8)), ValueError, "memory must be given"),
    ("decoder_layer memory rank", lambda: layer("decoder_layer")(f32(1, 3, 8), memory=f32(3, 8)), ValueError, r"memory must have rank 3 \[B, S, E\]"),
    ("decoder_layer memory dim", lambda: layer("decoder_layer")(f32(1, 3, 8), memory=f32(1, 3, 6)), ValueError, r"memory \(1, 3, 6\) must be \[B, S, E\] with y's B and E"),
]  # fmt: skip

NN = [
    ("MultiHeadAttention num_heads", lambda: nn.MultiHeadAttention(8, 0, rngs=nnx.Rngs(0)), ValueError, "num_heads must be >= 1, got 0"),
    ("MultiHeadAttention d_model", lambda: nn.MultiHeadAttention(0, 2, rngs=nnx.Rngs(0)), ValueError, "d_model must be >= 1, got 0"),
    ("MultiHeadAttention d_model type", lambda: nn.MultiHeadAttention(8.0, 2, rngs=nnx.Rngs(0)), TypeError, "d_model must be an int, got 8.0"),
    ("MultiHeadAttention kv heads", lambda: nn.MultiHeadAttention(16, 4, num_kv_heads=3, rngs=nnx.Rngs(0)), ValueError, "num_heads=4 is not divisible by num_kv_heads=3"),
    ("MultiHeadAttention heads", lambda: nn.MultiHeadAttention(10, 4, rngs=nnx.Rngs(0)), ValueError, "d_model=10 is not divisible by num_heads=4"),
    ("MultiHeadAttention key_dim type", lambda: nn.MultiHeadAttention(8, 2, key_dim="4", rngs=nnx.Rngs(0)), TypeError, "key_dim must be an int, got '4'"),
    ("MultiHeadAttention dtype", lambda: nn.MultiHeadAttention(8, 2, dtype="float16", rngs=nnx.Rngs(0)), ValueError, r"dtype must be one of \('float32', 'bfloat16'\), got 'float16'"),
    ("MultiHeadAttention dropout", lambda: layer("mha")(f32(1, 3, 8), dropout_rate=1.5, rng=jax.random.key(0), deterministic=False), ValueError, "dropout_rate must be in"),
    ("MultiHeadAttention implementation", lambda: layer("mha")(f32(1, 3, 8), implementation="flash"), ValueError, "implementation must be one of"),
    ("MultiHeadAttention x rank", lambda: layer("mha")(f32(3, 8)), ValueError, "x_q must have rank 3"),
    ("MultiHeadAttention dropout rng", lambda: layer("mha")(f32(1, 3, 8), deterministic=False), ValueError, "deterministic=False needs rng"),
    ("FeedForward d_ff", lambda: nn.FeedForward(8, 0, rngs=nnx.Rngs(0)), ValueError, "d_ff must be >= 1, got 0"),
    ("FeedForward d_model type", lambda: nn.FeedForward(8.0, 4, rngs=nnx.Rngs(0)), TypeError, "d_model must be an int, got 8.0"),
    ("FeedForward activation", lambda: nn.FeedForward(8, 4, rngs=nnx.Rngs(0))(f32(2, 8), activation="tanh"), ValueError, "activation must be one of"),
    ("FeedForward swiglu ungated", lambda: nn.FeedForward(8, 4, rngs=nnx.Rngs(0))(f32(2, 8), activation="swiglu"), ValueError, "needs FeedForwardParams.w_gate"),
    ("Norm kind", lambda: nn.Norm(8, rngs=nnx.Rngs(0))(f32(2, 8), kind="batch"), ValueError, "norm must be one of .* got 'batch'"),
    ("Norm d_model", lambda: nn.Norm(0, rngs=nnx.Rngs(0)), ValueError, "d_model must be >= 1, got 0"),
    ("Norm param_dtype", lambda: nn.Norm(8, param_dtype="float16", rngs=nnx.Rngs(0)), ValueError, "param_dtype must be one of"),
    ("Embed vocab_size", lambda: nn.Embed(0, 8, rngs=nnx.Rngs(0)), ValueError, "vocab_size must be >= 1, got 0"),
    ("Embed tokens dtype", lambda: layer("embed")(f32(3)), TypeError, "tokens must be an integer array"),
    ("Embed.attend dim", lambda: layer("embed").attend(f32(2, 6)), ValueError, "x has model dim 6, table"),
    ("LearnedPositions max_len", lambda: nn.LearnedPositions(0, 8, rngs=nnx.Rngs(0)), ValueError, "max_len must be >= 1"),
    ("LearnedPositions dtype", lambda: layer("positions")(f32(3)), TypeError, "positions must be an integer array of positions"),
    ("EncoderLayer config", lambda: nn.EncoderLayer({"d_model": 8}, rngs=nnx.Rngs(0)), TypeError, "config must be a TransformerConfig, got dict"),
    ("DecoderStack config", lambda: nn.DecoderStack(None, rngs=nnx.Rngs(0)), TypeError, "config must be a TransformerConfig, got NoneType"),
    ("EncoderDecoder config", lambda: nn.EncoderDecoder("base", rngs=nnx.Rngs(0)), TypeError, "config must be a TransformerConfig, got str"),
]  # fmt: skip

t24 = i32(2, 4)
MODELS = [
    ("Transformer config", lambda: jf.Transformer(None, rngs=nnx.Rngs(0)), TypeError, "config must be a TransformerConfig"),
    ("Transformer no encoder", lambda: jf.Transformer(config(num_encoder_layers=0), rngs=nnx.Rngs(0)), ValueError, "needs num_encoder_layers >= 1"),
    ("DecoderLM no decoder", lambda: jf.DecoderLM(config(num_decoder_layers=0), rngs=nnx.Rngs(0)), ValueError, "needs num_decoder_layers >= 1"),
    ("src_tokens dtype", lambda: model()(f32(2, 4), t24), TypeError, "src_tokens must be an integer array of token ids, got dtype float32"),
    ("src_tokens rank", lambda: model()(i32(4), t24), ValueError, r"src_tokens must have rank 2 \[B, T\]"),
    ("tgt_tokens rank", lambda: model()(t24, i32(2, 4, 1)), ValueError, "tgt_tokens must have rank 2"),
    ("batch mismatch", lambda: model()(i32(3, 4), t24), ValueError, r"src_tokens batch \(3,\) != tgt_tokens batch \(2,\)"),
    ("src_valid dtype", lambda: model()(t24, t24, i32(2, 4)), TypeError, r"src_valid must be a boolean array \(True = real token\)"),
    ("tgt_valid shape", lambda: model()(t24, t24, None, b(2, 3)), ValueError, r"tgt_valid shape \(2, 3\) != tgt_tokens shape \(2, 4\)"),
    ("too long for max_len", lambda: model()(i32(2, 9), t24), ValueError, "src_tokens has length 9 > max_len=8"),
    ("empty sequence", lambda: model()(i32(2, 0), t24), ValueError, "src_tokens has length 0"),
    ("dropout without rng", lambda: model()(t24, t24, deterministic=False), ValueError, "deterministic=False needs rng"),
    ("decode memory rank", lambda: model().decode(t24, f32(4, 8)), ValueError, r"memory must have rank 3 \[B, S, E\]"),
    ("decode memory dtype", lambda: model().decode(t24, i32(2, 4, 8)), TypeError, "memory must be a floating-point"),
    ("decode memory dim", lambda: model().decode(t24, f32(2, 4, 6)), ValueError, "memory has model dim 6, the model's d_model is 8"),
    ("decode memory batch", lambda: model().decode(t24, f32(3, 4, 8)), ValueError, "memory batch 3 != tgt_tokens batch 2"),
    ("decode src_valid", lambda: model().decode(t24, f32(2, 4, 8), b(2, 5)), ValueError, r"src_valid must have shape memory's \[B, S\] = \(2, 4\), got \(2, 5\)"),
    ("cross_attention_weights tokens", lambda: model().cross_attention_weights(f32(2, 4), t24), TypeError, "src_tokens must be an integer array"),
    ("lm positions shape", lambda: model("lm")(t24, positions=i32(2, 3)), ValueError, r"positions shape \(2, 3\) != tokens shape \(2, 4\)"),
    ("lm positions dtype", lambda: model("lm")(t24, positions=f32(2, 4)), TypeError, "positions must be an integer array of positions"),
    ("lm segment_ids shape", lambda: model("lm")(t24, segment_ids=i32(2, 3)), ValueError, "segment_ids shape"),
    ("lm segment_ids dtype", lambda: model("lm")(t24, segment_ids=f32(2, 4)), TypeError, "segment_ids must be an integer array of segment ids"),
    ("encoder valid", lambda: model("encoder")(t24, b(4, 2)), ValueError, "valid shape"),
    ("count_params", lambda: jf.count_params({"w": 1}), TypeError, "model must be a Module, got dict"),
    ("init_cache max_len type", lambda: model("lm").init_cache(2, max_len=4.0), TypeError, "max_len must be an int, got 4.0"),
]  # fmt: skip

CONFIGS = [
    ("vocab_size 0", dict(vocab_size=0), ValueError, "vocab_size must be >= 1, got 0"),
    ("vocab_size bool", dict(vocab_size=True), TypeError, "vocab_size must be an int, got True"),
    ("d_model float", dict(d_model=8.0), TypeError, "d_model must be an int, got 8.0"),
    ("heads do not divide", dict(d_model=10, num_heads=4), ValueError, "d_model=10 is not divisible by num_heads=4"),
    ("kv heads do not divide", dict(num_kv_heads=3, num_heads=2), ValueError, "num_heads=2 is not divisible by num_kv_heads=3"),
    ("negative layers", dict(num_encoder_layers=-1), ValueError, "num_encoder_layers must be >= 0, got -1"),
    ("max_len 0", dict(max_len=0), ValueError, "max_len must be >= 1"),
    ("d_k 0", dict(d_k=0), ValueError, "d_k must be >= 1"),
    ("odd d_model, sinusoids", dict(d_model=7, num_heads=7), ValueError, "sinusoidal positions need an even d_model, got 7"),
    ("rope odd d_k", dict(position_embedding="rope", d_k=3, d_v=3), ValueError, "rotary embeddings need an even key head dim d_k, got 3"),
    ("dropout 1", dict(dropout_rate=1.0), ValueError, r"dropout_rate must be in \[0, 1\), got 1.0"),
    ("label_smoothing type", dict(label_smoothing="0.1"), TypeError, "label_smoothing must be a number"),
    ("norm_eps 0", dict(norm_eps=0.0), ValueError, "norm_eps must be > 0"),
    ("norm_eps bool", dict(norm_eps=True), TypeError, "norm_eps must be a number, got True"),
    ("attention_impl", dict(attention_impl="flash"), ValueError, "attention_impl must be one of"),
    ("remat", dict(remat="some"), ValueError, "remat must be one of"),
    ("dtype type", dict(dtype=32), TypeError, "dtype must be a string"),
    ("activation", dict(activation="tanh"), ValueError, "activation must be one of"),
    ("dtype", dict(dtype="float16"), ValueError, "dtype must be one of"),
    ("position_embedding", dict(position_embedding="alibi"), ValueError, "position_embedding must be one of"),
    ("norm_bias type", dict(norm_bias=1), TypeError, "norm_bias must be a bool, got 1"),
    ("final_norm type", dict(final_norm="yes"), TypeError, "final_norm must be a bool, got .yes."),
]  # fmt: skip
CONFIG_CASES = [(n, functools.partial(config, **o), e, m) for n, o, e, m in CONFIGS]
CONFIG_CASES += [
    ("from_dict unknown key", lambda: jf.TransformerConfig.from_dict({"vocab_size": 5, "d_modle": 8}), ValueError, r"unknown config key\(s\) \['d_modle'\]"),
    ("table3 row", lambda: jf.TransformerConfig.table3("Z9", 100), ValueError, "unknown Table 3 row 'Z9'"),
]  # fmt: skip

SCHED = optax.constant_schedule(1e-3)
TRAIN = [
    ("cross_entropy shapes", lambda: F.cross_entropy(f32(2, 3, 5), i32(2, 4), f32(2, 4)), ValueError, r"logits \(2, 3, 5\) must be \[B, T, V\] with targets and weights \[B, T\]"),
    ("cross_entropy targets dtype", lambda: F.cross_entropy(f32(2, 3, 5), f32(2, 3), f32(2, 3)), TypeError, "targets must be an integer array"),
    ("cross_entropy logits dtype", lambda: F.cross_entropy(i32(2, 3, 5), i32(2, 3), f32(2, 3)), TypeError, "logits must be a floating-point"),
    ("cross_entropy smoothing", lambda: F.cross_entropy(f32(2, 3, 5), i32(2, 3), f32(2, 3), label_smoothing=1.0), ValueError, r"label_smoothing must be in \[0, 1\)"),
    ("paper_schedule d_model", lambda: train.paper_schedule(0), ValueError, "d_model must be >= 1, got 0"),
    ("paper_schedule warmup", lambda: train.paper_schedule(512, 0), ValueError, "warmup_steps must be >= 1, got 0"),
    ("paper_schedule warmup type", lambda: train.paper_schedule(512, 4000.0), TypeError, "warmup_steps must be an int, got 4000.0"),
    ("make_schedule name", lambda: train.make_schedule("linear", lr=1e-3), ValueError, "schedule must be one of .* got 'linear'"),
    ("make_schedule paper d_model", lambda: train.make_schedule("paper"), ValueError, "the paper schedule needs d_model"),
    ("make_schedule paper lr", lambda: train.make_schedule("paper", d_model=8, lr=-1.0), ValueError, "lr must be > 0, got -1.0"),
    ("make_schedule lr", lambda: train.make_schedule("constant", lr=0.0), ValueError, "lr must be > 0, got 0.0"),
    ("make_schedule no lr", lambda: train.make_schedule("constant"), ValueError, "needs a learning rate lr > 0, got None"),
    ("make_schedule lr type", lambda: train.make_schedule("constant", lr="1e-3"), TypeError, "lr must be a number, got '1e-3'"),
    ("make_schedule total", lambda: train.make_schedule("cosine", lr=1e-3, warmup_steps=10, total_steps=5), ValueError, "total_steps > warmup_steps, got 5 and 10"),
    ("make_schedule final_fraction", lambda: train.make_schedule("cosine", lr=1e-3, warmup_steps=1, total_steps=5, final_fraction=2.0), ValueError, r"final_fraction must be in \[0, 1\], got 2.0"),
    ("make_optimizer name", lambda: train.make_optimizer(SCHED, name="sgd"), ValueError, "optimizer must be one of .* got 'sgd'"),
    ("make_optimizer weight_decay adam", lambda: train.make_optimizer(SCHED, weight_decay=0.1), ValueError, "weight_decay needs the 'adamw' optimizer"),
    ("make_optimizer weight_decay", lambda: train.make_optimizer(SCHED, name="adamw", weight_decay=-0.1), ValueError, "weight_decay must be >= 0"),
    ("make_optimizer b1", lambda: train.make_optimizer(SCHED, b1=1.5), ValueError, r"b1 must be in \[0, 1\), got 1.5"),
    ("make_optimizer b2", lambda: train.make_optimizer(SCHED, b2=-0.1), ValueError, r"b2 must be in \[0, 1\)"),
    ("make_optimizer eps", lambda: train.make_optimizer(SCHED, eps=-1e-9), ValueError, "eps must be >= 0"),
    ("make_optimizer clip_norm", lambda: train.make_optimizer(SCHED, clip_norm=0.0), ValueError, "clip_norm must be > 0, got 0.0"),
    ("make_optimizer b1 type", lambda: train.make_optimizer(SCHED, b1="0.9"), TypeError, "b1 must be a number, got '0.9'"),
    ("create_train_state model", lambda: train.create_train_state(layer("encoder_layer"), optax.adam(1e-3), 0), TypeError, "model must be a Transformer or DecoderLM, got EncoderLayer"),
    ("create_train_state seed", lambda: train.create_train_state(model(), optax.adam(1e-3), "0"), TypeError, "seed must be an int, got '0'"),
    ("make_train_step accum_steps", lambda: train.make_train_step(None, optax.adam(1e-3), SCHED, label_smoothing=0.1, accum_steps=0), ValueError, "accum_steps must be >= 1, got 0"),
    ("make_train_step accum_steps type", lambda: train.make_train_step(None, optax.adam(1e-3), SCHED, label_smoothing=0.1, accum_steps=2.0), TypeError, "accum_steps must be an int, got 2.0"),
    ("make_train_step smoothing", lambda: train.make_train_step(None, optax.adam(1e-3), SCHED, label_smoothing=1.5), ValueError, r"label_smoothing must be in \[0, 1\), got 1.5"),
    ("make_eval_step smoothing", lambda: train.make_eval_step(None, label_smoothing=-0.1), ValueError, "label_smoothing must be in"),
    ("model_logits model", lambda: train.model_logits(model("encoder"), {}, rng=None), TypeError, "training needs a Transformer or DecoderLM, got Encoder"),
]  # fmt: skip


def _batch(**changes):
    t = np.ones((2, 4), np.int32)
    batch = dict(src=t, src_valid=t > 0, tgt_in=t, tgt_out=t, tgt_valid=t > 0)
    return {k: v for k, v in (batch | changes).items() if v is not None}


@functools.cache
def _steps():
    opt = optax.adam(1e-3)
    graphdef, state = train.create_train_state(model(), opt, 0)
    step = train.make_train_step(graphdef, opt, SCHED, label_smoothing=0.1)
    accum = train.make_train_step(graphdef, opt, SCHED, label_smoothing=0.1, accum_steps=4)
    return state, step, accum, train.make_eval_step(graphdef, label_smoothing=0.1)


STEPS = [
    ("step batch type", lambda: _steps()[1](_steps()[0], [1, 2]), TypeError, "batch must be a dict of arrays, got list"),
    ("step missing src", lambda: _steps()[1](_steps()[0], _batch(src=None)), ValueError, r"batch is missing \['src'\]; a Transformer batch needs"),
    ("eval missing tgt_out", lambda: _steps()[3](_steps()[0].params, _batch(tgt_out=None)), ValueError, r"batch is missing \['tgt_out'\]"),
    ("step tgt_out dtype", lambda: _steps()[1](_steps()[0], _batch(tgt_out=np.ones((2, 4), np.float32))), TypeError, r"batch\['tgt_out'\] must hold integer token ids"),
    ("step tgt_out shape", lambda: _steps()[1](_steps()[0], _batch(tgt_out=np.ones((2, 3), np.int32))), ValueError, r"batch\['tgt_out'\] shape \(2, 3\) != batch\['tgt_in'\] shape \(2, 4\)"),
    ("step tgt_valid shape", lambda: _steps()[1](_steps()[0], _batch(tgt_valid=np.ones((2, 3), bool))), ValueError, r"tgt_valid shape \(2, 3\) != tgt_tokens shape"),
    ("step src dtype", lambda: _steps()[1](_steps()[0], _batch(src=np.ones((2, 4), np.float32))), TypeError, "src_tokens must be an integer array"),
    ("step accumulation split", lambda: _steps()[2](_steps()[0], _batch()), ValueError, "batch size 2 is not divisible by accum_steps=4"),
]  # fmt: skip

DECODE = [
    ("greedy model", lambda: decode.greedy(model("encoder"), t24, max_new_tokens=2), TypeError, "model must be a Transformer or DecoderLM, got Encoder"),
    ("greedy max_new_tokens 0", lambda: decode.greedy(model(), t24, max_new_tokens=0), ValueError, "max_new_tokens must be >= 1, got 0"),
    ("sample temperature", lambda: decode.sample(model(), t24, max_new_tokens=2, temperature=0.0), ValueError, "temperature must be > 0"),
    ("sample temperature type", lambda: decode.sample(model(), t24, max_new_tokens=2, temperature="1"), TypeError, "temperature must be a number, got '1'"),
    ("sample top_k", lambda: decode.sample(model(), t24, max_new_tokens=2, top_k=V + 1), ValueError, rf"top_k must be <= {V} \(the vocabulary\), got {V + 1}"),
    ("sample top_k type", lambda: decode.sample(model(), t24, max_new_tokens=2, top_k=2.0), TypeError, "top_k must be an int, got 2.0"),
    ("sample top_p", lambda: decode.sample(model(), t24, max_new_tokens=2, top_p=0.0), ValueError, r"top_p must be in \(0, 1\], got 0.0"),
    ("beam_search beam_size", lambda: decode.beam_search(model(), t24, beam_size=0), ValueError, "beam_size must be >= 1, got 0"),
    ("beam_search beam_size type", lambda: decode.beam_search(model(), t24, beam_size=2.5), TypeError, "beam_size must be an int, got 2.5"),
    ("beam_search alpha", lambda: decode.beam_search(model(), t24, alpha=-1.0), ValueError, "alpha must be >= 0, got -1.0"),
    ("greedy max_new_tokens float", lambda: decode.greedy(model(), t24, max_new_tokens=2.5), TypeError, "max_new_tokens must be an int, got 2.5"),
    ("greedy max_new_tokens > max_len", lambda: decode.greedy(model(), t24, max_new_tokens=9), ValueError, "max_new_tokens=9 does not fit the model's max_len=8"),
    ("greedy bos_id", lambda: decode.greedy(model(), t24, max_new_tokens=2, bos_id=V), ValueError, rf"bos_id={V} is outside the vocabulary \[0, {V}\)"),
    ("greedy bos_id type", lambda: decode.greedy(model(), t24, max_new_tokens=2, bos_id="1"), TypeError, "bos_id must be an int, got '1'"),
    ("greedy eos_id", lambda: decode.greedy(model(), t24, max_new_tokens=2, eos_id=-1), ValueError, r"eos_id=-1 is outside the vocabulary"),
    ("greedy pad_id", lambda: decode.greedy(model(), t24, max_new_tokens=2, pad_id=V), ValueError, rf"pad_id={V} is outside the vocabulary \[0, {V}\)"),
    ("beam_search pad_id type", lambda: decode.beam_search(model(), t24, pad_id=None), TypeError, "pad_id must be an int, got None"),
    ("greedy src dtype", lambda: decode.greedy(model(), f32(2, 4), max_new_tokens=2), TypeError, "src_tokens must be an integer array of token ids"),
    ("greedy src rank", lambda: decode.greedy(model(), i32(4), max_new_tokens=2), ValueError, r"src_tokens must have rank 2 \[B, S\]"),
    ("greedy src_valid", lambda: decode.greedy(model(), t24, b(2, 3), max_new_tokens=2), ValueError, r"src_valid must have shape src_tokens' \[B, S\] = \(2, 4\)"),
]  # fmt: skip

TOK = data.ByteTokenizer()


class WideTokenizer(data.ByteTokenizer):
    """A broken tokenizer whose ids run past its own vocabulary."""

    def encode(self, text):
        return [self.vocab_size + 5 for _ in text]


class BigTokenizer(data.ByteTokenizer):
    vocab_size = 5000


TOKENS = [
    ("check_tokens too large", lambda: jf.check_tokens(np.array([[3, 4], [5, 12]]), V), ValueError, rf"tokens\[1, 1\] = 12 is outside the vocabulary \[0, {V}\) \(1 id\(s\) out of range\)"),
    ("check_tokens negative", lambda: jf.check_tokens(jnp.array([1, -1, 2, -3]), V, name="batch['src']"), ValueError, r"batch\['src'\]\[1\] = -1 is outside .* \(2 id\(s\)"),
    ("check_tokens dtype", lambda: jf.check_tokens(np.ones(3, np.float32), V), TypeError, "tokens must hold integer token ids, got dtype float32"),
    ("check_tokens vocab_size", lambda: jf.check_tokens([1], 0), ValueError, "vocab_size must be >= 1, got 0"),
    ("check_tokens vocab_size type", lambda: jf.check_tokens([1], 5.0), TypeError, "vocab_size must be an int, got 5.0"),
    ("ByteTokenizer.decode too large", lambda: TOK.decode([70, 300]), ValueError, r"ids\[1\] = 300 is outside the vocabulary \[0, 259\)"),
    ("ByteTokenizer.decode negative", lambda: TOK.decode([-1]), ValueError, r"ids\[0\] = -1 is outside"),
    ("tokenizer vs model vocab", lambda: data.TaskData("copy", BigTokenizer(), vocab_size=259), ValueError, "the tokenizer has 5000 ids but vocab_size=259"),
    ("tokenizer output", lambda: data.TaskData("copy", WideTokenizer()).train_batch(0, 2), ValueError, r"the tokenizer's ids for example 0's source\[0\] = 264 is outside the vocabulary \[0, 259\)"),
]  # fmt: skip


def _files(tmp):
    (tmp / "empty.txt").write_text("")
    (tmp / "blank.txt").write_text("\n  \n")
    (tmp / "binary.bin").write_bytes(b"\x7fELF\x00\x01\x02" * 20)
    (tmp / "latin1.txt").write_bytes("caf\xe9\tcoffee\n".encode("latin-1"))
    (tmp / "pairs.tsv").write_text("a\tb\nno tab here\n")
    (tmp / "one_line.txt").write_text("a single line of text\n")
    (tmp / "tokenizer.json").write_bytes(b"\xff\xfe{")
    (tmp / "broken.yaml").write_text("d_model: 64: 2\n")
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "loss": 0.\n{"step": 3}\n')
    (tmp / "no_step.jsonl").write_text('{"loss": 1.0}\n')
    return tmp


FILES = [
    ("TsvData missing", lambda t: data.TsvData(t / "nope.tsv", TOK, max_len=16), FileNotFoundError, "nope.tsv: no such file"),
    ("TsvData folder", lambda t: data.TsvData(t, TOK, max_len=16), ValueError, "not a regular file"),
    ("TsvData empty", lambda t: data.TsvData(t / "empty.txt", TOK, max_len=16), ValueError, "empty.txt: the file is empty"),
    ("TsvData blank", lambda t: data.TsvData(t / "blank.txt", TOK, max_len=16), ValueError, "blank.txt: the file is empty"),
    ("TsvData binary", lambda t: data.TsvData(t / "binary.bin", TOK, max_len=16), ValueError, "binary.bin: looks like a binary file"),
    ("TsvData not UTF-8", lambda t: data.TsvData(t / "latin1.txt", TOK, max_len=16), ValueError, r"latin1.txt:1: not valid UTF-8 \(invalid continuation byte at byte 3\)"),
    ("TsvData malformed", lambda t: data.TsvData(t / "pairs.tsv", TOK, max_len=16), ValueError, r"pairs.tsv:2: expected 'source<TAB>target'"),
    ("TsvData max_len", lambda t: data.TsvData(t / "pairs.tsv", TOK, max_len=0), ValueError, "max_len must be >= 1, got 0"),
    ("TsvData max_len type", lambda t: data.TsvData(t / "pairs.tsv", TOK, max_len=16.0), TypeError, "max_len must be an int, got 16.0"),
    ("TextData missing", lambda t: data.TextData(t / "nope.txt", TOK, seq_len=8), FileNotFoundError, "nope.txt: no such file"),
    ("TextData empty", lambda t: data.TextData(t / "empty.txt", TOK, seq_len=8), ValueError, "the file is empty"),
    ("TextData binary", lambda t: data.TextData(t / "binary.bin", TOK, seq_len=8), ValueError, "looks like a binary file"),
    ("TextData not UTF-8", lambda t: data.TextData(t / "latin1.txt", TOK, seq_len=8), ValueError, "not valid UTF-8"),
    ("TextData seq_len", lambda t: data.TextData(t / "pairs.tsv", TOK, seq_len=0), ValueError, "seq_len must be >= 1, got 0"),
    ("TextData one line", lambda t: data.TextData(t / "one_line.txt", TOK, seq_len=8), ValueError, "needs at least two documents"),
    ("TaskData task", lambda t: data.TaskData("nope", TOK), ValueError, "unknown task 'nope'; tasks are"),
    ("TaskData batch_size", lambda t: data.TaskData("copy", TOK, dev_size=4).train_batch(0, 0), ValueError, "batch_size must be >= 1, got 0"),
    ("TaskData batch_size type", lambda t: data.TaskData("copy", TOK, dev_size=4).train_batch(0, "2"), TypeError, "batch_size must be an int, got '2'"),
    ("load_tokenizer missing", lambda t: data.load_tokenizer(t / "nope"), FileNotFoundError, "no tokenizer in"),
    ("load_tokenizer not UTF-8", lambda t: data.load_tokenizer(t), ValueError, "tokenizer.json is not a jaxformer tokenizer file"),
    ("BPE vocab_size", lambda t: data.BPETokenizer.train(["abc"], 10), ValueError, "vocab_size must be >= 300, got 10"),
    ("run file missing", lambda t: files.read_json(t / "summary.json"), FileNotFoundError, "summary.json: no such file"),
    ("run file not JSON", lambda t: files.read_json(t / "broken.yaml"), ValueError, r"broken.yaml: not valid JSON \(Expecting .*\); the file is damaged"),
    ("run file not an object", lambda t: files.read_json(t / "list.json"), ValueError, "list.json: expected a JSON object, got list"),
    ("metrics damaged line", lambda t: files.read_metrics(t / "metrics.jsonl"), ValueError, r"metrics.jsonl:2: not a JSON record \(Expecting"),
    ("metrics without step", lambda t: files.read_metrics(t / "no_step.jsonl"), ValueError, "no_step.jsonl:1: a record must be a JSON object with an int 'step'"),
    ("HFTokenizer not a tokenizer", lambda t: data.HFTokenizer.from_file(t / "pairs.tsv", **HF_IDS), ValueError, "pairs.tsv is not a Hugging Face tokenizer file"),
    ("HFTokenizer missing", lambda t: data.HFTokenizer.from_file(t / "nope.json", **HF_IDS), FileNotFoundError, "nope.json: no such file"),
    ("HFTokenizer eos_id", lambda t: data.HFTokenizer.from_file(hf.char_level(t / "h.json", "ab", ["</s>"]), **HF_IDS | {"eos_id": 4}), ValueError, r"eos_id=4 is outside the tokenizer's vocabulary \[0, 4\)"),
]  # fmt: skip
HF_IDS = dict(pad_id=3, bos_id=3, eos_id=3)


def _cases(*groups):
    return [
        pytest.param(fn, exc, match, id=name) for group in groups for name, fn, exc, match in group
    ]


@pytest.mark.parametrize(
    "fn, exc, match", _cases(FUNCTIONAL, NN, MODELS, CONFIG_CASES, TRAIN, STEPS, DECODE, TOKENS)
)
def test_bad_input_raises_a_named_error(fn, exc, match):
    with pytest.raises(exc, match=match) as error:
        fn()
    assert isinstance(error.value, InputError)  # what the CLI reports in one line


@pytest.mark.parametrize("fn, exc, match", _cases(FILES))
def test_bad_files_raise_a_named_error(tmp_path, fn, exc, match):
    with pytest.raises(exc, match=match) as error:
        fn(_files(tmp_path))
    assert isinstance(error.value, InputError)


def test_the_package_raises_only_input_errors():
    """Every error the package raises itself is an InputError kind (BadValue, ...), so the
    CLI can tell bad input from a bug."""
    builtin = re.compile(
        r"raise (ValueError|TypeError|FileNotFoundError|ImportError|ConnectionError)\("
    )
    package = pathlib.Path(jf.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if builtin.search(line)
    ]
    assert not found, f"raise an InputError kind from jaxformer.checks instead: {found}"


def test_errors_are_raised_at_trace_time_under_jit():
    """Shapes and dtypes are checked while tracing: the same errors come out of jit."""
    with pytest.raises(ValueError, match="x_kv has model dim 6"):
        jax.jit(F.multi_head_attention)(f32(2, 3, 8), f32(2, 3, 6), ATTN)
    with pytest.raises(TypeError, match="src_tokens must be an integer array"):
        graphdef, state = nnx.split(model())
        jax.jit(lambda s, a, c: nnx.merge(graphdef, s)(a, c))(state, f32(2, 4), t24)


def test_check_tokens_accepts_valid_ids():
    jf.check_tokens(np.array([[0, V - 1]]), V)
    jf.check_tokens([], V)
    jf.check_tokens(jnp.arange(V), V)
    batch = data.TaskData("copy", TOK, dev_size=4, vocab_size=TOK.vocab_size).train_batch(0, 4)
    jf.check_tokens(batch["src"], TOK.vocab_size)


def _cli(capsys, *argv):
    """`jaxformer train ARGV` in this process: (exit code, stderr)."""
    try:
        code = main(["train", *map(str, argv), "--no-progress"])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip()
    return code, err


CLI = [
    ("empty TSV", ["--data-tsv", "empty.txt"], "empty.txt: the file is empty"),
    ("binary TSV", ["--data-tsv", "binary.bin"], "binary.bin: looks like a binary file"),
    ("TSV not UTF-8", ["--data-tsv", "latin1.txt"], r"latin1.txt:1: not valid UTF-8"),
    ("empty text", ["--data-text", "empty.txt"], "empty.txt: the file is empty"),
    ("text not UTF-8", ["--data-text", "latin1.txt"], "not valid UTF-8"),
    ("missing config", ["--config", "nope.yaml"], "nope.yaml: no such config file"),
    ("config not UTF-8", ["--config", "latin1.txt"], r"latin1.txt: not UTF-8 text"),
    ("binary config", ["--config", "binary.bin"], "binary.bin: not valid JSON"),
    ("config impossible sizes", ["--config", "sizes.json"], "d_model=10 is not divisible by num_heads=4"),
    ("config wrong type", ["--config", "types.json"], "num_heads must be an int, got 'four'"),
    ("config empty", ["--config", "empty.txt"], "empty.txt: not valid JSON"),
    ("config broken YAML", ["--config", "broken.yaml"], r"error: [^ ]*broken.yaml: not valid YAML \(mapping values are not allowed here at line 1, column 12\)$"),
    ("negative warmup", ["--warmup-steps", "-1"], "--warmup-steps must be >= 0, got -1"),
    ("bad lr", ["--lr", "-1"], "--lr must be > 0, got -1.0"),
    ("lr not a number", ["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
    ("bad seq-len", ["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
    ("log-internals 0", ["--log-internals", "0"], "--log-internals must be >= 1, got 0"),
    ("misspelt flag", ["--stepz", "5"], "unrecognized arguments: --stepz 5; did you mean --steps"),
    ("bad choice", ["--schedule", "linear"], "argument --schedule: invalid choice: 'linear'"),
    ("bad mesh", ["--mesh", "data=3"], f"mesh data=3,fsdp=1,tensor=1 needs 3 devices, but there are {jax.device_count()}"),
    ("pmap and mesh", ["--mesh", "data=1", "--pmap"], "give a --mesh or --pmap, not both"),
    ("model flag", ["--d-model", "10", "--num-heads", "4"], "--d-model=10 is not divisible by --num-heads=4"),
    ("bpe with a task", ["--tokenizer", "bpe"], "the BPE tokenizer is trained on data"),
    ("no-pack with a task", ["--no-pack"], "--no-pack lays out language-model rows: give --data-text, --data-shards or a text --dataset"),
    ("eot-id without shards", ["--eot-id", "3"], "--eot-id go with --data-shards"),
    ("bad dataset name", ["--dataset", "web"], "dataset 'web' is no registered dataset's name; .*the tests' toy-\\*"),
    ("dataset and a file", ["--dataset", "wyc-web", "--data-tsv", "pairs.tsv"], "give one of --task, --data-tsv, --data-text, --dataset or --data-shards, not several"),
    ("out is a file", ["--out", "pairs.tsv"], "pairs.tsv exists and is not a folder"),
    ("averaging more than kept", ["--average-checkpoints", "5"], "--average-checkpoints=5 needs --keep-checkpoints >= 5, got --keep-checkpoints=3"),
    ("averaging more than saved", ["--average-checkpoints", "3", "--steps", "20", "--checkpoint-every", "10"], r"--average-checkpoints=3 but --steps=20 with --checkpoint-every=10 saves 2 checkpoint\(s\)"),
    ("vmap seeds without seeds", ["--vmap-seeds", "on"], r"--vmap-seeds says how --seeds train; give it with --seeds"),
    ("eval beam 0", ["--eval-beam", "0"], "--eval-beam must be >= 1, got 0"),
    ("negative eval alpha", ["--eval-alpha", "-1"], "--eval-alpha must be >= 0, got -1.0"),
]  # fmt: skip


@pytest.mark.parametrize("argv, match", [pytest.param(a, m, id=n) for n, a, m in CLI])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, match):
    _files(tmp_path)
    (tmp_path / "sizes.json").write_text(json.dumps({"d_model": 10, "num_heads": 4}))
    (tmp_path / "types.json").write_text(json.dumps({"num_heads": "four"}))
    argv = [tmp_path / a if "." in a and not a.startswith("-") else a for a in argv]  # files
    out = [] if "--out" in argv else ["--out", tmp_path / "run"]
    code, err = _cli(capsys, *argv, *out)
    _assert_one_line_error(code, err, match)
    assert not (tmp_path / "run").exists()  # a failed start leaves no run folder behind


def test_cli_shows_the_traceback_of_an_internal_error(tmp_path, monkeypatch):
    """An error that is not an InputError (a bug, here a plain ValueError from inside
    training) is not reported as bad input: it propagates with its traceback."""

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr("jaxformer.train.loop.train", broken)
    with pytest.raises(ValueError, match="an internal bug") as error:
        main(["train", "--task", "copy", "--out", str(tmp_path / "run"), "--no-progress"])
    assert not isinstance(error.value, InputError)


def test_bleu_without_sacrebleu_is_one_line_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu fails
    (tmp_path / "pairs.tsv").write_text("a b\tb a\nc d\td c\n")
    code, err = _cli(capsys, "--data-tsv", tmp_path / "pairs.tsv", "--out", tmp_path / "run")
    _assert_one_line_error(
        code, err, r"BLEU and chrF need sacrebleu: pip install 'jaxformer\[bleu\]'"
    )
    assert not (tmp_path / "run").exists()


def _assert_one_line_error(code, err, match):
    """Exit code 2 and one error line, argparse's own errors included."""
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxformer train: error:"), err
    assert re.search(match, lines[0]), err


SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, d_model=16, num_heads=2, d_ff=32)
RUN_ARGS = [
    *"--task copy --steps 2 --batch-size 2 --schedule constant".split(),
    *"--checkpoint-every 1 --eval-every 1000 --eval-examples 2".split(),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-step run with checkpoints at steps 1 and 2 (and its model config file)."""
    tmp = tmp_path_factory.mktemp("run")
    (tmp / "small.json").write_text(json.dumps(SMALL | dict(max_len=64)))
    code = main(
        [
            "train",
            *RUN_ARGS,
            "--config",
            str(tmp / "small.json"),
            "--out",
            str(tmp / "run"),
            "--no-progress",
        ]
    )
    assert code == 0
    return tmp


def _copy_run(finished_run, tmp_path):
    shutil.copytree(finished_run / "run", tmp_path / "run")
    return tmp_path / "run"


def _resume(capsys, run, config_path, steps="3"):
    argv = [*RUN_ARGS, "--config", config_path, "--out", run, "--resume", "--steps", steps]
    return _cli(capsys, *argv)


def test_resume_from_a_checkpoint_of_another_config(finished_run, tmp_path, capsys):
    run = _copy_run(finished_run, tmp_path)
    (tmp_path / "wider.json").write_text(json.dumps(SMALL | dict(d_model=24, max_len=64)))
    code, err = _resume(capsys, run, tmp_path / "wider.json")
    match = r"written for a different configuration: --d-model=16 \(checkpoint\) vs 24 \(now\)"
    _assert_one_line_error(code, err, match)


def test_a_run_folder_with_checkpoints_needs_the_resume_flag(finished_run, tmp_path, capsys):
    """The command's error names its flags; from Python the same error says resume=True."""
    run = _copy_run(finished_run, tmp_path)
    argv = [*RUN_ARGS, "--config", finished_run / "small.json", "--out", run]
    code, err = _cli(capsys, *argv)
    match = r"already holds checkpoints \(latest step 2\); pass --resume to continue that run, "
    _assert_one_line_error(code, err, match + "or choose another --out$")


def test_resume_leaves_out_a_torn_last_metrics_line_with_a_warning(finished_run, tmp_path, capsys):
    """A process killed while appending to metrics.jsonl leaves its last line torn: the
    resume says so in one line, drops it, and continues."""
    run = _copy_run(finished_run, tmp_path)
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().count("\n")
    with metrics.open("a") as f:
        f.write('{"step": 3, "loss": 0.9')
    code, err = _resume(capsys, run, finished_run / "small.json")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "warning" in line]
    assert warned == [f"jaxformer train: warning: {metrics}:{lines + 1}: left out a torn last line"]
    assert max(r["step"] for r in files.read_metrics(metrics)) == 3


def test_resume_refuses_a_damaged_metrics_line_naming_it(finished_run, tmp_path, capsys):
    run = _copy_run(finished_run, tmp_path)
    metrics = run / "metrics.jsonl"
    metrics.write_text("garbage\n" + metrics.read_text())
    code, err = _resume(capsys, run, finished_run / "small.json")
    _assert_one_line_error(code, err, r"metrics.jsonl:1: not a JSON record \(Expecting value")


def test_resume_refuses_a_config_cut_short_naming_it(finished_run, tmp_path, capsys):
    """config.json holds the run's configs: a resume leaves a damaged one as it is."""
    run = _copy_run(finished_run, tmp_path)
    config = run / "config.json"
    config.write_bytes(cut := config.read_bytes()[: config.stat().st_size // 2])
    code, err = _resume(capsys, run, finished_run / "small.json")
    _assert_one_line_error(code, err, r"config.json: not valid JSON \(.*\); the file is damaged$")
    assert config.read_bytes() == cut


@pytest.mark.parametrize("name", ["summary.json", "predictions.tsv"])
def test_resume_writes_again_an_output_cut_short(finished_run, tmp_path, capsys, name):
    """summary.json and the predictions are derived from the checkpoint (a resume never
    reads them): resuming the finished run writes them again as they were."""
    run = _copy_run(finished_run, tmp_path)
    whole = (run / name).read_text()
    (run / name).write_text(whole[: len(whole) // 2])
    code, err = _resume(capsys, run, finished_run / "small.json", steps="2")
    assert code == 0, err
    if name == "predictions.tsv":
        assert (run / name).read_text() == whole
    else:
        again, before = json.loads((run / name).read_text()), json.loads(whole)
        for key in ("steps", "eval_nll", "token_accuracy", "exact_match", "params"):
            assert again[key] == before[key], key


# A read orbax left unfinished would print a traceback when collected or completed (an
# ignored exception, a closed event loop): the tests fail on one.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["params", "meta"])
def test_resume_from_a_truncated_checkpoint(finished_run, tmp_path, capsys, damage):
    """A checkpoint cut short (a full disk, a partial copy) is an error naming its
    folder, not a TensorStore traceback."""
    run = _copy_run(finished_run, tmp_path)
    step = run / "checkpoints" / "2"
    if damage == "params":
        victim = max(
            (p for p in (step / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
        )
    else:
        victim = step / "meta" / "metadata"
    victim.write_bytes(victim.read_bytes()[:10])
    code, err = _resume(capsys, run, finished_run / "small.json")
    _assert_one_line_error(code, err, r"checkpoint .*checkpoints/2 cannot be read")
    with pytest.raises(ValueError, match=r"checkpoints/2 cannot be read"):
        checkpoints.restore_model(run)
    gc.collect()  # an abandoned read, if any, is collected (and reported) here


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_damaged_averaged_parameters_are_an_error_naming_them(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path)
    (run / "averaged").mkdir()
    (run / "averaged" / "_CHECKPOINT_METADATA").write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match=r"checkpoint .*averaged cannot be read .*: delete that"):
        checkpoints.restore_model(run)
    gc.collect()
