"""Declaring parameters: initializer, dtype and logical sharding axis names in one call."""

from __future__ import annotations

from flax import nnx

from jaxformer.checks import BadValue, check_choice
from jaxformer.config import DTYPES

# Logical axis names carried by parameters; jaxformer.parallel maps them to mesh axes.
#   embed: d_model   heads: attention heads   kv: head dim   mlp: d_ff
#   vocab: vocabulary   position: learned position table rows   norm: norm scales/biases
#   layers: the leading axis of a stack's parameters with `scan_layers`
LOGICAL_AXES = ("embed", "heads", "kv", "mlp", "vocab", "position", "norm", "layers")


def param(rngs: nnx.Rngs, init, shape: tuple[int, ...], axes: tuple[str, ...], dtype) -> nnx.Param:
    """An `nnx.Param` of `shape` drawn from `init`, tagged with logical `axes`.

    Sharding is applied later, by the parallel layer's rules, not at creation.
    """
    assert len(axes) == len(shape) and all(a in LOGICAL_AXES for a in axes), axes
    return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


def dtype_of(name: str, value: str):
    """The jnp dtype named `value` ("float32" or "bfloat16")."""
    check_choice(name, value, DTYPES)
    return DTYPES[value]


def dropout_rng(deterministic: bool, rng):
    """The dropout key to use: None when deterministic, else `rng`, which must be given."""
    if deterministic:
        return None
    if rng is None:
        raise BadValue("deterministic=False needs rng=<a jax.random key> for dropout")
    return rng
