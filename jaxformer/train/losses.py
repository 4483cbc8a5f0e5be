"""Token-level cross-entropy with label smoothing (section 5.4), ignoring padding.

The smoothed target is q = (1 - eps) * one_hot(y) + eps / V (uniform over the vocabulary,
as in Szegedy et al., 2016). Its cross-entropy with p = softmax(logits) is

    H(q, p) = (1 - eps) * NLL + eps * (logsumexp(logits) - mean(logits)),

computed in float32 without materialising q. NLL, perplexity and accuracy are reported
without smoothing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import BadValue, check_float_array, check_int_array, check_number


class LossSums(NamedTuple):
    """Sums over the real (weighted) target tokens: add them across micro-batches and
    devices, divide by `tokens` last."""

    loss: jax.Array  # label-smoothed cross-entropy, summed
    nll: jax.Array  # negative log-likelihood of the targets, summed
    correct: jax.Array  # targets that are the argmax of the logits
    tokens: jax.Array  # number of real target tokens

    def means(self) -> dict[str, jax.Array]:
        n = jnp.maximum(self.tokens, 1.0)
        nll = self.nll / n
        return {
            "loss": self.loss / n,
            "nll": nll,
            "perplexity": jnp.exp(nll),
            "token_accuracy": self.correct / n,
            "tokens": self.tokens,
        }


def cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, *, label_smoothing: float = 0.0
) -> LossSums:
    """logits [B, T, V], targets [B, T] int, weights [B, T] (bool or 0/1: False = padding)."""
    check_float_array("logits", logits)
    check_int_array("targets", targets)
    if logits.shape[:-1] != targets.shape or targets.shape != weights.shape:
        raise BadValue(
            f"logits {logits.shape} must be [B, T, V] with targets and weights [B, T]; "
            f"got targets {targets.shape}, weights {weights.shape}"
        )
    check_number("label_smoothing", label_smoothing, "[0, 1)")
    logits = logits.astype(jnp.float32)
    w = weights.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = log_z - target_logit
    smooth = log_z - jnp.mean(logits, axis=-1)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return LossSums(
        loss=jnp.sum(loss * w),
        nll=jnp.sum(nll * w),
        correct=jnp.sum(correct * w),
        tokens=jnp.sum(w),
    )
