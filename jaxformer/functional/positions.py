"""Position information: the paper's sinusoids (section 3.5) and rotary embeddings."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.checks import (
    BadValue,
    check_choice,
    check_even,
    check_float_array,
    check_int,
    check_int_array,
    check_rank,
)
from jaxformer.functional.registry import POSITIONS

SINUSOID_LAYOUTS = ("interleaved", "halves")


def sinusoidal_positions(length: int, d_model: int, *, layout: str = "interleaved") -> jax.Array:
    """[length, d_model] table of positions 0, ..., length - 1, with i = 0, ..., d_model/2 - 1:

        layout "interleaved" (the paper):  PE(pos, 2i) = sin(w_i pos), PE(pos, 2i + 1) = cos(w_i pos)
        layout "halves" (Marian):          PE(pos, i)  = sin(w_i pos), PE(pos, d/2 + i) = cos(w_i pos)

    where w_i = 1 / 10000^(2i / d_model). Computed in float64, returned as float32."""
    check_int("length", length, minimum=0)
    check_int("d_model", d_model, minimum=2)
    check_even("d_model", d_model, "sinusoidal positions")
    check_choice("layout", layout, SINUSOID_LAYOUTS)
    pos = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / d_model)
    table = np.empty((length, d_model), dtype=np.float64)
    sin_columns, cos_columns = (
        (slice(0, None, 2), slice(1, None, 2))
        if layout == "interleaved"
        else (slice(0, d_model // 2), slice(d_model // 2, None))
    )
    table[:, sin_columns] = np.sin(angle)
    table[:, cos_columns] = np.cos(angle)
    return jnp.asarray(table, dtype=jnp.float32)


def apply_rope(x: jax.Array, positions: jax.Array, *, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding (Su et al., 2021) of x [B, T, H, D] at positions [B, T] or
    [T]: dimension j pairs with j + D/2 (the GPT-NeoX/LLaMA layout), rotated by positions *
    base^(-2j/D) in float32; the result has x's dtype."""
    check_rank("x", x, 4, "[B, T, H, D]")
    check_float_array("x", x)
    D = x.shape[-1]
    check_even("head dim D", D, "rotary embeddings")
    check_int_array("positions", positions, "of positions")
    if positions.ndim not in (1, 2) or positions.shape[-1] != x.shape[1]:
        raise BadValue(
            f"positions must be [T] or [B, T] with T={x.shape[1]}, got shape {positions.shape}"
        )
    inv_freq = 1.0 / np.power(base, np.arange(0, D, 2, dtype=np.float64) / D)
    inv_freq = jnp.asarray(inv_freq, jnp.float32).reshape((1,) * positions.ndim + (-1,))
    angle = positions.astype(jnp.float32)[..., None] * inv_freq
    if angle.ndim == 2:
        angle = angle[None]
    sin, cos = jnp.sin(angle)[:, :, None, :], jnp.cos(angle)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


# The paper's sinusoids and Marian's [sin | cos] halves, as registered position tables.
POSITIONS.register("sinusoidal", functools.partial(sinusoidal_positions, layout="interleaved"))
POSITIONS.register("sinusoidal_halves", functools.partial(sinusoidal_positions, layout="halves"))
