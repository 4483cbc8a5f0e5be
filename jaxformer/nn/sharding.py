"""Activation layouts under a mesh: the residual stream [B, T, E] split by batch rows.

`jaxformer.parallel` traces its steps inside `activation_sharding(mesh, rules)`; the
models then pin their residual stream (after the inputs and after every layer) to the
`batch` rule's mesh axes and gather whole embedding tables before lookups, so XLA does
not carry the parameters' FSDP layout into the activations. Outside the context both
functions return their input unchanged."""

from __future__ import annotations

import contextlib
import contextvars

import jax
from jax.sharding import NamedSharding, PartitionSpec

_LAYOUT: contextvars.ContextVar[tuple[jax.sharding.Mesh, PartitionSpec] | None] = (
    contextvars.ContextVar("activation_layout", default=None)
)


@contextlib.contextmanager
def activation_sharding(mesh: jax.sharding.Mesh, rules):
    """Within the block, `constrain_batch` splits rows over `rules['batch']` of `mesh`."""
    token = _LAYOUT.set((mesh, PartitionSpec(rules["batch"])))
    try:
        yield
    finally:
        _LAYOUT.reset(token)


def constrain_batch(x: jax.Array, batch_axis: int = 0) -> jax.Array:
    """x with axis `batch_axis` (its rows) split like the batch (inside
    `activation_sharding`); e.g. micro-batches [k, B, ...] with batch_axis=1."""
    layout = _LAYOUT.get()
    if layout is None:
        return x
    mesh, spec = layout
    spec = PartitionSpec(*(None,) * batch_axis, *spec)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def gather_whole(x: jax.Array) -> jax.Array:
    """x replicated on every device (inside `activation_sharding`): a table to look up."""
    layout = _LAYOUT.get()
    if layout is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(layout[0], PartitionSpec()))
