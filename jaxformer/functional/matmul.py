"""Matrix products that accumulate in float32 whatever the input dtype.

`einsum_f32(spec, x, w, bias)` is `jnp.einsum(spec, x, w, preferred_element_type=float32)`
(+ bias, in float32) cast back to x's dtype. For float32 inputs that is all it is. For
bfloat16 inputs its gradient is written out (a `jax.custom_vjp`) so that the backward
pass's two products also take bfloat16 inputs and accumulate in float32. The arithmetic
is what autodiff would do (the incoming cotangent is the float32 image of a bfloat16
value, so rounding it back is exact), but XLA's CPU backend, left to itself, converts the
operands of those products to float32 and multiplies at half the speed of the bfloat16
dot instructions of CPUs with AVX512-BF16. (Forward-mode `jax.jvp` is therefore not
defined through bfloat16 products.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def einsum_f32(spec: str, x: jax.Array, w: jax.Array, bias: jax.Array | None = None):
    """einsum(spec, x, w) (+ bias) accumulated in float32, returned in x's dtype.

    spec: "A,B->C" with no ellipsis and every index used once per operand.
    """
    if x.dtype == jnp.float32 and w.dtype == jnp.float32:
        out = jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
    else:
        out = _low_precision_einsum(spec, x, w)
    if bias is not None:  # over the trailing axes of out, shaped explicitly
        out = out + bias.reshape((1,) * (out.ndim - bias.ndim) + bias.shape)
    return out.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _low_precision_einsum(spec, x, w):
    """[float32] einsum of low-precision x and w."""
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)


def _fwd(spec, x, w):
    return _low_precision_einsum(spec, x, w), (x, w)


def _bwd(spec, residuals, ct):
    x, w = residuals
    inputs, out = spec.replace(" ", "").split("->")
    a, b = inputs.split(",")
    ct = ct.astype(x.dtype)
    dx = jnp.einsum(f"{out},{b}->{a}", ct, w, preferred_element_type=jnp.float32)
    dw = jnp.einsum(f"{a},{out}->{b}", x, ct, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_low_precision_einsum.defvjp(_fwd, _bwd)
