"""The encoder and decoder stacks together, without embeddings: torch.nn.Transformer's shape."""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer.checks import check_instance
from jaxformer.config import TransformerConfig
from jaxformer.nn.blocks import DecoderStack, EncoderStack


class EncoderDecoder(nnx.Module):
    """The body of the Transformer (figure 1 without embeddings, positions or the output
    projection): an `EncoderStack` over already-embedded sources and a `DecoderStack`
    with cross-attention over its output. The counterpart of `torch.nn.Transformer`.
    """

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
        """src [B, S, E], tgt [B, T, E] -> [B, T, E]. Dropout is applied when rng is given.

        Boolean masks (True = may attend), broadcastable to src_mask [B, H, S, S],
        tgt_mask [B, H, T, T] and memory_mask [B, H, T, S]. As in torch, nothing is
        causal unless tgt_mask says so: pass `functional.causal_mask(T)`.
        """
        k_enc, k_dec = (None, None) if rng is None else tuple(jax.random.split(rng))
        memory = self.encoder(src, src_mask, rng=k_enc)
        return self.decoder(tgt, tgt_mask, memory=memory, cross_mask=memory_mask, rng=k_dec).y
