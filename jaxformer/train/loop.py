"""The training loop: set up (`setup.set_up`), start or resume in the run folder, then for
each step batch -> compiled step -> the hooks due after it, then the summary and the
report (`report`).

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
from typing import Any

import jax
from flax import nnx

from jaxformer.checks import BadType, InputError, check_bool, check_instance, check_int
from jaxformer.config import TransformerConfig
from jaxformer.parallel import is_main_process
from jaxformer.train import report
from jaxformer.train.config import RunConfig
from jaxformer.train.evaluate import Evaluation
from jaxformer.train.optim import eval_params
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup, set_up
from jaxformer.train.signals import (
    Terminated,
    repeats_dropped,
    signals_held,
    stop_signals_raise,
)
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


def check_hooks(hooks) -> None:
    """A list or tuple of Hooks."""
    check_instance("hooks", hooks, (list, tuple))
    for i, hook in enumerate(hooks):
        check_instance(f"hooks[{i}]", hook, Hook)


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
    with stop_signals_raise():
        return _train(model_config, run, resume, progress, hooks)


def _train(model_config, run, resume, progress, hooks) -> dict[str, Any]:
    started = time.perf_counter()
    check_hooks(hooks)
    folders, meter = [], None
    stepped = lambda: meter is not None and meter.step > meter.first  # noqa: E731
    with undone_on_bad_start(folders, stepped, stepping=lambda: meter is not None):
        setup = set_up(model_config, run)  # everything that can fail before the folder exists
        folder = RunFolder(
            run.runtime.out,
            placement=setup.placement,
            meta=setup.meta,
            keep_checkpoints=run.runtime.keep_checkpoints,
            verbose=progress,
        )
        folders.append(folder)
        state, first = _start(setup, folder, resume=resume)
        evaluation = Evaluation(setup, earlier=folder.resumed_seconds["eval_seconds"])
        shown = report.Progress(progress and folder.is_main, first, run.optim.steps)
        meter = _Meter(first, started, folder.resumed_seconds["wall_seconds"])
        _run_steps(setup, folder, meter, shown, state, _hooks(run, evaluation, hooks))
    final = evaluation.result
    summary = meter.summary() | final.fields | report.description(setup) | final.tests
    summary |= evaluation.clocks(summary["wall_seconds"])
    report.finish(setup, folder, summary, final.params, final.dev)
    return summary


@contextlib.contextmanager
def undone_on_bad_start(
    folders: list[RunFolder], stepped: Callable[[], bool], stepping: Callable[[], bool]
):
    """On bad input (an InputError) before the run's first step (while not `stepped()`),
    or a stop (Ctrl-C, SIGTERM, SIGHUP) before its steps begin (while not `stepping()`;
    the steps save and say so themselves), undo the opening of `folders` (what they made
    goes, what was there stays): a run that never started leaves no folder. A stop says
    so in one line."""
    try:
        yield
    except InputError:
        if not stepped():
            _undo(folders)
        raise
    except KeyboardInterrupt as stop:
        if not stepping():
            with repeats_dropped():
                _undo(folders)
                if is_main_process():
                    why = f"{_stop(stop, None)} before the first step: nothing to save"
                    print(f"{why}; continue with {report.continue_command()}", file=sys.stderr)
        raise


def _undo(folders: list[RunFolder]) -> None:
    for folder in reversed(folders):
        folder.undo()


def _start(setup: Setup, folder: RunFolder, *, resume: bool) -> tuple[TrainState, int]:
    """The laid-out state to start from (fresh or restored) and its step; writes the
    tokenizer and config.json, and opens TensorBoard (with run.runtime.tensorboard)."""
    placement, config = setup.placement, setup.config
    state = placement.put(setup.state, like=setup.layout)
    if folder.start(resume=resume):
        state = placement.put(folder.restore(state), like=setup.layout)
    if folder.is_main:
        setup.tokenizer.save(folder.path)
    folder.write_json("config.json", {"model": config.to_dict(), "run": setup.run.to_dict()})
    step = int(placement.one_copy(state.step))
    report.starting(setup, folder, step)
    if setup.run.runtime.tensorboard:
        folder.open_tensorboard(step)
    return state, step


def _hooks(run: RunConfig, evaluation: Evaluation, hooks: Sequence[Hook]) -> HookRunner:
    """The built-in hooks and the caller's, in the order the module docstring gives."""
    in_order = [
        Hook(run.eval.eval_every, evaluation.in_run, "in-run evaluation"),
        Hook(run.runtime.checkpoint_every, _checkpoint, "checkpoint", at_end=True),
        *hooks,
        Hook(run.optim.steps, evaluation.final, "final evaluation", at_end=True),
    ]
    return HookRunner(in_order, run.optim.steps)


def _checkpoint(context: StepContext) -> None:
    context.folder.save(context.state)


def _run_steps(
    setup: Setup,
    folder: RunFolder,
    meter: _Meter,
    shown: report.Progress,
    state: TrainState,
    hooks: HookRunner,
) -> None:
    """Run the steps after `meter.step` up to run.optim.steps, each followed by the hooks
    due then (a run resumed complete runs only the at_end ones); a stop or a hook's error
    saves the last step done (unless its loss is NaN) before it is raised again."""
    run, profiler = setup.run, _Profiler(setup.run.runtime.profile_steps, folder)
    try:
        for step in range(meter.step, run.optim.steps):
            profiler.before(step)
            step_fn = setup.step_for(step + 1)
            with signals_held():  # a stop after the step finds its metrics held
                state, metrics = step_fn(state, setup.data.train_batch(step, run.optim.batch_size))
                meter.hold(step + 1, metrics)
            profiler.after(step + 1, state)
            _read_metrics(meter, folder, shown, run, keep=1)  # step done - 1's, as done runs
            if due := hooks.due(step + 1):  # a NaN stops the run before a hook sees its state
                record = _read_metrics(meter, folder, shown, run)
                hooks.run(due, StepContext(step + 1, state, record, folder, setup, shown.write))
                meter.restart_window()  # tokens/s leaves out the hooks' time
            shown.advance()
        if meter.first >= run.optim.steps:  # resumed complete: the at_end hooks, no record
            context = StepContext(meter.step, state, {}, folder, setup, shown.write)
            hooks.run(hooks.due(run.optim.steps), context)
    except KeyboardInterrupt as e:  # Ctrl-C, and Terminated
        with repeats_dropped():
            _save_before_stopping(folder, meter, shown, state, run, _stop(e, hooks.running))
        raise
    except Exception:
        if hooks.running is None:
            raise
        why = f"hook {hooks.running.name!r} raised"
        _save_before_stopping(folder, meter, shown, state, run, why)
        raise
    finally:
        shown.close()
        profiler.close()


def _save_before_stopping(
    folder: RunFolder,
    meter: _Meter,
    shown: report.Progress,
    state: TrainState,
    run: RunConfig,
    why: str,
) -> None:
    """Save the last step done unless saved, or unless its loss is NaN (TrainingDiverged),
    and say so in one line on stderr (with or without progress)."""
    _read_metrics(meter, folder, shown, run)  # no checkpoint of a diverged state
    shown.close()
    step = folder.save(state)
    if folder.is_main:
        where, resume = folder.checkpoints.directory, report.continue_command()
        print(f"{why}: saved step {step} in {where}; continue with {resume}", file=sys.stderr)


def _stop(error: KeyboardInterrupt, hook: Hook | None) -> str:
    """What stopped the run: "interrupted" (Ctrl-C) or "terminated by SIGTERM", and
    "during the NAME" of the hook running, if one was."""
    stop = f"terminated by {error}" if isinstance(error, Terminated) else "interrupted"
    return stop if hook is None else f"{stop} during the {hook.name}"


class _Meter:
    """Counts steps and target tokens, times them, and stops the run on a NaN loss. Wall
    time adds `earlier`, the seconds earlier processes of a resumed run took to reach its
    checkpoint; tokens/s is this process's.

    Metrics are read one step late, so the host never waits for the step it has just
    dispatched: `hold` keeps them on the device; `read` (after the next step's dispatch, or
    before its step's hooks) brings the oldest to the host and lets go of them only once
    read without a NaN, even if an interrupt cuts the read short."""

    def __init__(self, first: int, started: float, earlier: float = 0.0):
        self.first = self.step = first
        self.earlier = earlier
        self.tokens = self.window_tokens = 0
        self.start = self.window_start = time.perf_counter()
        self.started, self.to_first_step = started, None
        self.held: list[tuple[int, dict]] = []  # (step, metrics on the device), oldest first

    def hold(self, step: int, metrics) -> None:
        """Keep step `step`'s metrics (device arrays) until `read`."""
        self.held.append((step, metrics))

    def read(self, folder: RunFolder) -> tuple[int, dict[str, float], Any]:
        """(step, log record with tokens/s since the window began, internals or None) of the
        oldest held metrics, which it then lets go. Raises TrainingDiverged on a NaN loss."""
        step, metrics = self.held[0]
        metrics = dict(metrics)
        internals = metrics.pop("internals", None)
        loss = float(metrics["loss"])
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss became {loss} at step {step}; the last good checkpoint "
                f"(step {folder.checkpoints.latest_step()}) is intact in {folder.checkpoints.directory}"
            )
        del self.held[0]
        self.step = step
        n = int(metrics["tokens"])
        self.tokens, self.window_tokens = self.tokens + n, self.window_tokens + n
        now = time.perf_counter()
        if self.to_first_step is None:  # set-up, compilation and the first step
            self.to_first_step = now - self.started
        record = {"step": step, **{k: float(v) for k, v in metrics.items() if k != "tokens"}}
        record["tokens_per_second"] = self.window_tokens / max(now - self.window_start, 1e-9)
        record["wall_seconds"] = round(self.earlier + now - self.start, 2)
        return step, record, internals

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

    def after(self, done: int, state) -> None:
        if self.on and done == self.steps[1]:
            jax.block_until_ready(state)
            self.close()
            self.folder.say(
                f"profile of steps {self.steps[0] + 1}-{done}: {self.folder.path / 'profile'}"
            )

    def close(self) -> None:
        if self.on:
            jax.profiler.stop_trace()
            self.on = False


def _read_metrics(
    meter: _Meter, folder: RunFolder, shown: report.Progress, run: RunConfig, keep: int = 0
) -> dict[str, float] | None:
    """Read the meter's held metrics but the newest `keep` (stopping the run on a NaN loss)
    and log them: the internals always, a step's record when its log is due (every
    log_every steps and the last). Returns the last record read (None if none was)."""
    record = None
    while len(meter.held) > keep:
        with signals_held():  # a record read is a record logged: a stop waits for the write
            done, record, internals = meter.read(folder)
            if internals is not None:
                folder.log(report.internals_record(done, internals))
            if done % run.runtime.log_every == 0 or done == run.optim.steps:
                folder.log(record)
                shown.show(record)
                meter.restart_window()
    return record
