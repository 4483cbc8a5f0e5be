"""Laying out state and batches over a mesh by the sharding rules. A step compiled for
that layout (`MeshPlacement.compile`) is the same function as on one device; XLA inserts
the collectives (gradient all-reduce for data parallelism, parameter all-gathers and
gradient reduce-scatters for FSDP, activation all-reduces for tensor parallelism).

On several processes every process calls the same functions with the same host values:
`shard_state` and `shard_batch` copy to each process's devices only the pieces they hold.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    Rules,
    batch_sharding,
    check_batch_size,
    state_shardings,
)

Batch = dict[str, jax.Array]


def put(tree, shardings):
    """Place host values (NumPy or single-device arrays, the same on every process) with
    `shardings` (a matching tree, or one sharding for all leaves); each process transfers
    only the slices its own devices hold. Leaves already laid out so are kept."""
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def place(x, sharding):
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree, shardings)


def shard_state(state, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """(the state, any pytree holding nnx Variables, laid out by the rules; its
    shardings). A parameter dimension that does not divide by its mesh axes is a
    ValueError naming the parameter."""
    shardings = state_shardings(state, mesh, rules)
    return put(state, shardings), shardings


def shard_batch(batch: Batch, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Batch:
    """The global batch (dict of [B, ...] arrays, built identically on every process) with
    its rows split over the `batch` rule's mesh axes. B must divide by their size."""
    for name, x in batch.items():
        check_batch_size(np.shape(x)[0], mesh, rules, name=f"batch[{name!r}] rows")
    return put(batch, batch_sharding(mesh, rules))
