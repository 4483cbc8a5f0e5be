"""Parallel training: a device mesh, sharding rules, jit-sharded and pmap train steps,
and multi-host start-up. One code path from one CPU to many hosts:

    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    state, shardings = parallel.shard_state(state, mesh)
    step = parallel.make_sharded_train_step(graphdef, optimizer, schedule, mesh, shardings,
                                            label_smoothing=0.1)
    state, metrics = step(state, parallel.shard_batch(batch, mesh))
"""

from jaxformer.parallel.distributed import initialize, is_main_process
from jaxformer.parallel.mesh import MESH_AXES, make_mesh, parse_mesh
from jaxformer.parallel.pmap import make_pmap_train_step, replicate, split_batch, unreplicate
from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    batch_sharding,
    batch_shards,
    check_batch_size,
    state_shardings,
    state_specs,
)
from jaxformer.parallel.sharded import (
    make_sharded_eval_step,
    make_sharded_train_step,
    put,
    shard_batch,
    shard_state,
)

__all__ = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "batch_sharding",
    "batch_shards",
    "check_batch_size",
    "initialize",
    "is_main_process",
    "make_mesh",
    "make_pmap_train_step",
    "make_sharded_eval_step",
    "make_sharded_train_step",
    "parse_mesh",
    "put",
    "replicate",
    "shard_batch",
    "shard_state",
    "split_batch",
    "state_shardings",
    "state_specs",
    "unreplicate",
]
