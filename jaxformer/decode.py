"""Autoregressive decoding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from jaxformer.models import Transformer


def greedy(
    model: Transformer,
    src_tokens: jax.Array,
    src_valid: jax.Array | None = None,
    *,
    max_new_tokens: int,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> jax.Array:
    """Greedy decoding with an encoder-decoder: src [B, S] -> tokens [B, max_new_tokens].

    Each row holds the argmax tokens up to and including its first EOS, then padding.
    The encoder runs once; the whole loop is one compiled `lax.fori_loop`.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"greedy needs a Transformer, got {type(model).__name__}")
    _check_decode_args(model.config, max_new_tokens, bos_id=bos_id, eos_id=eos_id)
    graphdef, state = nnx.split(model)
    return _greedy(graphdef, state, src_tokens, src_valid, max_new_tokens, bos_id, eos_id)


def _check_decode_args(config, max_new_tokens, **token_ids) -> None:
    """max_new_tokens fits the position table; the special ids are in the vocabulary."""
    n = max_new_tokens
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {n!r}")
    if config.position_embedding in ("sinusoidal", "learned") and n > config.max_len:
        raise ValueError(f"max_new_tokens={n} > the model's max_len={config.max_len}")
    for name, token in token_ids.items():
        if not isinstance(token, int) or not 0 <= token < config.vocab_size:
            raise ValueError(f"{name}={token!r} is outside the vocabulary [0, {config.vocab_size})")


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _greedy(graphdef, state, src, src_valid, n, bos_id, eos_id):
    model = nnx.merge(graphdef, state)
    B = src.shape[0]
    memory = model.encode(src, src_valid)
    tgt = jnp.full((B, n + 1), PAD_ID, jnp.int32).at[:, 0].set(bos_id)
    done = jnp.zeros((B,), bool)

    def step(t, carry):
        tgt, done = carry
        logits = model.decode(tgt[:, :-1], memory, src_valid)  # causal: position t sees <= t
        token = jnp.argmax(logits[:, t], axis=-1).astype(jnp.int32)
        token = jnp.where(done, PAD_ID, token)
        return tgt.at[:, t + 1].set(token), done | (token == eos_id)

    tgt, _ = jax.lax.fori_loop(0, n, step, (tgt, done))
    return tgt[:, 1:]
