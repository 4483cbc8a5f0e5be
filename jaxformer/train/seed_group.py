"""k seeds of one run trained in one process, each in its own run folder.

    runs = seed_runs(run, seeds=(0, 1, 2))          # run once per seed, in <out>/seed<S>
    summaries = train_seeds(model_config, runs)      # one program for all three

Each seed keeps its separate run's initialisation, dropout key, data order and folder, so
it reads as a separate run (figures equal to float rounding). On an accelerator (or
`vmapped=True`) the step is `jax.vmap`ped over seeds (`jaxformer.train.seeds`); on a CPU
seeds are stepped in turn. A run with a mesh or pmap, a profile or logged internals trains
its seeds separately."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from jaxformer import decode
from jaxformer.checks import BadValue, option
from jaxformer.config import TransformerConfig
from jaxformer.train import loop, report
from jaxformer.train import seeds as seed_axis
from jaxformer.train.config import RunConfig
from jaxformer.train.evaluate import Evaluation
from jaxformer.train.loop import Hook, HookRunner, StepContext, check_hooks
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup, set_up
from jaxformer.train.signals import repeats_dropped, signals_held, stop_signals_raise

UNVMAPPED = ("mesh", "pmap", "profile", "log_internals")  # options seeds cannot share a step with


def seed_runs(run: RunConfig, seeds: Sequence[int], out: str | None = None) -> list[RunConfig]:
    """`run` once per seed, each in `<out>/seed<S>` (default out: the run's own folder)."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise BadValue(f"{option('seeds')} must be distinct, at least one, got {list(seeds)}")
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
    hooks: Sequence[Hook] = (),
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
    with stop_signals_raise():
        return _train_seeds(model_config, runs, resume, progress, hooks, vmapped)


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


class _Seed(NamedTuple):
    """One seed's side of the group: what its separate run's loop would hold (only the
    first seed's progress shows)."""

    setup: Setup
    folder: RunFolder
    evaluation: Evaluation
    meter: loop._Meter
    hooks: HookRunner
    shown: report.Progress


def _train_seeds(model_config, runs, resume, progress, hooks, vmapped) -> list[dict[str, Any]]:
    started = time.perf_counter()
    check_hooks(hooks)
    group, folders = [], []
    stepped = lambda: any(s.meter.step > s.meter.first for s in group)  # noqa: E731
    steps = None
    with loop.undone_on_bad_start(folders, stepped, stepping=lambda: steps is not None):
        setups = _set_up(model_config, runs)  # all bad input before any folder
        states = _open(setups, group, folders, started, resume, progress, hooks)
        steps = _Steps(group[0].setup, states, vmapped)
        _run_steps(group, steps)
    summaries = [_finish(seed) for seed in group]  # the first seed's report is shown
    if progress and group[0].folder.is_main:
        for seed in group[1:]:
            print(f"seed {seed.setup.run.runtime.seed}: results in {seed.folder.path}/")
    return summaries


def _open(setups, group, folders, started, resume, progress, hooks) -> list:
    """Open each seed's folder (added to `folders`) and start it (a _Seed added to
    `group`, its clock from `started`); the seeds' states."""
    states = []
    for setup in setups:
        run, first = setup.run, not group
        folders.append(
            RunFolder(
                run.runtime.out,
                placement=setup.placement,
                meta=setup.meta,
                keep_checkpoints=run.runtime.keep_checkpoints,
                verbose=progress and first,
            )
        )
        state, step = loop._start(setup, folders[-1], resume=resume)
        if not first and step != group[0].meter.first:
            raise BadValue(
                f"resumed seeds must be at one step: {setups[0].run.runtime.out} is at "
                f"{group[0].meter.first}, {run.runtime.out} at {step}; resume them separately"
            )
        group.append(_seed(setup, folders[-1], step, started, progress and first, hooks))
        states.append(state)
    return states


def _seed(setup, folder, step, started, progress, hooks) -> _Seed:
    """A started seed's evaluation, meter, hooks and progress."""
    run = setup.run
    evaluation = Evaluation(setup, earlier=folder.resumed_seconds["eval_seconds"])
    meter = loop._Meter(step, started, folder.resumed_seconds["wall_seconds"])
    shown = report.Progress(progress and folder.is_main, step, run.optim.steps)
    return _Seed(setup, folder, evaluation, meter, loop._hooks(run, evaluation, hooks), shown)


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


class _Steps:
    """The k seeds' states and their step: stacked on a leading seed axis and stepped by
    one vmapped program (`vmapped`), or kept apart and stepped by the first seed's
    one-seed program in turn (one compilation; each batch keeps its own length)."""

    def __init__(self, lead: Setup, states: list, vmapped: bool):
        self.vmapped, placement = vmapped, lead.placement
        if vmapped:
            like = seed_axis.seed_layout(lead.layout, len(states))
            self.fn = placement.compile(jax.vmap(lead.train_fn), like, donate_state=True)
            self.state = placement.put(seed_axis.stack(states), like=like)
        else:
            self.fn, self.state = lead.train_step, states  # each laid out by loop._start

    def step(self, batches: list) -> Any:
        """One step of every seed on its batch; returns the metrics, stacked [k]."""
        if self.vmapped:
            self.state, metrics = self.fn(self.state, seed_axis.stack_batches(batches))
            return metrics
        done = [self.fn(state, batch) for state, batch in zip(self.state, batches, strict=True)]
        self.state = [state for state, _ in done]
        return seed_axis.stack([metrics for _, metrics in done])

    def states(self) -> list:
        return seed_axis.unstack(self.state) if self.vmapped else list(self.state)

    def params(self) -> Any:
        """The seeds' parameters stacked [k, ...] (what `decode.translate_seeds` reads)."""
        return (
            self.state.params if self.vmapped else seed_axis.stack([s.params for s in self.state])
        )


def _run_steps(group: list[_Seed], steps: _Steps) -> None:
    """The steps after the group's first up to the run's last; each step's metrics are
    brought to the host while the next runs and logged in each seed's folder, and after
    a step with hooks due each seed runs them with its own state. On a stop or a hook's
    error every seed's last step is saved before the error is raised again."""
    run = group[0].setup.run
    held, running = [], None
    try:
        for step in range(group[0].meter.first, run.optim.steps):
            batches = [s.setup.data.train_batch(step, run.optim.batch_size) for s in group]
            with signals_held():
                held.append((step + 1, steps.step(batches)))
            _read(group, held, keep=1)  # the step before's, as this one runs
            if group[0].hooks.due(step + 1):  # the seeds' hooks are due together
                records = _read(group, held)  # this step's: a NaN stops the run before hooks
                states = steps.states()
                _decode_together(group, step + 1, steps.params(), states)
                for running, mine, record in zip(group, states, records, strict=True):
                    context = StepContext(
                        step + 1, mine, record, running.folder, running.setup, running.shown.write
                    )
                    running.hooks.run(running.hooks.due(step + 1), context)
                    running.evaluation.prepared.clear()
                    running.meter.restart_window()
                running = None
            group[0].shown.advance()
        if group[0].meter.first >= run.optim.steps:  # resumed complete: the at_end hooks
            for running, mine in zip(group, steps.states(), strict=True):
                at_end, step = running.hooks.due(run.optim.steps), running.meter.step
                running.hooks.run(
                    at_end,
                    StepContext(step, mine, {}, running.folder, running.setup, running.shown.write),
                )
    except KeyboardInterrupt as e:
        stop = e
        with repeats_dropped():
            _save_all(group, held, steps, lambda seed: loop._stop(stop, seed.hooks.running))
        raise
    except Exception:
        if running is None:
            raise
        why = f"hook {running.hooks.running.name!r} raised"
        _save_all(group, held, steps, lambda seed: why)
        raise
    finally:
        for seed in group:
            seed.shown.close()


def _decode_together(group: list[_Seed], step: int, params, states: list) -> None:
    """The dev decodes that the evaluations due after `step` make with this step's
    parameters (`params`, stacked), made for every seed in one vmapped program
    (`decode.translate_seeds`) and handed to each seed's Evaluation (`prepare`); their
    seconds count in every seed's evaluation time, as the group's wall time held them."""
    lead = group[0]
    if lead.setup.data.model_kind != "Transformer":  # a language model decodes nothing
        return
    for hooks in zip(*(seed.hooks.due(step) for seed in group), strict=True):  # one each
        wanted = [seed.evaluation.due(hook.action) for seed, hook in zip(group, hooks, strict=True)]
        if wanted[0] is None or not wanted[0][1]:
            continue
        beam, settings = wanted[0][0], lead.evaluation.settings
        sources = [texts for _, texts in wanted]
        started = time.perf_counter()
        predictions = decode.translate_seeds(
            lead.setup.graphdef,
            params,
            lead.setup.tokenizer,
            sources,
            beam_size=beam,
            alpha=settings.alpha,
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            pad_multiple=settings.pad_multiple,
            max_len=lead.setup.config.max_len,
        )
        seconds = time.perf_counter() - started
        for seed, mine, texts, made in zip(group, states, sources, predictions, strict=True):
            seed.evaluation.prepare(mine.params, beam, texts, made)
            seed.evaluation.seconds += seconds


def _read(group: list[_Seed], held: list, keep: int = 0) -> list[dict | None]:
    """Bring the held steps' metrics [k] but the newest `keep` to the host (one transfer
    a step), give each seed its row and log it in its folder (a NaN loss stops the run).
    Returns each seed's last record read (None where none was)."""
    records = [None] * len(group)
    while len(held) > keep:
        with signals_held():  # a step read is a step logged in every folder
            done, metrics = held[0]
            rows = jax.device_get(metrics)
            for i, seed in enumerate(group):
                seed.meter.hold(done, {name: value[i] for name, value in rows.items()})
                records[i] = loop._read_metrics(seed.meter, seed.folder, seed.shown, seed.setup.run)
            del held[0]
    return records


def _save_all(group: list[_Seed], held: list, steps: _Steps, why) -> None:
    """Every seed's last step saved (unless its loss is NaN), each saying so in one line."""
    _read(group, held)
    for seed, mine in zip(group, steps.states(), strict=True):
        loop._save_before_stopping(
            seed.folder, seed.meter, seed.shown, mine, seed.setup.run, why(seed)
        )


def _finish(seed: _Seed) -> dict[str, Any]:
    """The seed's summary and report, as its separate run writes them."""
    final = seed.evaluation.result
    summary = seed.meter.summary() | final.fields | report.description(seed.setup) | final.tests
    summary |= seed.evaluation.clocks(summary["wall_seconds"])
    report.finish(seed.setup, seed.folder, summary, final.params, final.dev)
    return summary
