"""What the converters share: setting an abstract jaxformer module's parameters from a
flat mapping of arrays, and reading them back."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import BadValue

Path = tuple[str | int, ...]


def fill_params(target: nnx.Module, arrays: dict[Path, np.ndarray], source: str) -> None:
    """Set every parameter of the abstract `target` (from nnx.eval_shape) from `arrays`,
    which must hold exactly its parameters with their shapes; errors name the `source`."""
    state = nnx.state(target, nnx.Param)
    flat = list(nnx.to_flat_state(state))
    missing = [dotted(p) for p, _ in flat if p not in arrays]
    extra = sorted(dotted(p) for p in set(arrays) - {p for p, _ in flat})
    if missing or extra:
        raise BadValue(f"{source}: no weight for {missing}; no place for {extra}")
    for path, var in flat:
        array = arrays[path]
        if array.shape != var.shape:
            raise BadValue(
                f"{source}: {dotted(path)} has shape {array.shape}, expected {var.shape}"
            )
        var.set_value(jnp.asarray(array, var.dtype))
    nnx.update(target, state)


def params_of(module: nnx.Module) -> dict[Path, np.ndarray]:
    """Every parameter of `module` as a float32 NumPy array, by path."""
    flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
    return {path: np.asarray(var[...], np.float32) for path, var in flat}


def dotted(path: Path) -> str:
    return ".".join(map(str, path))
