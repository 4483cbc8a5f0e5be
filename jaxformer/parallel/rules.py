"""Sharding rules: from the logical axis names that parameters carry to mesh axes.

Every parameter declares logical axes (`jaxformer.nn.LOGICAL_AXES`), e.g. W^Q [E, H, Dk]
is ("embed", "heads", "kv"). A rule maps each name to a mesh axis (a tuple, or None = not
split). The defaults give data, FSDP and tensor parallelism; a size-1 mesh axis is off:

    batch     -> (data, fsdp)  every batch row lives on one (data, fsdp) slice
    embed     -> fsdp          parameters (and Adam's moments) split by d_model
    norm      -> fsdp
    heads     -> tensor        W^Q, W^K, W^V split by output head, W^O by input head
    mlp       -> tensor        W1 split by column, W2 by row: one all-reduce per sub-layer
    kv, vocab, position, layers, seeds -> not split
Pass `rules=DEFAULT_RULES | {"vocab": "tensor"}` to split a large vocabulary."""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxformer.checks import BadValue, as_given
from jaxformer.nn.parameters import LOGICAL_AXES

Rules = Mapping[str, str | tuple[str, ...] | None]

DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "norm": "fsdp",
    "heads": "tensor",
    "mlp": "tensor",
    "kv": None,
    "vocab": None,
    "position": None,
    "layers": None,
    "seeds": None,
}


def check_rules(rules: Rules, mesh: Mesh) -> None:
    """Every logical axis (and `batch`) has a rule, and rules name only mesh axes."""
    missing = [name for name in ("batch", *LOGICAL_AXES) if name not in rules]
    if missing:
        raise BadValue(f"sharding rules lack logical axes {missing}; rules: {dict(rules)}")
    for name, target in rules.items():
        for axis in _as_tuple(target):
            if axis not in mesh.axis_names:
                raise BadValue(
                    f"sharding rule {name} -> {target!r} names {axis!r}, which is not a mesh "
                    f"axis; the mesh has {mesh.axis_names}"
                )


def state_specs(tree, rules: Rules = DEFAULT_RULES):
    """PartitionSpecs for a tree holding nnx Variables (parameters, a TrainState, Adam's
    moments): each Variable by its logical axes and `rules`; other arrays replicated."""
    with nnx.logical_axis_rules(tuple(rules.items())):
        return nnx.get_partition_spec(tree)


def state_shardings(tree, mesh: Mesh, rules: Rules = DEFAULT_RULES):
    """NamedShardings for `tree` (as `state_specs`), after checking that every split
    dimension divides by its mesh axes; a dimension that does not is a ValueError."""
    check_rules(rules, mesh)
    specs = state_specs(tree, rules)
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731

    def sharding(path, value, spec):
        if isinstance(value, nnx.Variable):  # keep the Variable node, hold a sharding
            logical = value.get_metadata().get("out_sharding")
            named = NamedSharding(mesh, spec.get_value())
            _check_divisible(jax.tree_util.keystr(path), value.shape, named.spec, mesh, logical)
            return spec.replace(named)
        _check_divisible(jax.tree_util.keystr(path), np.shape(value), spec, mesh, None)
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, tree, specs, is_leaf=is_var)


def batch_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """Batch arrays [B, ...]: rows split over the `batch` rule's mesh axes."""
    return NamedSharding(mesh, PartitionSpec(rules["batch"]))


def batch_shards(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> int:
    """Into how many slices the batch rows are cut (data * fsdp with the default rules)."""
    return math.prod(mesh.shape[a] for a in _as_tuple(rules["batch"]))


def check_batch_size(batch_size: int, mesh: Mesh, rules: Rules = DEFAULT_RULES, name="batch size"):
    n = batch_shards(mesh, rules)
    if batch_size % n:
        axes = "*".join(_as_tuple(rules["batch"]))
        raise BadValue(
            f"{name} {batch_size} is not divisible by {axes} = {n} of mesh "
            f"{dict(mesh.shape)}; choose a multiple of {n}"
        )


def _check_divisible(where: str, shape, spec: PartitionSpec, mesh: Mesh, logical) -> None:
    for dim, target in enumerate(spec):
        size = math.prod(mesh.shape[a] for a in _as_tuple(target))
        if shape[dim] % size:
            name = f" ({logical[dim]})" if logical else ""
            raise BadValue(
                f"parameter {where} of shape {tuple(shape)}: dimension {dim}{name} of size "
                f"{shape[dim]} is not divisible by mesh axis {target} of size {size}; "
                f"choose sizes that divide (e.g. {as_given('num_heads')} and "
                f"{as_given('num_kv_heads')} by tensor, {as_given('d_model')} by fsdp) or "
                f"change the {as_given('mesh')}"
            )


def _as_tuple(target) -> tuple[str, ...]:
    if target is None:
        return ()
    return (target,) if isinstance(target, str) else tuple(target)
