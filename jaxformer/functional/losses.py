"""Token-level cross-entropy with label smoothing (section 5.4), ignoring padding.

With the smoothed target q = (1 - eps) * one_hot(y) + eps / V and p = softmax(logits):

    H(q, p) = (1 - eps) * NLL + eps * (logsumexp(logits) - mean(logits)),

computed in float32 without materialising q. NLL, perplexity and accuracy are reported
unsmoothed. `chunked_cross_entropy` computes the same sums from the hidden states without
the [B, T, V] logits; (the step picks one by the config's `lm_head`)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxformer.checks import (
    BadValue,
    check_float_array,
    check_int,
    check_int_array,
    check_number,
    check_rank,
)
from jaxformer.functional.matmul import einsum_f32


class LossSums(NamedTuple):
    """Sums over the real (weighted) target tokens: add them across micro-batches and
    devices, divide by `tokens` last."""

    loss: jax.Array  # label-smoothed cross-entropy, summed
    nll: jax.Array  # negative log-likelihood of the targets, summed
    correct: jax.Array  # targets whose logit is the row's maximum
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
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    *,
    label_smoothing: float = 0.0,
) -> LossSums:
    """logits [B, T, V] (any float dtype; read in float32), targets [B, T] int, weights
    [B, T] (bool or 0/1: False = padding; None = every token is real)."""
    check_float_array("logits", logits)
    check_int_array("targets", targets)
    if logits.shape[:-1] != targets.shape or _shape(weights, targets) != targets.shape:
        raise BadValue(
            f"logits {logits.shape} must be [B, T, V] with targets and weights [B, T]; "
            f"got targets {targets.shape}, weights {_shape(weights, targets)}"
        )
    check_number("label_smoothing", label_smoothing, "[0, 1)")
    with jax.named_scope("loss"):  # named in profiles (jaxformer bench profile)
        V = logits.shape[-1]
        per_token = _token_losses(logits.reshape(-1, V), targets.reshape(-1), label_smoothing)
        return _weighted_sums(per_token, weights)


def _shape(weights, targets) -> tuple[int, ...]:
    """The weights' shape; the targets' when there are none (every token real)."""
    return targets.shape if weights is None else weights.shape


def _weighted_sums(per_token, weights) -> LossSums:
    """LossSums of per-token (loss, nll, correct) [N] with weights [B, T] (None: all 1)."""
    loss, nll, correct = per_token
    if weights is None:
        n = jnp.float32(loss.shape[0])
        return LossSums(jnp.sum(loss), jnp.sum(nll), jnp.sum(correct), n)
    w = weights.astype(jnp.float32).reshape(-1)
    return LossSums(jnp.sum(loss * w), jnp.sum(nll * w), jnp.sum(correct * w), jnp.sum(w))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(logits, y, eps):
    """Per-token (loss, nll, correct) [N] of logits [N, V] and targets y [N]."""
    return _token_losses_fwd(logits, y, eps)[0]


def _token_losses_fwd(logits, y, eps):
    x = logits.astype(jnp.float32)
    m = jnp.max(x, axis=-1)  # read 1
    log_z = m + jnp.log(jnp.sum(jnp.exp(x - m[:, None]), axis=-1))  # read 2
    target = jnp.take_along_axis(x, y[:, None], axis=-1)[:, 0]  # one logit per row
    nll = log_z - target
    loss = nll
    if eps > 0.0:  # the mean logit, in read 2 (XLA fuses the two sums)
        loss = (1.0 - eps) * nll + eps * (log_z - jnp.mean(x, axis=-1))
    correct = (target >= m).astype(jnp.float32)
    return (loss, nll, correct), (logits, y, log_z)


def _token_losses_bwd(eps, residuals, cotangents):
    """d loss / d logits = p - (1 - eps) one_hot(y) - eps / V, d nll = p - one_hot(y), each
    times its per-token cotangent: one elementwise pass."""
    logits, y, log_z = residuals
    g_loss, g_nll, _ = cotangents  # `correct` has no gradient
    V = logits.shape[-1]
    p = jnp.exp(logits.astype(jnp.float32) - log_z[:, None])
    is_target = jnp.arange(V)[None, :] == y[:, None]
    d = (g_loss + g_nll)[:, None] * p - jnp.where(
        is_target, ((1.0 - eps) * g_loss + g_nll)[:, None], 0.0
    )
    if eps > 0.0:
        d = d - (eps / V * g_loss)[:, None]
    return d.astype(logits.dtype), None


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


def chunked_cross_entropy(
    hidden: jax.Array,
    table: jax.Array,
    bias: jax.Array | None,
    targets: jax.Array,
    weights: jax.Array | None = None,
    *,
    label_smoothing: float = 0.0,
    chunk_size: int = 4096,
) -> LossSums:
    """`cross_entropy` of the logits hidden @ table^T (+ bias), in float32, holding at most
    [B * T, chunk_size] of them at a time (forward and backward).

    hidden [B, T, E], table [V, E], bias [V] or None, targets [B, T] int, weights [B, T]
    (bool or 0/1: False = padding; None = all real)."""
    check_rank("hidden", hidden, 3, "[B, T, E]")
    check_float_array("hidden", hidden)
    check_rank("table", table, 2, "[V, E]")
    check_int_array("targets", targets)
    check_number("label_smoothing", label_smoothing, "[0, 1)")
    check_int("chunk_size", chunk_size)
    B, T, E = hidden.shape
    V = table.shape[0]
    if table.shape[1] != E or table.dtype != hidden.dtype:
        raise BadValue(
            f"table {table.dtype}{list(table.shape)} must be [V, E={E}] in hidden's dtype "
            f"{hidden.dtype}"
        )
    if targets.shape != (B, T) or _shape(weights, targets) != (B, T):
        raise BadValue(
            f"targets {targets.shape} and weights {_shape(weights, targets)} must be "
            f"[B, T] = {(B, T)}"
        )
    if bias is not None and bias.shape != (V,):
        raise BadValue(f"bias {bias.shape} must be [V] = {(V,)}")
    with jax.named_scope("loss"):
        return _chunked_sums(hidden, table, bias, targets, weights, label_smoothing, chunk_size)


def _chunked_sums(hidden, table, bias, targets, weights, label_smoothing, chunk_size) -> LossSums:
    (B, T, E), V = hidden.shape, table.shape[0]
    n, C = _vocab_chunks(V, chunk_size)
    table_c = jnp.pad(table, ((0, n * C - V), (0, 0))).reshape(n, C, E)
    bias = jnp.zeros((V,), jnp.float32) if bias is None else bias.astype(jnp.float32)
    bias_c = jnp.pad(bias, (0, n * C - V)).reshape(n, C)
    per_token = _chunked_head(
        hidden.reshape(B * T, E), table_c, bias_c, targets.reshape(-1), label_smoothing, V
    )
    return _weighted_sums(per_token, weights)


def _vocab_chunks(V: int, chunk_size: int) -> tuple[int, int]:
    """(chunks n, chunk width C <= max(chunk_size, 128)) covering V ids with n * C >= V and
    little padding; C is a multiple of 128 when above it (matrix-unit tiles)."""
    n = math.ceil(V / chunk_size)
    C = math.ceil(V / n)
    if C > 128:
        C = 128 * math.ceil(C / 128)
    return math.ceil(V / C), C


def _chunk_logits(h, table_c, bias_c, c, V):
    """Chunk c's logits [N, C] float32 (-inf past the vocabulary) and their ids [C]."""
    C = table_c.shape[0]
    ids = c * C + jnp.arange(C)
    logits = jnp.einsum("ne,ce->nc", h, table_c, preferred_element_type=jnp.float32)
    logits = logits + bias_c[None, :]
    return jnp.where(ids[None, :] < V, logits, -jnp.inf), ids


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _chunked_head(h, table_c, bias_c, y, eps, V):
    """Per-token (loss, nll, correct) [N] of h [N, E] against chunks table_c [n, C, E],
    bias_c [n, C] float32 and targets y [N]."""
    return _chunked_head_fwd(h, table_c, bias_c, y, eps, V)[0]


def _chunked_head_fwd(h, table_c, bias_c, y, eps, V):
    def add_chunk(carry, xs):
        m, s, total, target = carry  # running max, sum of exp(l - m), of l, target logit
        logits, ids = _chunk_logits(h, xs[1], xs[2], xs[0], V)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[:, None]), axis=1)
        if eps > 0.0:
            total = total + jnp.sum(jnp.where(ids[None, :] < V, logits, 0.0), axis=1)
        target = target + jnp.sum(jnp.where(ids[None, :] == y[:, None], logits, 0.0), axis=1)
        return (m_new, s, total, target), None

    N = h.shape[0]
    zeros = jnp.zeros((N,), jnp.float32)
    init = (jnp.full((N,), -jnp.inf), zeros, zeros, zeros)
    chunks = (jnp.arange(table_c.shape[0]), table_c, bias_c)
    (m, s, total, target), _ = jax.lax.scan(add_chunk, init, chunks)
    log_z = m + jnp.log(s)
    nll = log_z - target
    loss = (1.0 - eps) * nll + eps * (log_z - total / V) if eps > 0.0 else nll
    correct = (target >= m).astype(jnp.float32)
    return (loss, nll, correct), (h, table_c, bias_c, y, log_z)


def _chunked_head_bwd(eps, V, residuals, cotangents):
    """d(loss)/d(logits) = p - (1 - eps) one_hot(y) - eps / V and d(nll)/d(logits) =
    p - one_hot(y), chunk by chunk, times the per-token cotangents."""
    h, table_c, bias_c, y, log_z = residuals
    g_loss, g_nll, _ = cotangents  # `correct` has no gradient
    p_coef = (g_loss + g_nll)[:, None]
    target_coef = ((1.0 - eps) * g_loss + g_nll)[:, None]

    def chunk_grads(dh, xs):
        c, t_c, b_c = xs
        logits, ids = _chunk_logits(h, t_c, b_c, c, V)
        d = p_coef * jnp.exp(logits - log_z[:, None]) - target_coef * (ids[None, :] == y[:, None])
        if eps > 0.0:  # the uniform part, over the real ids
            d = d - (eps / V * g_loss)[:, None] * (ids[None, :] < V)
        d_low = d.astype(h.dtype)  # the products' operands in the compute dtype
        dh = dh + jnp.einsum("nc,ce->ne", d_low, t_c, preferred_element_type=jnp.float32)
        dt = einsum_f32("nc,ne->ce", d_low, h)
        return dh, (dt, jnp.sum(d, axis=0))

    dh = jnp.zeros(h.shape, jnp.float32)
    chunks = (jnp.arange(table_c.shape[0]), table_c, bias_c)
    dh, (d_table, d_bias) = jax.lax.scan(chunk_grads, dh, chunks)
    return dh.astype(h.dtype), d_table, d_bias, None


_chunked_head.defvjp(_chunked_head_fwd, _chunked_head_bwd)
