"""Matrix products that accumulate in float32 and take bfloat16 operands in both passes.

- `einsum_f32(spec, x, w, bias)`: the product (+ bias) returned in x's dtype.
- `einsum_to_f32(spec, x, w)`: the product returned in float32 (e.g. attention logits).

For float32 operands both are plain products. For bfloat16 operands the gradients are
written out (`jax.custom_vjp`) so the backward products take bfloat16 operands too:
autodiff would give a float32 cotangent (jax-ml/jax#23797), i.e. TF32 GEMMs on a GPU. The
cotangent is rounded to bfloat16 first; a bias's gradient is summed in float32. On a CPU
the product is formed in float32 and rounded once. `jax.jvp` is not defined through these."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def einsum_f32(spec: str, x: jax.Array, w: jax.Array, bias: jax.Array | None = None):
    """einsum(spec, x, w) (+ bias of any float dtype over the trailing axes, e.g. [F] for
    "ne,ef->nf") accumulated in float32, returned in x's dtype. spec: "A,B->C" with no
    ellipsis and every index used once per operand."""
    if x.dtype == jnp.float32 and w.dtype == jnp.float32:
        out = jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
        return out if bias is None else out + _trailing(bias, out.ndim)
    return _low_precision(spec, x, w, bias)


def _trailing(bias: jax.Array, ndim: int) -> jax.Array:
    """bias shaped to add over the trailing axes of a rank-`ndim` array."""
    return bias.reshape((1,) * (ndim - bias.ndim) + bias.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _low_precision(spec, x, w, bias):
    return _product(spec, x, w, x.dtype, bias)


def _product(spec, x, w, dtype, bias=None):
    """einsum(spec, x, w) (+ bias) of low-precision operands, in `dtype`: written in
    `dtype` by an accelerator's GEMM, in float32 and rounded after on a CPU."""

    def written_in(written):
        def product(x, w, bias):
            out = jnp.einsum(spec, x, w, preferred_element_type=written)
            if bias is not None:
                out = out + _trailing(bias.astype(written), out.ndim)
            return out.astype(dtype)

        return product

    return jax.lax.platform_dependent(
        x, w, bias, cpu=written_in(jnp.float32), default=written_in(dtype)
    )


def _low_precision_fwd(spec, x, w, bias):
    return _low_precision(spec, x, w, bias), (x, w, bias)


def _low_precision_bwd(spec, residuals, ct):
    x, w, bias = residuals
    dx, dw = _operand_grads(spec, x, w, ct)
    if bias is None:
        return dx, dw, None
    rows = tuple(range(ct.ndim - bias.ndim))
    return dx, dw, jnp.sum(ct.astype(jnp.float32), axis=rows).astype(bias.dtype)


def _operand_grads(spec, x, w, ct):
    """The two backward products of einsum(spec, x, w), on `ct` rounded to x's dtype."""
    inputs, out = spec.replace(" ", "").split("->")
    a, b = inputs.split(",")
    ct = ct.astype(x.dtype)
    dx = _product(f"{out},{b}->{a}", ct, w, x.dtype)
    dw = _product(f"{a},{out}->{b}", x, ct, w.dtype)
    return dx, dw


_low_precision.defvjp(_low_precision_fwd, _low_precision_bwd)


def einsum_to_f32(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """einsum(spec, x, w) accumulated and returned in float32; for low-precision x and w
    the backward products take x's and w's dtype. spec: as in `einsum_f32`."""
    if x.dtype == jnp.float32 and w.dtype == jnp.float32:
        return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
    return _to_f32(spec, x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _to_f32(spec, x, w):
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)


def _to_f32_fwd(spec, x, w):
    return _to_f32(spec, x, w), (x, w)


def _to_f32_bwd(spec, residuals, ct):
    return _operand_grads(spec, *residuals, ct)


_to_f32.defvjp(_to_f32_fwd, _to_f32_bwd)
