"""k seeds of one run trained in one process, each in its own run folder, the seeds an
axis of one program:

    runs = seed_runs(run, seeds=(0, 1, 2))          # run once per seed, in <out>/seed<S>
    summaries = train_seeds(model_config, runs)      # one program for all three

Each seed keeps its separate run's initialisation, dropout key, data order and folder, so
it reads as a separate run (figures equal to float rounding). The group is an adapter
over the one training loop (`loop.train_runs`): its runs' set-ups and a steps object,
`SeedSteps`. On an accelerator (or `vmapped=True`) states and batches are stacked on a
leading seed axis [k, ...] (`stack`, `stack_batches`) and the step is `jax.vmap`ped; on a
CPU seeds are stepped in turn. A run with a mesh or pmap, a profile or logged internals
trains its seeds separately."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxformer import decode
from jaxformer.checks import BadValue, as_given
from jaxformer.config import TransformerConfig
from jaxformer.train import loop
from jaxformer.train.config import RunConfig
from jaxformer.train.optim import eval_params
from jaxformer.train.setup import Setup, set_up

UNVMAPPED = ("mesh", "pmap", "profile", "log_internals")  # options seeds cannot share a step with


def seed_runs(run: RunConfig, seeds: Sequence[int], out: str | None = None) -> list[RunConfig]:
    """`run` once per seed, each in `<out>/seed<S>` (default out: the run's own folder)."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise BadValue(f"{as_given('seeds')} must be distinct, at least one, got {list(seeds)}")
    base = pathlib.Path(out or run.runtime.out)
    fields = run.to_dict()
    return [
        RunConfig.from_options(**(fields | {"seed": s, "out": str(base / f"seed{s}")}))
        for s in seeds
    ]


def train_seeds(
    model_config: TransformerConfig,
    runs: Sequence[RunConfig],
    *,
    resume: bool = False,
    progress: bool = True,
    hooks: Sequence[loop.Hook] = (),
    vmapped: bool | None = None,
) -> list[dict[str, Any]]:
    """Train `runs` (one configuration, differing only in seed and folder) in one process;
    returns their summaries, in order. `vmapped`: one vmapped step for all seeds, else the
    one-seed step on each seed in turn (None: vmapped on an accelerator unless batch_tokens;
    on a CPU the vmapped step measured slower, docs/training.md). One run trains as
    `loop.train` does; resumed, every run must be at the same step; stops and errors as
    `loop.train`."""
    check_seed_runs(runs)
    if len(runs) == 1:
        return [loop.train(model_config, runs[0], resume=resume, progress=progress, hooks=hooks)]
    tokens = runs[0].data.batch_tokens  # each seed's batches hold their own number of rows
    if vmapped is None:
        vmapped = jax.default_backend() != "cpu" and not tokens
    if vmapped and tokens:
        raise BadValue(
            f"batch_tokens={tokens}: the seeds' batches differ in rows and cannot be stacked "
            "in one vmapped step; step them in turn (--vmap-seeds off)"
        )
    return loop.train_runs(
        lambda: _set_up(model_config, runs),
        lambda setups, states: SeedSteps(setups, states, vmapped),
        resume=resume,
        progress=progress,
        hooks=hooks,
    )


def check_seed_runs(runs: Sequence[RunConfig]) -> None:
    """Raise BadValue unless `runs` are one configuration's distinct seeds and folders, and
    (several) use no option that keeps seeds from sharing one step."""
    if not runs:
        raise BadValue("train_seeds needs at least one run")
    rest = [{k: v for k, v in r.to_dict().items() if k not in ("seed", "out")} for r in runs]
    differ = sorted({k for r in rest[1:] for k in r if r[k] != rest[0][k]})
    if differ:
        raise BadValue(f"seeds of one run may differ only in seed and out; these differ: {differ}")
    for name in ("seed", "out"):
        values = [getattr(r.runtime, name) for r in runs]
        if len(set(values)) != len(values):
            raise BadValue(f"each seed needs its own {name}, got {values}")
    given = [n for n in UNVMAPPED if getattr(runs[0].runtime, n) not in (None, False)]
    if len(runs) > 1 and given:
        raise BadValue(
            f"seeds run vmapped on one device, without {', '.join(UNVMAPPED)}; "
            f"this run sets {given}: train its seeds as separate runs"
        )


def _set_up(model_config: TransformerConfig, runs: Sequence[RunConfig]) -> list[Setup]:
    """Each seed's Setup; the data (read, tokenizer learnt, pairs tokenized) is built once
    and reseeded for the others, which gives each seed what its own build would."""
    first = set_up(model_config, runs[0])
    if first.run.data.init_from is not None:  # a pretrained model: each seed loads its own
        return [first, *(set_up(model_config, run) for run in runs[1:])]
    rest = [
        set_up(model_config, run, (first.tokenizer, first.data.reseeded(run.runtime.seed)))
        for run in runs[1:]
    ]
    return [first, *rest]


class SeedSteps:
    """The k seeds' states and their step (`loop.Steps`): stacked on a leading seed axis
    and stepped by one vmapped program (`vmapped`), or kept apart and stepped by the first
    seed's one-seed program in turn (one compilation; each batch keeps its own length)."""

    def __init__(self, setups: list[Setup], states: list, vmapped: bool):
        self.vmapped, self.lead = vmapped, setups[0]
        if vmapped:
            like = seed_layout(self.lead.layout, len(states))
            self.fn = self.lead.placement.compile(
                jax.vmap(self.lead.train_fn), like, donate_state=True
            )
            self.state = self.lead.placement.put(stack(states), like=like)
        else:
            self.fn, self.state = self.lead.train_step, states

    def step(self, done: int, batches: list) -> Any:
        """One step of every seed on its batch; the metrics, stacked [k]."""
        if self.vmapped:
            self.state, metrics = self.fn(self.state, stack_batches(batches))
            return metrics
        stepped = [self.fn(state, batch) for state, batch in zip(self.state, batches, strict=True)]
        self.state = [state for state, _ in stepped]
        return stack([metrics for _, metrics in stepped])

    def rows(self, metrics) -> list[dict]:
        """Each seed's row of the stacked metrics, brought to the host in one transfer."""
        metrics = jax.device_get(metrics)
        k = len(self.state.step) if self.vmapped else len(self.state)
        return [{name: value[i] for name, value in metrics.items()} for i in range(k)]

    def states(self) -> list:
        return unstack(self.state) if self.vmapped else list(self.state)

    def before_hooks(self, runs: list[loop.Run], step: int) -> None:
        """The dev decodes that the evaluations due after `step` make with its parameters,
        made for every seed in one vmapped program (`decode.translate_seeds`) and handed to
        each seed's Evaluation; their seconds count in every seed's evaluation time."""
        if self.lead.data.model_kind != "Transformer":  # a language model decodes nothing
            return
        if self.vmapped:  # what each seed's evaluation decodes with
            params = eval_params(self.state)
        else:
            params = stack([eval_params(state) for state in self.state])
        wanted = [run.evaluation.decodes_due(step) for run in runs]
        settings = runs[0].evaluation.settings
        for due in zip(*wanted, strict=True):  # one decode kind at a time, every seed's
            beam, sources = due[0][0], [texts for _, texts in due]
            started = time.perf_counter()
            predictions = decode.translate_seeds(
                self.lead.graphdef,
                params,
                self.lead.tokenizer,
                sources,
                beam_size=beam,
                alpha=settings.alpha,
                max_new_tokens=settings.max_new_tokens,
                batch_size=settings.batch_size,
                pad_multiple=settings.pad_multiple,
                max_len=self.lead.config.max_len,
            )
            seconds = time.perf_counter() - started
            for run, texts, made in zip(runs, sources, predictions, strict=True):
                run.evaluation.prepare(step, beam, texts, made)
                run.evaluation.seconds += seconds


# --- the seed axis ----------------------------------------------------------------------

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
