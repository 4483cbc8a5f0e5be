"""Parallel training: a device mesh, sharding rules, placements that lay out any state
and compile any step over one device, a mesh or pmap, and multi-host start-up. One code
path from one CPU to many hosts:

    placement = parallel.make_placement("data=2,fsdp=2,tensor=2")
    layout = train.state_layout(graphdef, state)  # the parameters' logical axes
    state = placement.put(state, like=layout)
    step = placement.compile(train_step, layout, donate_state=True)
    state, metrics = step(state, batch)
"""

from jaxformer.parallel.distributed import initialize, is_main_process
from jaxformer.parallel.placement import (
    MESH_AXES,
    MeshPlacement,
    Placement,
    PmapPlacement,
    host_copy,
    make_mesh,
    make_placement,
    parse_mesh,
    per_replica_key,
    put,
    replicate,
    shard_batch,
    split_batch,
    sum_over_replicas,
    unreplicate,
)
from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    batch_sharding,
    batch_shards,
    check_batch_size,
    state_shardings,
    state_specs,
)
