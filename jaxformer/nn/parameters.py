"""Declaring parameters: initializer, dtype and logical sharding axis names in one call;
`plain`, the same trees as plain arrays; and `lora_weight`, a weight with its adapter."""

from __future__ import annotations

import jax
from flax import nnx

from jaxformer.checks import BadValue, check_choice
from jaxformer.config import DTYPES

# Logical axis names carried by parameters; jaxformer.parallel maps them to mesh axes.
#   embed: d_model   heads: attention heads   kv: head dim   mlp: d_ff
#   vocab: vocabulary   position: learned position table rows   norm: norm scales/biases
#   layers: the leading axis of a stack's parameters with `scan_layers`
#   seeds: the leading axis of k seeds trained as one program (`train.seeds`)
LOGICAL_AXES = ("embed", "heads", "kv", "mlp", "vocab", "position", "norm", "layers", "seeds")


def param(rngs: nnx.Rngs, init, shape: tuple[int, ...], axes: tuple[str, ...], dtype) -> nnx.Param:
    """An `nnx.Param` of `shape` drawn from `init`, tagged with logical `axes` (sharded
    later, by the parallel layer's rules)."""
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


def plain(tree):
    """`tree` with every nnx.State as a dict and every nnx.Variable as its value: plain
    arrays, which cross `jit` without the Variables' Python-side flattening. `nnx.merge`
    takes such a dict of parameters; the logical axes stay with the graph (`nnx.split`)."""

    def convert(x):
        if isinstance(x, nnx.State):
            return nnx.to_pure_dict(x)
        return x.get_value() if isinstance(x, nnx.Variable) else x

    return jax.tree.map(convert, tree, is_leaf=lambda x: isinstance(x, nnx.State | nnx.Variable))


def lora_weight(module: nnx.Module, name: str) -> jax.Array:
    """Parameter `name` of `module`; where `nn.add_lora` gave it an adapter (an nnx.LoRA at
    `<name>_lora`, A [d_in, r] and B [r, d_out]), W + (alpha / r) A B in W's layout: the
    functional math and every attention kernel see one weight."""
    w, lora = getattr(module, name)[...], getattr(module, f"{name}_lora", None)
    if lora is None:
        return w
    return w + lora.scale * (lora.lora_a[...] @ lora.lora_b[...]).reshape(w.shape)
