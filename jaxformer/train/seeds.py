"""Seeds as an axis: k seeds of one configuration trained as one compiled program.

Train states and batches are stacked on a leading seed axis [k, ...] and the step is
`jax.vmap`ped: one program and one dispatch per step for all k.

    states = stack([create_train_state(model_for(seed), optimizer, seed)[1] for seed in seeds])
    step = jax.jit(jax.vmap(train_step), donate_argnums=0)
    states, metrics = step(states, stack_batches([d.train_batch(i, B) for d in datas]))
    per_seed = unstack(states)                 # one TrainState per seed, for its run folder

Batches of different lengths are padded to the longest and the padding masked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer.checks import BadValue

Batch = dict[str, Any]


def seed_step(train_fn: Callable, at_once: int | None = None) -> Callable:
    """`train_fn(state, batch)` for k stacked seeds: vmapped over the seed axis (`at_once`
    None: all k at once), or `jax.lax.map`ped over it, `at_once` seeds vmapped at a time (1:
    one seed after another inside the one program, each step's working set one seed's)."""
    if at_once is None:
        return jax.vmap(train_fn)
    if at_once < 1:
        raise BadValue(f"at_once must be >= 1 (or None: all seeds), got {at_once}")

    def mapped(state, batch):
        return jax.lax.map(lambda pair: train_fn(*pair), (state, batch), batch_size=at_once)

    return mapped


def stack(trees: Sequence[Any]) -> Any:
    """The trees (equal structures and shapes) stacked on a new leading axis [k, ...]."""
    if not trees:
        raise BadValue("stack needs at least one tree")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any) -> list[Any]:
    """The k trees of a tree whose every leaf has a leading axis of k (`stack`'s inverse)."""
    k = {np.shape(x)[0] for x in jax.tree.leaves(tree)}
    if len(k) != 1:
        raise BadValue(f"every leaf needs the same leading (seed) axis, got lengths {sorted(k)}")
    return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(k.pop())]


def stack_batches(batches: Sequence[Batch]) -> Batch:
    """k batches (dicts of NumPy arrays [B, L, ...] with the same keys and rows) as one,
    [k, B, L_max, ...]: each array padded along its second axis to the longest of the k
    (with 0, or False for `*_valid`), so a padded position is masked as padding is."""
    keys = {tuple(sorted(b)) for b in batches}
    if len(keys) != 1:
        raise BadValue(f"the seeds' batches need the same keys, got {sorted(keys)}")
    out = {}
    for key in keys.pop():
        arrays = [np.asarray(b[key]) for b in batches]
        if len({a.shape[:1] for a in arrays}) > 1:
            raise BadValue(f"batch[{key!r}]: the seeds' batches hold different numbers of rows")
        longest = max(a.shape[1] for a in arrays) if arrays[0].ndim > 1 else None
        if longest is not None and any(a.shape[1] != longest for a in arrays):
            if not key.endswith("_valid") and f"{key.split('_')[0]}_valid" not in batches[0]:
                raise BadValue(f"batch[{key!r}] lengths differ between seeds, with no mask")
            arrays = [_pad_length(a, longest) for a in arrays]
        out[key] = np.stack(arrays)
    return out


def _pad_length(a: np.ndarray, length: int) -> np.ndarray:
    width = [(0, 0)] * a.ndim
    width[1] = (0, length - a.shape[1])
    return np.pad(a, width, constant_values=False if a.dtype == bool else 0)


def seed_layout(layout: Any, k: int) -> Any:
    """A state layout (`train.state_layout`) with a leading seed axis of k on every leaf,
    whose logical name is "seeds" (not split by the default rules)."""

    def add_axis(x):
        if isinstance(x, nnx.Variable):
            value = x.get_value()
            axes = ("seeds", *x.get_metadata().get("out_sharding", (None,) * value.ndim))
            return x.replace(
                jax.ShapeDtypeStruct((k, *value.shape), value.dtype), out_sharding=axes
            )
        return jax.ShapeDtypeStruct((k, *np.shape(x)), x.dtype)

    return jax.tree.map(add_axis, layout, is_leaf=lambda x: isinstance(x, nnx.Variable))
