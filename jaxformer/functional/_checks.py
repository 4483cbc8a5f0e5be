"""Trace-time argument checks shared by the public functions.

Shapes and dtypes are static under `jit`, so these raise before XLA ever sees the
arguments, with a message naming the argument, what was given and what was expected.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def check_rank(name: str, x, rank: int, layout: str = "") -> None:
    ndim = np.ndim(x)
    if ndim != rank:
        want = f" {layout}" if layout else ""
        raise ValueError(
            f"{name} must have rank {rank}{want}, got shape {tuple(np.shape(x))} (rank {ndim})"
        )


def check_float(name: str, x) -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}")


def check_int(name: str, x, what: str = "of token ids") -> None:
    if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
        raise TypeError(f"{name} must be an integer array {what}, got dtype {jnp.result_type(x)}")


def check_broadcastable(name: str, x, target: tuple[int, ...], layout: str) -> None:
    shape = tuple(np.shape(x))
    if len(shape) > len(target):
        raise ValueError(f"{name} of shape {shape} has more dimensions than {layout} = {target}")
    padded = (1,) * (len(target) - len(shape)) + shape
    if any(s not in (1, t) for s, t in zip(padded, target, strict=True)):
        raise ValueError(f"{name} of shape {shape} is not broadcastable to {layout} = {target}")


def check_shape(name: str, x, shape: tuple[int, ...], layout: str) -> None:
    if tuple(np.shape(x)) != tuple(shape):
        raise ValueError(
            f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(np.shape(x))}"
        )


def check_rate(name: str, rate) -> None:
    """A probability in [0, 1), such as a dropout rate."""
    if not isinstance(rate, int | float | np.number) or isinstance(rate, bool):
        raise TypeError(f"{name} must be a number in [0, 1), got {rate!r}")
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {rate}")
