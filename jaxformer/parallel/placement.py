"""Where a run keeps its state and batches, and how its step functions compile, over a
device mesh of three named axes (`make_mesh`: data, fsdp, tensor).

A `Placement` lays out any pytree state and compiles any `fn(state, batch)` (the package's
docstring shows a run's use); `like` holds the logical axes (`train.state_layout(graphdef,
state)`), the state itself is plain arrays, and a step takes the global batch on the host.

`MeshPlacement` jits with NamedShardings over a mesh; `PmapPlacement` runs `jax.pmap`
(in maintenance mode upstream: new code should use a mesh, which also shards parameters),
its state replicated on a leading device axis; a step marks per-replica sums with
`sum_over_replicas` and takes a per-device dropout key from `per_replica_key`, both the
identity outside a pmap placement's step."""

from __future__ import annotations

import abc
import contextlib
import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxformer.checks import BadValue
from jaxformer.nn.parameters import plain
from jaxformer.nn.sharding import activation_sharding
from jaxformer.parallel.rules import (
    DEFAULT_RULES,
    Rules,
    batch_sharding,
    batch_shards,
    check_batch_size,
    check_rules,
    state_shardings,
)

Batch = dict[str, Any]


class Placement(abc.ABC):
    """A layout of state and batches, and the compiler of steps that use it."""

    description: str
    mesh: Mesh | None = None

    @abc.abstractmethod
    def put(self, tree, *, like=None):
        """A tree as created or restored (one copy) -> laid out on the devices as `like`
        (default: `tree` itself; its Variables' logical axes) says, as plain arrays."""

    @abc.abstractmethod
    def compile(self, fn: Callable, like, *, donate_state: bool = False) -> Callable:
        """`fn(state, batch)`, compiled for plain states laid out as `like` (a tree of
        arrays or shapes whose Variables carry logical axes) and host batches.

        With donate_state, fn returns (new state, outputs) and the state passed in is
        donated; otherwise it returns outputs. Outputs (metrics, sums) come back whole."""

    @abc.abstractmethod
    def one_copy(self, tree):
        """The laid-out tree as one global copy: what a checkpoint saves, decoding reads."""

    @abc.abstractmethod
    def check_rows(self, rows: int, name: str) -> None:
        """Raise a ValueError unless `rows` batch rows can be split over the devices."""


class MeshPlacement(Placement):
    """`jax.jit` with in/out NamedShardings over `mesh`, the parameters laid out by the
    logical-axis `rules`, the batch split by rows and the activations pinned to it. The
    step is the same function as on one device; XLA inserts the collectives (gradient
    all-reduce for data parallelism, parameter all-gathers and gradient reduce-scatters
    for FSDP, activation all-reduces for tensor parallelism). A dimension that does not
    divide by its mesh axes is a ValueError naming the parameter."""

    def __init__(self, mesh: Mesh, rules: Rules = DEFAULT_RULES):
        check_rules(rules, mesh)
        self.mesh, self.rules = mesh, rules
        if mesh.size == 1:
            self.description = f"one device ({mesh.devices.flat[0].device_kind})"
        else:
            sizes = ", ".join(f"{a}={n}" for a, n in mesh.shape.items())
            self.description = (
                f"mesh {sizes} over {mesh.size} devices in {jax.process_count()} process(es); "
                f"each batch in {batch_shards(mesh, rules)} slices"
            )

    def put(self, tree, *, like=None):
        return put(plain(tree), self.shardings(tree if like is None else like))

    def compile(self, fn, like, *, donate_state=False):
        jitted = self._jit(fn, like, donate_state)

        def call(tree, batch):
            with jax.set_mesh(self.mesh):
                return jitted(tree, shard_batch(batch, self.mesh, self.rules))

        return call

    def lower(self, fn, like, tree, batch, *, donate_state=False, platform=None):
        """`compile`'s program lowered for abstract `tree` and `batch` (ShapeDtypeStructs)
        on this mesh, whose devices may be a topology's with none present; `platform`
        (e.g. "tpu") lowers for another platform than the devices'."""
        with jax.set_mesh(self.mesh):
            traced = self._jit(fn, like, donate_state).trace(tree, batch)
            return traced.lower(lowering_platforms=None if platform is None else (platform,))

    def _jit(self, fn, like, donate_state):
        tree_sharding = self.shardings(like)
        whole = NamedSharding(self.mesh, PartitionSpec())

        def traced(tree, batch):
            with activation_sharding(self.mesh, self.rules):
                return fn(tree, batch)

        return jax.jit(
            traced,
            in_shardings=(tree_sharding, batch_sharding(self.mesh, self.rules)),
            out_shardings=(tree_sharding, whole) if donate_state else whole,
            donate_argnums=0 if donate_state else (),
        )

    def one_copy(self, tree):
        return tree

    def check_rows(self, rows, name):
        check_batch_size(rows, self.mesh, self.rules, name=name)

    def shardings(self, like):
        """Plain NamedShardings of the tree `like`, from its Variables' logical axes. On
        several devices a tree without Variables is refused: it would be replicated whole."""
        if self.mesh.size > 1 and not _has_variables(like):
            raise BadValue(
                "the tree to lay out holds no nnx Variables, so nothing says how to split "
                "it; pass like=train.state_layout(graphdef, state) (or like=its params)"
            )
        return plain(state_shardings(like, self.mesh, self.rules))


class PmapPlacement(Placement):
    """Data parallel with `jax.pmap` over the local devices: the state replicated with a
    leading device axis, each device taking B / n rows of the batch."""

    def __init__(self, devices=None):
        self.devices = list(jax.local_devices() if devices is None else devices)
        self.description = f"pmap over {len(self.devices)} devices"

    def put(self, tree, *, like=None):
        return replicate(plain(tree), self.devices)

    def compile(self, fn, like, *, donate_state=False):
        def traced(tree, batch):
            with replica_axis(AXIS):
                return fn(tree, batch)

        donate = (0,) if donate_state else ()
        pmapped = jax.pmap(traced, AXIS, devices=self.devices, donate_argnums=donate)

        def call(tree, batch):
            out = pmapped(tree, split_batch(batch, len(self.devices)))
            return (out[0], unreplicate(out[1])) if donate_state else unreplicate(out)

        return call

    def one_copy(self, tree):
        return unreplicate(tree)

    def check_rows(self, rows, name):
        if rows % len(self.devices):
            raise BadValue(
                f"{name} {rows} is not divisible by the {len(self.devices)} devices of pmap"
            )


def _has_variables(tree) -> bool:
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    return any(is_variable(x) for x in jax.tree.leaves(tree, is_leaf=is_variable))


MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, *, devices: Sequence | None = None
) -> Mesh:
    """A mesh of shape (data, fsdp, tensor) over `devices` (default: every device of every
    process). `data` splits the batch, parameters replicated (data parallel); `fsdp` splits
    the batch and so the parameters and optimizer state (ZeRO-3 / FSDP); `tensor` splits
    attention heads and feed-forward hidden units (Megatron). On several hosts `data`, the
    outermost axis, crosses hosts and `tensor`, the innermost, stays inside one.

    One size may be -1: the devices left over. The product must equal the number of
    devices. Axes are `AxisType.Auto`: XLA propagates the shardings of the inputs."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise BadValue(f"mesh axis {name} must be a positive int or -1, got {size!r}")
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise BadValue(f"only one mesh axis may be -1 (the rest), got {free} in {sizes}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if len(devices) % fixed:
            raise BadValue(
                f"mesh {_show(sizes)} does not fit {len(devices)} devices: "
                f"{len(devices)} is not divisible by {fixed}"
            )
        sizes[free[0]] = len(devices) // fixed
    if math.prod(sizes.values()) != len(devices):
        raise BadValue(
            f"mesh {_show(sizes)} needs {math.prod(sizes.values())} devices, but there are "
            f"{len(devices)}; make the product of the sizes equal the device count "
            "(or give one axis as -1)"
        )
    shape = tuple(sizes[a] for a in MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def parse_mesh(text: str) -> dict[str, int]:
    """'data=2,fsdp=2,tensor=2' -> {'data': 2, 'fsdp': 2, 'tensor': 2} (for make_mesh)."""
    sizes = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in MESH_AXES:
            raise BadValue(
                f"mesh {text!r}: expected comma-separated AXIS=SIZE with AXIS in "
                f"{MESH_AXES}, e.g. 'data=2,fsdp=2,tensor=2'; got {part.strip()!r}"
            )
        if name in sizes:
            raise BadValue(f"mesh {text!r}: axis {name} given twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise BadValue(f"mesh {text!r}: size of {name} must be an int, got {value!r}") from None
    return sizes


def _show(sizes: dict[str, int]) -> str:
    return ",".join(f"{name}={size}" for name, size in sizes.items())


def make_placement(
    mesh: str | dict[str, int] | Mesh | None = None, *, pmap: bool = False, rules=DEFAULT_RULES
) -> Placement:
    """A placement for `mesh` ("data=2,fsdp=2,tensor=2", sizes for `make_mesh`, or a Mesh;
    None: this process's first device), or pmap over the local devices."""
    if pmap:
        if mesh is not None:
            raise BadValue("give a mesh or pmap, not both")
        return PmapPlacement()
    if mesh is None:
        mesh = make_mesh(devices=jax.local_devices()[:1])
    elif not isinstance(mesh, Mesh):
        mesh = make_mesh(**(parse_mesh(mesh) if isinstance(mesh, str) else mesh))
    return MeshPlacement(mesh, rules)


def put(tree, shardings):
    """Place host values (NumPy or single-device arrays, the same on every process) with
    `shardings` (a matching tree, or one sharding for all leaves); each process transfers
    only the slices its own devices hold. Leaves already laid out so are kept; others get
    exactly `shardings` (a compiled step's input types include the kind of sharding, so a
    single-device array where a step returns a one-device NamedSharding would make its
    second call compile again)."""
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)

    def place(x, sharding):
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        if isinstance(x, jax.Array) and x.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree, shardings)


def shard_batch(batch: Batch, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Batch:
    """The global batch (dict of [B, ...] arrays, built identically on every process) with
    its rows split over the `batch` rule's mesh axes. B must divide by their size."""
    for name, x in batch.items():
        check_batch_size(np.shape(x)[0], mesh, rules, name=f"batch[{name!r}] rows")
    return put(batch, batch_sharding(mesh, rules))


def host_copy(tree: Any) -> Any:
    """Every leaf whole on this process's first device (a collective on several processes:
    all must call it). For work only process 0 does, such as plots."""
    if jax.process_count() == 1:
        return tree
    gathered = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), jax.local_devices()[0]), gathered)


# --- pmap: replicas on a leading device axis -------------------------------------------

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
