"""The training loop under every run, one or a group of k seeds (`seeds.train_seeds`): set
up, start or resume each run's folder, then for each step batches -> compiled step ->
the hooks due after it, then each run's summary and report.

Hooks: a `Hook` runs its action every N steps, given a `StepContext` (the step, its state
and metrics, the run folder, the set-up), in this order: the in-run evaluation, the
checkpoint (also after the last step), a caller's, the final evaluation (the last step
only). A NaN loss stops the run before any hook sees its state.

Stopping: Ctrl-C, SIGTERM and SIGHUP wait until the step in flight has given back its
donated state (`signals`); the last step done is saved, one line says so, and `train`
raises KeyboardInterrupt or `Terminated` (the command exits 130, 143 or 129). A mesh
(`RunConfig.runtime.mesh`) or pmap spreads the run over devices (`jaxformer.parallel`); on
several processes each runs this loop, building the global batch, placing its own rows."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxformer import plots
from jaxformer.checks import (
    BadType,
    BadValue,
    InputError,
    as_given,
    check_bool,
    check_instance,
    check_int,
)
from jaxformer.config import TransformerConfig
from jaxformer.files import code_version, versions
from jaxformer.models import Transformer
from jaxformer.parallel import is_main_process
from jaxformer.signals import (
    Terminated,
    repeats_dropped,
    signals_held,
    stop_signals_raise,
)
from jaxformer.train import report
from jaxformer.train.config import RunConfig
from jaxformer.train.evaluate import Evaluation
from jaxformer.train.optim import eval_params
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup, set_up
from jaxformer.train.steps import TrainState


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a hook is given after step `step` (the number of steps done: 1 after the first).

    state    the TrainState after that step, valid during the call only (the next step
             donates its buffers): keep what you need (`jax.device_get`)
    metrics  that step's train record as logged; {} in a run resumed at its last step
    folder   the run folder: `folder.log(record)` appends to metrics.jsonl
    setup    the run's `Setup`: run config, data, tokenizer, model config, placement
    say      prints a line on process 0, unless progress=False
    """

    step: int
    state: TrainState
    metrics: dict[str, float]
    folder: RunFolder
    setup: Setup
    say: Callable[[str], None]

    def model(self) -> nnx.Module:
        """The model with the state's parameters to evaluate (`optim.eval_params`: one copy
        of them, on the device)."""
        params = eval_params(self.state)
        return nnx.merge(self.setup.graphdef, self.setup.placement.one_copy(params))


@dataclasses.dataclass(frozen=True)
class Hook:
    """`action(context)` after steps every, 2 * every, ... before the run's last step, and
    after the last step only when `at_end` (every=3 over 10 steps: 3, 6, 9, and 10 with
    at_end); `name` names it in messages. A hook that raises stops the run with its error,
    after saving the last step done."""

    every: int
    action: Callable[[StepContext], None]
    name: str
    at_end: bool = False

    def __post_init__(self):
        check_instance("a hook's name", self.name, str)
        check_int(f"hook {self.name!r}: every", self.every)
        if not callable(self.action):
            raise BadType(
                f"hook {self.name!r}: action must be callable (a function of the "
                f"StepContext), got {type(self.action).__name__}"
            )
        check_bool(f"hook {self.name!r}: at_end", self.at_end)

    def due(self, step: int, last: int) -> bool:
        """Whether the hook runs after step `step` of a run of `last` steps."""
        return self.at_end if step == last else step % self.every == 0


class HookRunner:
    """A run's hooks, in the order they run, for a run of `last` steps; `running` is the
    hook running (None between hooks), which a stopped run names."""

    def __init__(self, hooks: list[Hook], last: int):
        self.hooks, self.last, self.running = hooks, last, None

    def due(self, step: int) -> list[Hook]:
        """The hooks that run after step `step`, in order (after the last: the at_end ones)."""
        return [hook for hook in self.hooks if hook.due(step, self.last)]

    def run(self, hooks: list[Hook], context: StepContext) -> None:
        """Each of `hooks` (in order) on `context`."""
        for hook in hooks:
            self.running = hook
            hook.action(context)
        self.running = None


class Run(NamedTuple):
    """One run's side of the loop: its set-up, folder, evaluation, meter, hooks and the
    progress it shows (a group shows its first run's)."""

    setup: Setup
    folder: RunFolder
    evaluation: Evaluation
    meter: Meter
    hooks: HookRunner
    shown: report.Progress

    def context(self, step: int, state: TrainState, record: dict | None) -> StepContext:
        return StepContext(step, state, record or {}, self.folder, self.setup, self.shown.write)

    def log(self, step: int, metrics: dict) -> dict[str, float]:
        """Log step `step`'s metrics (on the host): the internals always, the step's record
        when its log is due (every log_every steps and the last); returns the record.
        Raises TrainingDiverged on a non-finite loss, before anything is logged."""
        record, internals = self.meter.read(step, metrics, self.folder)
        if internals is not None:
            self.folder.log(report.internals_record(step, internals))
        if step % self.setup.run.runtime.log_every == 0 or step == self.setup.run.optim.steps:
            self.folder.log(record)
            self.shown.show(record)
            self.meter.restart_window()
        return record


class RunSteps:
    """One run's state and its compiled steps (the internals variant on the steps it logs):
    the loop's steps object. A group's (`seeds.SeedSteps`) steps k runs the same way:
    `step` (the metrics, on the device), `rows` (each run's, on the host), `states`, and
    `before_hooks` (work the runs' hooks share: a group's decodes)."""

    def __init__(self, setups: list[Setup], states: list[TrainState]):
        (self.setup,), (self.state,) = setups, states

    def step(self, done: int, batches: list) -> Any:
        self.state, metrics = self.setup.step_for(done)(self.state, batches[0])
        return metrics

    def rows(self, metrics) -> list[dict]:
        return [jax.device_get(metrics)]

    def states(self) -> list[TrainState]:
        return [self.state]

    def before_hooks(self, runs: list[Run], step: int) -> None:
        pass


def train(
    model_config: TransformerConfig,
    run: RunConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    hooks: Sequence[Hook] = (),
) -> dict[str, Any]:
    """Train, evaluate and report; returns the summary (also written to summary.json).

    The vocabulary is the tokenizer's. `resume` continues from the latest checkpoint in
    `run.runtime.out`; `hooks` run after the built-in evaluation and checkpoint. Without
    `progress` only warnings and stops are printed (stderr). Raises TrainingDiverged on a
    non-finite loss (the last good checkpoint stays); re-raises KeyboardInterrupt,
    Terminated and a hook's error after saving the last completed step."""
    set_up_one = lambda: [set_up(model_config, run)]  # noqa: E731
    return train_runs(set_up_one, RunSteps, resume=resume, progress=progress, hooks=hooks)[0]


def train_runs(
    set_up_runs: Callable[[], list[Setup]],
    make_steps: Callable[[list[Setup], list[TrainState]], RunSteps],
    *,
    resume: bool,
    progress: bool,
    hooks: Sequence[Hook],
) -> list[dict[str, Any]]:
    """Train the runs that `set_up_runs()` sets up (everything that can fail before a
    folder exists), stepped together by `make_steps(setups, states)`; their summaries.
    Resumed, every run must be at the same step. Stops and errors as `train`."""
    with stop_signals_raise():
        return _train(set_up_runs, make_steps, resume, progress, hooks)


def _train(set_up_runs, make_steps, resume, progress, hooks) -> list[dict[str, Any]]:
    started = time.perf_counter()
    check_instance("hooks", hooks, (list, tuple))
    for i, hook in enumerate(hooks):
        check_instance(f"hooks[{i}]", hook, Hook)
    runs, folders, held = [], [], []  # held: the steps done whose metrics are not yet read
    stepped = lambda: any(r.meter.step > r.meter.first for r in runs)  # noqa: E731
    with _undone_on_bad_start(folders, stepped, stepping=lambda: bool(held) or stepped()):
        setups = set_up_runs()
        evaluations = [Evaluation(setup) for setup in setups]  # bad metrics before a folder
        states = []
        for setup, evaluation in zip(setups, evaluations, strict=True):
            verbose, runtime = progress and not runs, setup.run.runtime
            folders.append(
                RunFolder(
                    runtime.out,
                    placement=setup.placement,
                    meta=setup.meta,
                    keep_checkpoints=runtime.keep_checkpoints,
                    verbose=verbose,
                )
            )
            state = _start(setup, folders[-1], evaluation, resume=resume)
            runs.append(_run(setup, folders[-1], evaluation, state, started, verbose, hooks))
            states.append(state)
            if (first := runs[-1].meter.first) != runs[0].meter.first:
                at = f"{runs[0].folder.path} is at {runs[0].meter.first}, {folders[-1].path} at {first}"
                raise BadValue(f"resumed seeds must be at one step: {at}; resume them separately")
        steps = make_steps(setups, states)
        with _out_of_memory_is_bad_input(setups[0].run):
            _run_steps(runs, steps, held)
    summaries = [_finish(run) for run in runs]  # the first run's report is shown
    if progress and runs[0].folder.is_main:
        for run in runs[1:]:
            print(f"seed {run.setup.run.runtime.seed}: results in {run.folder.path}/")
    return summaries


@contextlib.contextmanager
def _out_of_memory_is_bad_input(run: RunConfig):
    """A step that does not fit the device's memory (XLA's RESOURCE_EXHAUSTED, compiling or
    running) is bad input: one line naming the batch, not XLA's traceback."""
    try:
        yield
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        why = str(error).strip().splitlines()[0]
        raise BadValue(
            f"{as_given('batch_size', run.optim.batch_size)} does not fit in memory ({why}); "
            f"give a smaller {as_given('batch_size')}, or more {as_given('accum_steps')}"
        ) from None


@contextlib.contextmanager
def _undone_on_bad_start(
    folders: list[RunFolder], stepped: Callable[[], bool], stepping: Callable[[], bool]
):
    """On bad input (an InputError) before the first step (while not `stepped()`), or a
    stop (Ctrl-C, SIGTERM, SIGHUP) before the first step is done (while not `stepping()`;
    tracing and compiling included; later the steps save and say so themselves), undo the opening of `folders` (what they made goes,
    what was there stays): a run that never started leaves no folder. A stop says so in
    one line."""
    try:
        yield
    except InputError:
        for folder in [] if stepped() else reversed(folders):
            folder.undo()
        raise
    except KeyboardInterrupt as stop:
        if not stepping():
            with repeats_dropped():
                for folder in reversed(folders):
                    folder.undo()
                if is_main_process():
                    why = f"{_stop(stop, None)} before the first step: nothing to save"
                    print(f"{why}; continue with {report.continue_command()}", file=sys.stderr)
        raise


def _start(setup: Setup, folder: RunFolder, evaluation: Evaluation, *, resume: bool) -> TrainState:
    """The laid-out state to start from (fresh or restored); writes the tokenizer and
    config.json, opens the trackers (run.runtime.tracker) and says what the run
    is. A resumed run's evaluation counts its kept evaluations' seconds."""
    placement, config, run = setup.placement, setup.config, setup.run
    state = placement.put(setup.state, like=setup.layout)
    if folder.start(resume=resume):
        state = placement.put(folder.restore(state), like=setup.layout)
    evaluation.seconds = folder.resumed_seconds["eval_seconds"]
    if folder.is_main:
        setup.tokenizer.save(folder.path)
    folder.write_json("config.json", {"model": config.to_dict(), "run": run.to_dict()})
    step = int(placement.one_copy(state.step))
    asked, vocab = setup.requested_vocab, config.vocab_size
    note = "" if asked == vocab else f"; the model config said {asked}"
    folder.say(f"code: {code_version()}")
    if setup.data.description:
        folder.say(setup.data.description)
    folder.say(
        f"training on {placement.description}, vocabulary of {vocab} ids (the tokenizer's{note})"
    )
    if step >= run.optim.steps:
        folder.say(
            f"the run was already complete ({step} of {run.optim.steps} steps done): "
            "nothing left to train; evaluating its final model again"
        )
    tracked = {"model": config.to_dict(), "run": run.to_dict(), "code": code_version()}
    folder.open_trackers(run.runtime, step, tracked | {"versions": versions()})
    return state


def _run(setup, folder, evaluation, state, started, verbose, hooks) -> Run:
    """A started run's side of the loop, its clock from `started`."""
    run, first = setup.run, int(setup.placement.one_copy(state.step))
    in_order = [
        Hook(run.eval.eval_every, _in_run(evaluation), "in-run evaluation"),
        Hook(run.runtime.checkpoint_every, _checkpoint, "checkpoint", at_end=True),
        *hooks,
        Hook(run.optim.steps, _final(evaluation), "final evaluation", at_end=True),
    ]
    meter = Meter(first, started, folder.resumed_seconds["wall_seconds"])
    shown = report.Progress(verbose and folder.is_main, first, run.optim.steps)
    return Run(setup, folder, evaluation, meter, HookRunner(in_order, run.optim.steps), shown)


def _checkpoint(context: StepContext) -> None:
    context.folder.save(context.state)


def _in_run(evaluation: Evaluation) -> Callable[[StepContext], None]:
    return lambda c: evaluation.in_run(c.step, eval_params(c.state), c.folder, c.say)


def _final(evaluation: Evaluation) -> Callable[[StepContext], None]:
    return lambda c: evaluation.final(c.step, c.state, c.folder, c.say)


def _run_steps(runs: list[Run], steps: RunSteps, held: list) -> None:
    """The steps after the runs' first up to their last, each followed by the hooks due
    then (a run resumed complete runs only the at_end ones). Each step's metrics are
    brought to the host while the next runs (`held` until then). A stop or a hook's error
    saves every run's last step done (unless its loss is NaN) before it is raised again;
    a stop during the first step, which traces and compiles, has nothing to save."""
    lead = runs[0]
    first, last = lead.meter.first, lead.setup.run.optim.steps
    batch_size, running = lead.setup.run.optim.batch_size, None
    profiler = _Profiler(lead.setup.run.runtime.profile_steps, lead.folder)
    try:
        for step in range(first, last):
            profiler.before(step)
            batches = [run.setup.data.train_batch(step, batch_size) for run in runs]
            # a stop after a step finds its metrics held; the first stops at once
            with signals_held() if step > first else contextlib.nullcontext():
                held.append((step + 1, steps.step(step + 1, batches)))
            profiler.after(step + 1, held[-1][1])
            _read(runs, held, steps, keep=1)  # the step before's, as this one runs
            if lead.hooks.due(step + 1):  # the runs' hooks are due together
                records = _read(runs, held, steps)  # a NaN stops the run before any hook
                steps.before_hooks(runs, step + 1)
                for running, state, record in zip(runs, steps.states(), records, strict=True):
                    running.hooks.run(
                        running.hooks.due(step + 1), running.context(step + 1, state, record)
                    )
                    running.meter.restart_window()  # tokens/s leaves out the hooks' time
                running = None
            lead.shown.advance()
        if first >= last:  # resumed complete: the at_end hooks, no record
            for running, state in zip(runs, steps.states(), strict=True):
                running.hooks.run(running.hooks.due(last), running.context(first, state, None))
    except KeyboardInterrupt as stop:  # Ctrl-C, and Terminated
        if not held and lead.meter.step == first:
            raise  # in the first step: the caller undoes the folders
        with repeats_dropped():
            _save_all(runs, held, steps, [_stop(stop, run.hooks.running) for run in runs])
        raise
    except Exception:
        if running is None:
            raise
        why = f"hook {running.hooks.running.name!r} raised"
        _save_all(runs, held, steps, [why] * len(runs))
        raise
    finally:
        for run in runs:
            run.shown.close()
        profiler.close()


def _read(runs: list[Run], held: list, steps: RunSteps, keep: int = 0) -> list[dict | None]:
    """Bring the held steps' metrics but the newest `keep` to the host (one transfer a
    step) and log each run's (a NaN loss stops the run); each run's last record read."""
    records = [None] * len(runs)
    while len(held) > keep:
        with signals_held():  # a step read is a step logged in every folder
            done, metrics = held[0]
            for i, (run, row) in enumerate(zip(runs, steps.rows(metrics), strict=True)):
                records[i] = run.log(done, row)
            del held[0]
    return records


def _save_all(runs: list[Run], held: list, steps: RunSteps, whys: list[str]) -> None:
    """Every run's last step saved (unless its loss is NaN: no checkpoint of a diverged
    state), each saying why in one line on stderr (with or without progress)."""
    _read(runs, held, steps)
    for run, state, why in zip(runs, steps.states(), whys, strict=True):
        run.shown.close()
        step = run.folder.save(state)
        if run.folder.is_main:
            where, resume = run.folder.checkpoints.directory, report.continue_command()
            print(f"{why}: saved step {step} in {where}; continue with {resume}", file=sys.stderr)


def _stop(error: KeyboardInterrupt, hook: Hook | None) -> str:
    """What stopped the run: "interrupted" (Ctrl-C) or "terminated by SIGTERM", and
    "during the NAME" of the hook running, if one was."""
    stop = f"terminated by {error}" if isinstance(error, Terminated) else "interrupted"
    return stop if hook is None else f"{stop} during the {hook.name}"


def _finish(run: Run) -> dict[str, Any]:
    """The run's summary; the folder closed, then on process 0 the plots (the final
    model's cross-attention on the first dev pair), summary.json (last: it marks a
    finished run) and the console report (the first dev pairs' predictions, the totals)."""
    setup, folder, final = run.setup, run.folder, run.evaluation.result
    summary = run.meter.summary() | final.fields | setup.description() | final.tests
    summary |= run.evaluation.clocks(summary["wall_seconds"])
    folder.close(summary)
    if not folder.is_main:
        return summary
    plots.loss_curves(folder.metrics_path, folder.path / "loss.png")
    if setup.run.runtime.log_internals is not None:
        plots.internals(folder.metrics_path, folder.path / "internals.png")
    pairs, predictions = final.dev
    model = nnx.merge(setup.graphdef, final.params)
    if isinstance(model, Transformer) and pairs:
        plots.cross_attention(model, setup.tokenizer, pairs[0], folder.path / "attention.png")
    folder.write_json("summary.json", summary)
    if folder.verbose:
        examples = [(s, p, t) for p, (s, t) in zip(predictions[:8], pairs[:8], strict=False)]
        report.print_summary(summary, examples, folder.path)
    return summary


class Meter:
    """Counts a run's steps and target tokens, times them, and stops the run on a NaN
    loss. Wall time adds `earlier`, the seconds earlier processes of a resumed run took to
    reach its checkpoint; tokens/s is this process's. Metrics are read one step late, so
    the host never waits for the step it has just dispatched."""

    def __init__(self, first: int, started: float, earlier: float = 0.0):
        self.first = self.step = first
        self.earlier = earlier
        self.tokens = self.window_tokens = 0
        self.start = self.window_start = time.perf_counter()
        self.started, self.to_first_step = started, None

    def read(self, step: int, metrics: dict, folder: RunFolder) -> tuple[dict[str, float], Any]:
        """(log record with tokens/s since the window began, internals or None) of step
        `step`'s `metrics` (on the host). Raises TrainingDiverged on a NaN loss."""
        metrics = dict(metrics)
        internals = metrics.pop("internals", None)
        loss = float(metrics["loss"])
        if not math.isfinite(loss):
            raise TrainingDiverged(_diverged(loss, step, folder))
        self.step = step
        n = int(metrics["tokens"])
        self.tokens, self.window_tokens = self.tokens + n, self.window_tokens + n
        now = time.perf_counter()
        if self.to_first_step is None:  # set-up, compilation and the first step
            self.to_first_step = now - self.started
        record = {"step": step, **{k: float(v) for k, v in metrics.items() if k != "tokens"}}
        record["tokens_per_second"] = self.window_tokens / max(now - self.window_start, 1e-9)
        record["wall_seconds"] = round(self.earlier + now - self.start, 2)
        return record, internals

    def restart_window(self) -> None:
        """Start a new tokens/s window (after a log record, and after hooks ran)."""
        self.window_start, self.window_tokens = time.perf_counter(), 0

    def summary(self) -> dict[str, Any]:
        """summary.json's steps, steps_run, wall_seconds, seconds_to_first_step (None if no
        step ran) and train_tokens_per_second."""
        wall = time.perf_counter() - self.start
        first = self.to_first_step
        return {
            "steps": self.step,
            "steps_run": self.step - self.first,
            "wall_seconds": round(self.earlier + wall, 2),
            "seconds_to_first_step": None if first is None else round(first, 2),
            "train_tokens_per_second": round(self.tokens / max(wall, 1e-9), 1),
        }


def _diverged(loss: float, step: int, folder: RunFolder) -> str:
    """What a run whose loss became `loss` at `step` says: where its last good checkpoint
    is, or that it saved none, and what would help."""
    where, saved = folder.checkpoints.directory, folder.checkpoints.latest_step()
    if saved is None:
        return (
            f"the training loss became {loss} at step {step}, before the first checkpoint: "
            f"no checkpoint was saved; try a lower {as_given('lr')} or more "
            f"{as_given('warmup_steps')}"
        )
    return f"the training loss became {loss} at step {step}; the last good checkpoint (step {saved}) is intact in {where}"


class _Profiler:
    """A jax.profiler trace of the steps after START up to STOP, in <out>/profile (open it
    with Perfetto or TensorBoard's profile plugin; see docs/performance.md, "Profiles")."""

    def __init__(self, steps: tuple[int, int] | None, folder: RunFolder):
        self.steps, self.folder, self.on = steps, folder, False

    def before(self, step: int) -> None:
        if self.steps and step == self.steps[0] and self.folder.is_main:
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0  # Python calls would fill the trace's event cap
            path = self.folder.path / "profile"
            jax.profiler.start_trace(path, create_perfetto_trace=True, profiler_options=options)
            self.on = True

    def after(self, done: int, outputs) -> None:
        """After step `done` was dispatched (its `outputs`, on the device)."""
        if self.on and done == self.steps[1]:
            jax.block_until_ready(outputs)
            self.close()
            self.folder.say(
                f"profile of steps {self.steps[0] + 1}-{done}: {self.folder.path / 'profile'}"
            )

    def close(self) -> None:
        if self.on:
            jax.profiler.stop_trace()
            self.on = False
