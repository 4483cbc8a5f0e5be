"""QK normalisation (after Dehghani et al., 2023, "Scaling Vision Transformers to 22B"):
queries and keys are normalised per head before their dot product, which bounds the
attention logits. This version has no learned scale (a pure function of q and k, so it
needs no new parameters): each head's q and k are scaled to unit root mean square
(length sqrt(D)) and then attended as usual, so every logit lies within +-sqrt(D).

    jaxformer train --variants experiments/variants/qk_norm.py --attention-impl qk_norm
"""

import jax.numpy as jnp

from jaxformer import functional as F


def _unit_rms(x):
    """x [..., D] scaled so that each vector's root mean square is 1, in float32."""
    x32 = x.astype(jnp.float32)
    return (
        x32 * jnp.reciprocal(jnp.sqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + 1e-6))
    ).astype(x.dtype)


@F.ATTENTION.register("qk_norm")
def qk_norm_attention(q, k, v, *, mask, bias, scale, dropout_rate, dropout_rng):
    """The plain ("xla") kernel on RMS-normalised queries and keys [B, T|S, H|K, D]."""
    plain = F.ATTENTION["xla"].fn
    return plain(
        _unit_rms(q),
        _unit_rms(k),
        v,
        mask=mask,
        bias=bias,
        scale=scale,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
    )
