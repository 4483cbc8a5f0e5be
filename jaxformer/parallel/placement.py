"""Where a training run keeps its state and batches, and the compiled steps that go with
it: one device (the plain jitted step), a mesh (jit with NamedShardings) or pmap. The
training loop talks only to a `Placement`, so all three share one loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

from jaxformer.parallel import pmap as pmap_lib
from jaxformer.parallel.mesh import make_mesh
from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    batch_shards,
    check_batch_size,
    state_shardings,
)
from jaxformer.parallel.sharded import (
    make_sharded_eval_step,
    make_sharded_train_step,
    put,
    shard_batch,
)
from jaxformer.train.losses import LossSums
from jaxformer.train.steps import Batch, TrainState, make_eval_step, make_train_step


@dataclasses.dataclass(frozen=True)
class Placement:
    """A layout and its steps. Batches come in as host (NumPy) arrays of the global batch.

    put_state     a TrainState as created or restored (one copy) -> laid out
    train_step    (state, batch) -> (state, scalar metrics)
    eval_step     (params, batch) -> LossSums
    params        state -> the parameters eval_step and decoding take
    saved         state -> the TrainState a checkpoint holds (one copy, globally shaped)
    """

    description: str
    put_state: Callable[[TrainState], TrainState]
    train_step: Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]
    eval_step: Callable[[nnx.State, Batch], LossSums]
    params: Callable[[TrainState], nnx.State]
    saved: Callable[[TrainState], TrainState]
    mesh: jax.sharding.Mesh | None = None


def make_placement(
    layout: dict[str, int] | str | None,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    state: TrainState,
    *,
    label_smoothing: float,
    batch_size: int,
    accum_steps: int = 1,
    rules=DEFAULT_RULES,
) -> Placement:
    """`layout`: None (one device), "pmap" (data parallel over the local devices), or mesh
    sizes for `make_mesh` such as {"data": 2, "fsdp": 2, "tensor": 2}."""
    micro_batch = batch_size // accum_steps
    kw = dict(label_smoothing=label_smoothing, accum_steps=accum_steps)
    if layout is None:
        step = make_train_step(graphdef, optimizer, schedule, **kw)
        evaluate = make_eval_step(graphdef, label_smoothing=label_smoothing)
        same = lambda x: x  # noqa: E731
        return Placement(
            f"one device ({jax.devices()[0].device_kind})",
            same, step, evaluate, lambda s: s.params, same,
        )  # fmt: skip
    if layout == "pmap":
        if jax.process_count() > 1:
            raise ValueError("pmap runs on one process; on several hosts use a mesh")
        n = jax.local_device_count()
        if batch_size % n or micro_batch % n:
            raise ValueError(
                f"pmap over {n} devices needs batch_size / accum_steps divisible by {n}, "
                f"got {batch_size} / {accum_steps}"
            )
        pstep = pmap_lib.make_pmap_train_step(graphdef, optimizer, schedule, **kw)
        evaluate = make_eval_step(graphdef, label_smoothing=label_smoothing)

        def train_step(s, batch):
            s, m = pstep(s, pmap_lib.split_batch(batch, n))
            return s, pmap_lib.unreplicate(m)

        return Placement(
            f"pmap over {n} devices",
            pmap_lib.replicate,
            train_step,
            evaluate,
            lambda s: pmap_lib.unreplicate(s.params),
            pmap_lib.unreplicate,
        )
    mesh = make_mesh(**layout)
    check_batch_size(
        micro_batch, mesh, rules, name=f"batch_size / accum_steps = {batch_size} / {accum_steps} ="
    )
    shardings = state_shardings(state, mesh, rules)
    step = make_sharded_train_step(
        graphdef, optimizer, schedule, mesh, shardings, rules=rules, **kw
    )
    evaluate = make_sharded_eval_step(
        graphdef, mesh, shardings.params, label_smoothing=label_smoothing, rules=rules
    )
    sizes = ", ".join(f"{a}={n}" for a, n in mesh.shape.items())
    return Placement(
        f"mesh {sizes} over {mesh.size} devices in {jax.process_count()} process(es); "
        f"each batch in {batch_shards(mesh, rules)} slices",
        lambda s: put(s, shardings),
        _in_mesh(mesh, lambda s, batch: step(s, shard_batch(batch, mesh, rules))),
        _in_mesh(mesh, lambda params, batch: evaluate(params, shard_batch(batch, mesh, rules))),
        lambda s: s.params,
        lambda s: s,
        mesh,
    )


def _in_mesh(mesh, fn):
    """`fn` called with `mesh` as JAX's current mesh (`jax.set_mesh`)."""

    def call(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return call


def host_copy(tree: Any) -> Any:
    """Every leaf whole on this process's first device (a collective on several processes:
    all must call it). For work only process 0 does, such as plots."""
    if jax.process_count() == 1:
        return tree
    gathered = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), jax.local_devices()[0]), gathered)
