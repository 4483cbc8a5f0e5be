"""Data parallelism with `jax.pmap`, for code built around it. `jax.pmap` is in maintenance
mode upstream; new code should use the mesh (`make_mesh`, `shard_state`,
`make_sharded_train_step`), which also shards parameters.

The state is replicated on the local devices with a leading device axis; each device
takes B / n rows; loss sums and gradients are added over the devices (`lax.psum`) before
the one update, so the step equals the single-device step on the whole batch. With
dropout, device i draws its masks from fold_in(step key, i): the same distribution as one
device, not the same masks.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.train.steps import Batch, make_train_step

AXIS = "devices"


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


def split_batch(batch: Batch, num_devices: int | None = None) -> Batch:
    """[B, ...] -> [n, B / n, ...]: device i gets rows i * B/n ... (i + 1) * B/n - 1."""
    n = jax.local_device_count() if num_devices is None else num_devices

    def split(name, x):
        if x.shape[0] % n:
            raise ValueError(
                f"batch[{name!r}] has {x.shape[0]} rows, not divisible by the {n} devices of pmap"
            )
        return x.reshape(n, x.shape[0] // n, *x.shape[1:])

    return {name: split(name, x) for name, x in batch.items()}


def make_pmap_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float,
    accum_steps: int = 1,
):
    """`make_train_step`'s step under `jax.pmap`: (replicated state, split batch) ->
    (replicated state, replicated metrics), the old state donated."""
    step = make_train_step(
        graphdef,
        optimizer,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        jit=False,
        axis_name=AXIS,
    )
    return jax.pmap(step, axis_name=AXIS, donate_argnums=0)
