"""The device mesh: three named axes, `data`, `fsdp` and `tensor`.

    data    the batch is split; parameters are replicated (data parallel)
    fsdp    the batch is split and so are parameters and optimizer state (ZeRO-3 / FSDP)
    tensor  attention heads and the feed-forward hidden units are split (Megatron)

The mesh spans every device of every process; on several hosts the outermost axis,
`data`, crosses hosts and `tensor`, the innermost, stays inside one."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from jaxformer.checks import BadValue

MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, *, devices: Sequence | None = None
) -> Mesh:
    """A mesh of shape (data, fsdp, tensor) over `devices` (default: all of them).

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
