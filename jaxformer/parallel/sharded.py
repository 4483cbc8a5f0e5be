"""Training over a mesh with `jax.jit` and NamedShardings: the same step function as on one
device (`jaxformer.train.steps.make_train_step`), compiled with in/out shardings from the
rules, so XLA inserts the collectives (gradient all-reduce for data parallelism, parameter
all-gathers and gradient reduce-scatters for FSDP, activation all-reduces for tensor
parallelism).

On several processes every process calls the same functions with the same host values:
`shard_state` and `shard_batch` copy to each process's devices only the pieces they hold.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.nn._sharding import activation_sharding
from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    Rules,
    batch_sharding,
    check_batch_size,
    state_shardings,
)
from jaxformer.train.steps import Batch, TrainState, make_eval_step, make_train_step


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


def shard_state(
    state: TrainState, mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> tuple[TrainState, TrainState]:
    """(the state laid out by the rules, its shardings). A parameter dimension that does
    not divide by its mesh axes is a ValueError naming the parameter."""
    shardings = state_shardings(state, mesh, rules)
    return put(state, shardings), shardings


def shard_batch(batch: Batch, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Batch:
    """The global batch (dict of [B, ...] arrays, built identically on every process) with
    its rows split over the `batch` rule's mesh axes. B must divide by their size."""
    for name, x in batch.items():
        check_batch_size(np.shape(x)[0], mesh, rules, name=f"batch[{name!r}] rows")
    return put(batch, batch_sharding(mesh, rules))


def make_sharded_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    mesh: Mesh,
    state_sharding: TrainState,
    *,
    label_smoothing: float,
    accum_steps: int = 1,
    rules: Rules = DEFAULT_RULES,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """`make_train_step`'s step, jitted for `mesh`: state in and out with `state_sharding`
    (from `shard_state`), the batch split by rows, metrics replicated, old state donated.
    Micro-batches of gradient accumulation are split over the same devices as the batch."""
    micro = NamedSharding(mesh, PartitionSpec(None, rules["batch"]))
    step = make_train_step(
        graphdef,
        optimizer,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        jit=False,
        shard_micro_batch=lambda mb: jax.lax.with_sharding_constraint(mb, micro),
    )
    return jax.jit(
        _within(mesh, rules, step),
        in_shardings=(state_sharding, batch_sharding(mesh, rules)),
        out_shardings=(state_sharding, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=0,
    )


def make_sharded_eval_step(
    graphdef: nnx.GraphDef,
    mesh: Mesh,
    params_sharding: nnx.State,
    *,
    label_smoothing: float,
    rules: Rules = DEFAULT_RULES,
):
    """`make_eval_step`'s function jitted for `mesh`: (params, batch) -> replicated LossSums."""
    evaluate = make_eval_step(graphdef, label_smoothing=label_smoothing, jit=False)
    return jax.jit(
        _within(mesh, rules, evaluate),
        in_shardings=(params_sharding, batch_sharding(mesh, rules)),
        out_shardings=NamedSharding(mesh, PartitionSpec()),
    )


def _within(mesh: Mesh, rules: Rules, fn):
    """`fn`, traced with the models' residual stream pinned to the batch layout."""

    def traced(*args):
        with activation_sharding(mesh, rules):
            return fn(*args)

    return traced
