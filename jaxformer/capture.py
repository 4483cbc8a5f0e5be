"""Look inside a model and change one thing: the named sites of `functional.sites`
(`encoder/0/self_attention/weights`, `decoder/1/ffn/hidden`, ...) read and replaced in
one jitted forward pass of any model, without changing its code.

    logits, values = capture.run(model, src, tgt, capture=["decoder/*/cross_attention/weights"])
    ablated, _ = capture.run(model, src, tgt,
                             interventions={"decoder/1/self_attention/heads": capture.ablate_heads([0, 2])})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer.checks import BadValue, check_instance, check_int
from jaxformer.functional import sites


def run(
    model: nnx.Module,
    *args,
    capture: Iterable[str] = (),
    interventions: dict[str, Callable] | None = None,
    **kwargs,
) -> tuple[Any, dict[str, jax.Array]]:
    """`model(*args, **kwargs)` compiled once (positional arguments traced, keyword ones such
    as `deterministic` passed as given): (its output, {site: value}) for the sites matching
    the `capture` globs (`*` matches one path piece or more), each site in `interventions`
    replaced by f(value). A pattern or intervention matching no site is a ValueError listing
    the model's sites; a scan_layers=True model, with no per-layer sites, is one too."""
    check_instance("model", model, nnx.Module)
    capture = [capture] if isinstance(capture, str) else list(capture)
    interventions = dict(interventions or {})
    graphdef, state = nnx.split(model)

    def forward(state, args):  # keyword arguments stay Python values (deterministic=...)
        with sites.recording(capture, interventions) as rec:
            out = nnx.merge(graphdef, state)(*args, **kwargs)
        rec.check()
        return out, rec.values

    return jax.jit(forward)(state, args)


def ablate_heads(heads: Sequence[int]) -> Callable[[jax.Array], jax.Array]:
    """For a `.../heads` site [B, T, H, Dv]: the given heads' outputs set to zero."""
    return scale_heads(heads, 0.0)


def scale_heads(heads: Sequence[int], factor: float) -> Callable[[jax.Array], jax.Array]:
    """For a `.../heads` site [B, T, H, Dv]: the given heads' outputs times `factor`."""
    heads = [heads] if isinstance(heads, int) else list(heads)
    for h in heads:
        check_int("head", h, minimum=0)

    def change(x):
        H = x.shape[2]
        out_of_range = [h for h in heads if h >= H]
        if out_of_range:
            raise BadValue(f"head {out_of_range[0]} is out of range: the layer has {H} heads")
        scale = jnp.ones((H,), x.dtype).at[jnp.asarray(heads, jnp.int32)].set(factor)
        return x * scale[None, None, :, None]

    return change


def patch(value: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """Replace a site's value with `value` (of the same shape and dtype), e.g. one
    captured on another input: activation patching."""

    def change(x):
        if value.shape != x.shape:
            raise BadValue(f"patch of shape {value.shape} for a site of shape {x.shape}")
        return jnp.asarray(value, x.dtype)

    return change
