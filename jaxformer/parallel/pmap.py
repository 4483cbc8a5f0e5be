"""Data parallelism with `jax.pmap`, for code built around it. `jax.pmap` is in maintenance
mode upstream; new code should use a mesh (`make_placement`), which also shards
parameters.

The state is replicated with a leading device axis; each device takes B / n rows. A step
marks per-replica sums with `sum_over_replicas` (`lax.psum`) and gets a per-device dropout
key from `per_replica_key`; outside a pmap placement's step both are the identity."""

from __future__ import annotations

import contextlib
import contextvars

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.checks import BadValue

AXIS = "devices"
_REPLICA_AXIS: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "replica_axis", default=None
)


@contextlib.contextmanager
def replica_axis(name: str):
    """Within the block (the trace of a pmapped step), replicas run along axis `name`."""
    token = _REPLICA_AXIS.set(name)
    try:
        yield
    finally:
        _REPLICA_AXIS.reset(token)


def sum_over_replicas(tree):
    """The tree summed over the pmap replicas (unchanged outside a pmapped step)."""
    axis = _REPLICA_AXIS.get()
    return tree if axis is None else jax.lax.psum(tree, axis)


def per_replica_key(key: jax.Array) -> jax.Array:
    """`key` folded with the replica's index under pmap (unchanged outside)."""
    axis = _REPLICA_AXIS.get()
    return key if axis is None else jax.random.fold_in(key, jax.lax.axis_index(axis))


def replicate(tree, devices=None):
    """One copy of every leaf per device, stacked on a new leading axis [n, ...]."""
    devices = jax.local_devices() if devices is None else list(devices)
    sharding = NamedSharding(Mesh(np.array(devices), (AXIS,)), PartitionSpec(AXIS))
    return jax.tree.map(
        lambda x: jax.device_put(
            np.broadcast_to(np.asarray(x), (len(devices), *np.shape(x))), sharding
        ),
        tree,
    )


def unreplicate(tree):
    """The first device's copy of a replicated tree, as arrays on that device alone.

    (Indexing x[0] would run a program over all the devices for every leaf and return
    arrays still spread over them.)"""

    def first(x):
        if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
            return x.addressable_shards[0].data[0]
        return x[0]

    return jax.tree.map(first, tree)


def split_batch(batch: dict, num_devices: int | None = None) -> dict:
    """[B, ...] -> [n, B / n, ...]: device i gets rows i * B/n ... (i + 1) * B/n - 1."""
    n = jax.local_device_count() if num_devices is None else num_devices

    def split(name, x):
        if x.shape[0] % n:
            raise BadValue(
                f"batch[{name!r}] has {x.shape[0]} rows, not divisible by the {n} devices of pmap"
            )
        return x.reshape(n, x.shape[0] // n, *x.shape[1:])

    return {name: split(name, x) for name, x in batch.items()}
