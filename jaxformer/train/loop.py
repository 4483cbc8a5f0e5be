"""The training loop: set up (`setup.set_up`), start or resume in the run folder, then for
each step batch -> compiled step -> the hooks due after it (`hooks`: the in-run
evaluation, the checkpoint, a user's), then the final evaluation and the report.

Stopping: Ctrl-C (SIGINT), SIGTERM and SIGHUP wait until the step in flight has given
back its donated state (`signals`); then the last step done is saved, one line on stderr
says so, and `train` raises KeyboardInterrupt (Ctrl-C) or `Terminated` (the `jaxformer`
command exits with 130, or 128 + the signal's number: 143 for SIGTERM, 129 for SIGHUP).

The pieces it composes live beside it: the set-up (`setup`), the hooks (`hooks`), the
run folder (`run_folder`), evaluation (`evaluate`), the report (`report`), the stop
signals (`signals`), the steps (`steps`) and the placement that lays out and compiles them (`jaxformer.parallel`).
`RunConfig.runtime.mesh` ("data=2,fsdp=2,tensor=2") or `RunConfig.runtime.pmap` spread the run over
devices. On several processes (after `parallel.initialize`) every process runs this same
loop: each builds the global batch (a pure function of seed and index) and the placement
transfers only its own rows.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxformer.checks import option
from jaxformer.config import RunConfig, TransformerConfig
from jaxformer.models import Transformer
from jaxformer.parallel import host_copy
from jaxformer.train import report
from jaxformer.train.evaluate import eval_beam, evaluate, score, translate
from jaxformer.train.hooks import Hook, StepContext, check_hooks
from jaxformer.train.run_folder import RunFolder
from jaxformer.train.setup import Setup, set_up
from jaxformer.train.signals import Terminated, signals_held, stop_signals_raise
from jaxformer.train.steps import TrainState

Pairs = list[tuple[str, str]]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def train(
    model_config: TransformerConfig,
    run: RunConfig,
    *,
    resume: bool = False,
    progress: bool = True,
    hooks: Sequence[Hook] = (),
) -> dict[str, Any]:
    """Train, evaluate and report; returns the summary (also written to summary.json).

    The model's vocabulary is the tokenizer's (the run says so when `model_config` asked
    for another size). With `resume`, continue from the latest checkpoint in `run.runtime.out`
    if there is one. `hooks` run after the built-in ones (see `jaxformer.train.hooks`).
    With `progress` it prints as it goes (a progress bar on a terminal, else a line every
    tenth of the run; each evaluation; the final report); without it, nothing: the run
    folder holds every result, and only a warning (`checks.InputWarning`) or a stop (below)
    is reported, on stderr.
    Raises TrainingDiverged on a NaN or infinite loss (the last good checkpoint stays
    intact); re-raises KeyboardInterrupt (Ctrl-C), Terminated (SIGTERM, SIGHUP) and the
    error of a hook that raises, after saving the last completed step.
    """
    with stop_signals_raise():
        return _train(model_config, run, resume, progress, hooks)


def _train(model_config, run, resume, progress, hooks) -> dict[str, Any]:
    started = time.perf_counter()
    check_hooks(hooks)
    setup = set_up(model_config, run)  # everything that can fail before the folder exists
    folder = RunFolder(
        run.runtime.out,
        placement=setup.placement,
        meta=setup.meta,
        keep_checkpoints=run.runtime.keep_checkpoints,
        verbose=progress,
    )
    state, first = _start(setup, folder, resume=resume)
    evaluator = _Evaluator(setup, earlier=folder.resumed_seconds["eval_seconds"])
    meter = _Meter(first, started, folder.resumed_seconds["wall_seconds"])
    shown = report.Progress(progress and folder.is_main, first, run.optim.steps)
    hooks = [*_default_hooks(run, evaluator), *hooks]
    state = _run_steps(setup, folder, meter, shown, state, hooks)
    try:
        return _end(setup, folder, evaluator, meter, state)
    except KeyboardInterrupt as e:  # the last step is saved (the checkpoint hook's at_end)
        _say_stopped(folder, f"{_stop(e)} during the final evaluation", meter.step)
        raise


def _end(
    setup: Setup, folder: RunFolder, evaluator: _Evaluator, meter: _Meter, state: TrainState
) -> dict[str, Any]:
    """The final evaluation, the summary and the report; returns the summary."""
    final = _final_model(setup, folder, evaluator, meter.step, state)
    summary = meter.summary(final.scores, setup.data.metrics) | final.evaluations
    summary |= _description(setup) | final.tests
    summary["eval_seconds"] = round(evaluator.seconds, 2)
    if final.tests:
        summary["test_seconds"] = round(evaluator.test_seconds, 2)
    spent = evaluator.seconds + evaluator.test_seconds
    summary["train_seconds"] = round(summary["wall_seconds"] - spent, 2)
    _finish(setup, folder, summary, final)
    return summary


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
    asked = setup.requested_vocab
    note = "" if asked == config.vocab_size else f"; the model config said {asked}"
    if setup.data.description:  # what a dataset kept and dropped
        folder.say(setup.data.description)
    vocab = f"vocabulary of {config.vocab_size} ids (the tokenizer's{note})"
    folder.say(f"training on {placement.description}, {vocab}")
    step = int(placement.one_copy(state.step))
    if step >= setup.run.optim.steps:
        folder.say(
            f"the run was already complete ({step} of {setup.run.optim.steps} steps done): "
            "nothing left to train; evaluating its final model again"
        )
    if setup.run.runtime.tensorboard:
        folder.open_tensorboard(step)
    return state, step


def _run_steps(
    setup: Setup,
    folder: RunFolder,
    meter: _Meter,
    shown: report.Progress,
    state: TrainState,
    hooks: list[Hook],
) -> TrainState:
    """Run the steps after `meter.step` up to run.optim.steps, each followed by the hooks due
    then; the state after the last. On Ctrl-C, or when a hook raises, the last step done
    is saved (unless its loss is NaN) before the error is raised again."""
    run, profiler, running = setup.run, _Profiler(setup.run.runtime.profile_steps, folder), None
    try:
        for step in range(meter.step, run.optim.steps):
            profiler.before(step)
            step_fn = setup.step_for(step + 1)
            with signals_held():
                state, metrics = step_fn(state, setup.data.train_batch(step, run.optim.batch_size))
            done = step + 1
            profiler.after(done, state)
            meter.hold(done, metrics)
            _read_metrics(meter, folder, shown, run, keep=1)  # step done - 1's, as done runs
            due = [hook for hook in hooks if hook.due(done, run.optim.steps)]
            if due:  # a NaN stops the run before a hook sees its state
                record = _read_metrics(meter, folder, shown, run)
                context = StepContext(done, state, record, folder, setup, shown.write)
                for running in due:
                    running.action(context)
                running = None
                meter.restart_window()  # tokens/s leaves out the hooks' time
            shown.advance()
        _read_metrics(meter, folder, shown, run)
    except KeyboardInterrupt as e:  # Ctrl-C, and Terminated
        _save_before_stopping(setup, folder, meter, shown, state, _stop(e))
        raise
    except Exception:
        if running is None:
            raise
        _save_before_stopping(setup, folder, meter, shown, state, f"hook {running.name!r} raised")
        raise
    finally:
        shown.close()
        profiler.close()
    return state


def _default_hooks(run: RunConfig, evaluator: _Evaluator) -> list[Hook]:
    """The built-in periodic work, in order: the in-run evaluation, the checkpoint."""
    return [
        Hook(run.eval.eval_every, evaluator.in_run, "evaluate"),
        Hook(run.runtime.checkpoint_every, _checkpoint, "checkpoint", at_end=True),
    ]


def _checkpoint(context: StepContext) -> None:
    context.folder.save(context.state)


def _save_before_stopping(
    setup: Setup,
    folder: RunFolder,
    meter: _Meter,
    shown: report.Progress,
    state: TrainState,
    why: str,
) -> None:
    """Save the last step done unless saved, or unless its loss is NaN (TrainingDiverged),
    and say so in one line on stderr (with or without progress)."""
    _read_metrics(meter, folder, shown, setup.run)  # no checkpoint of a diverged state
    shown.close()
    _say_stopped(folder, why, folder.save(state))


def _stop(error: KeyboardInterrupt) -> str:
    """What stopped the run: "interrupted" (Ctrl-C) or "terminated by SIGTERM"."""
    return f"terminated by {error}" if isinstance(error, Terminated) else "interrupted"


def _say_stopped(folder: RunFolder, why: str, step: int) -> None:
    """The one line on stderr (with or without progress) that a stopped run is saved."""
    if folder.is_main:
        where, resume = folder.checkpoints.directory, option("resume", True)
        print(f"{why}: saved step {step} in {where}; continue with {resume}", file=sys.stderr)


class _Evaluator:
    """Held-out evaluation of laid-out parameters, and the seconds spent so far on the
    held-out (dev) pairs (`seconds`, from `earlier` on: a resumed run's kept evaluations)
    and on the final test pairs (`test_seconds`)."""

    def __init__(self, setup: Setup, *, earlier: float = 0.0):
        self.setup, self.seconds, self.test_seconds = setup, earlier, 0.0

    def in_run(self, context: StepContext) -> None:
        """The in-run evaluation (a hook): the held-out loss and greedy decoding of the
        first `eval_sample` held-out pairs, logged (with the evaluations' seconds so far,
        for a resume) and shown."""
        sampled, _ = self.held_out(context.state.params, sample=True)
        seconds = round(self.seconds, 2)
        context.folder.log({"step": context.step, **sampled, "eval_seconds": seconds})
        context.say(report.eval_line(context.step, sampled))

    def held_out(self, params, *, sample: bool = False) -> tuple[dict[str, float], list[str]]:
        """The held-out metrics of laid-out `params` and the held-out predictions: of the
        first `eval_sample` test pairs decoded greedily (`sample`, during training), else
        of all of them with the run's beam (the final model)."""
        started, run, data = time.perf_counter(), self.setup.run, self.setup.data
        pairs = data.dev_pairs[: run.eval.eval_sample] if sample else data.dev_pairs
        beam = 1 if sample else eval_beam(run, data)
        predictor = self._predictor(params, beam=beam)
        metrics, predictions = evaluate(
            self.setup.eval_step, params, data, predictor, run.optim.batch_size, pairs
        )
        self.seconds += time.perf_counter() - started
        return metrics | {"eval_pairs": len(pairs), "eval_beam": beam}, predictions

    def test(self, params) -> tuple[dict[str, float], list[str]]:
        """The data's metrics of laid-out `params` on its final test pairs ("test_bleu",
        ..., and their number, "test_pairs"), and the predictions."""
        started, data = time.perf_counter(), self.setup.data
        pairs = data.test_pairs
        predictor = self._predictor(params, beam=eval_beam(self.setup.run, data))
        scores, predictions = score(predictor, pairs, data.metrics)
        self.test_seconds += time.perf_counter() - started
        return {f"test_{k}": v for k, v in scores.items()} | {"test_pairs": len(pairs)}, predictions

    def _predictor(self, params, beam: int) -> Callable[[list[str]], list[str]]:
        """Translations of sources by laid-out `params` (greedy for beam 1)."""
        setup, run = self.setup, self.setup.run

        def predictions(sources):
            model = nnx.merge(setup.graphdef, setup.placement.one_copy(params))
            return translate(model, setup.tokenizer, sources, run, setup.data, beam=beam)

        return predictions


class _Final(NamedTuple):
    """The final model (the last step's, or with average_checkpoints > 1 the average of
    the last checkpoints): its parameters (one host copy), its held-out metrics
    (`scores`), the summary's fields of the final evaluations (`evaluations`: eval_beam,
    final_eval, averaged_eval, averaged_steps) and of the test (`tests`: with final_test,
    final_test and the test_* scores), and the (pairs, predictions) of the held-out and
    (with final_test) the test pairs."""

    params: Any
    scores: dict[str, float]
    evaluations: dict[str, Any]
    tests: dict[str, Any]
    held_out: tuple[Pairs, list[str]]
    tested: tuple[Pairs, list[str]] | None


def _final_model(
    setup: Setup, folder: RunFolder, evaluator: _Evaluator, step: int, state: TrainState
) -> _Final:
    """Evaluate the last step's parameters on every held-out pair, then the average of the
    last checkpoints (average_checkpoints > 1), then, with final_test, score the final
    model on the test pairs; each is logged."""
    run, data = setup.run, setup.data
    last_eval, predictions = evaluator.held_out(state.params)  # every held-out pair, eval_beam
    folder.log({"step": step, **last_eval})
    folder.say(report.eval_line(step, last_eval))
    params, averaged, steps = state.params, None, None
    if run.eval.average_checkpoints > 1:
        params, steps = _average(setup, folder, state)
        averaged, predictions = evaluator.held_out(params)
        folder.log({"step": step, "averaged_steps": steps, **averaged})
        folder.say(report.eval_line(step, averaged, averaged_steps=steps))
    evaluations = {
        "eval_beam": eval_beam(run, data),
        "final_eval": last_eval,
        "averaged_eval": averaged,
        "averaged_steps": steps,
    }
    tests, tested = {}, None
    if run.eval.final_test and data.test_pairs:
        scores, test_predictions = evaluator.test(params)
        folder.log({"step": step, **scores})
        tests = {"final_test": True, **scores}
        tested = (data.test_pairs, test_predictions)
    params = host_copy(setup.placement.one_copy(params))
    held_out = (data.dev_pairs, predictions)
    return _Final(params, averaged or last_eval, evaluations, tests, held_out, tested)


def _average(setup: Setup, folder: RunFolder, state: TrainState) -> tuple[Any, list[int]]:
    """The laid-out mean parameters of the last `average_checkpoints` checkpoints (also
    saved in <out>/averaged), and their steps."""
    mean, steps = folder.average_checkpoints(state, setup.run.eval.average_checkpoints)
    return setup.placement.put(mean, like=setup.layout.params), steps


def _description(setup: Setup) -> dict[str, Any]:
    """The summary's fields that describe the run: model, layout, configs, data counts."""
    counts = {"data_counts": dict(setup.data.counts)} if setup.data.counts else {}
    return {
        "params": setup.param_count,
        "device": str(jax.devices()[0].device_kind),
        "layout": setup.placement.description,
        "model_kind": setup.data.model_kind,
        "model_config": setup.config.to_dict(),
        "run": setup.run.to_dict(),
        **counts,
    }


def _finish(setup: Setup, folder: RunFolder, summary: dict[str, Any], final: _Final) -> None:
    """The plots, predictions.tsv (the held-out (dev) pairs and the final model's
    predictions), test_predictions.tsv (with final_test), then summary.json, and the
    console report (process 0 only)."""
    folder.close()
    if not folder.is_main:
        return
    report.loss_curves(folder.metrics_path, folder.path / "loss.png")
    if setup.run.runtime.log_internals is not None:
        report.internals(folder.metrics_path, folder.path / "internals.png")
    for name, written in (
        ("predictions.tsv", final.held_out),
        ("test_predictions.tsv", final.tested),
    ):
        if written and written[1]:
            report.write_predictions(*written, folder.path / name)
    pairs, predictions = final.held_out
    examples = [(s, p, t) for p, (s, t) in zip(predictions[:8], pairs[:8], strict=False)]
    model = nnx.merge(setup.graphdef, final.params)
    if isinstance(model, Transformer) and pairs:
        report.cross_attention(model, setup.tokenizer, pairs[0], folder.path / "attention.png")
    folder.write_json("summary.json", summary)  # last: it marks a finished run
    if folder.verbose:
        report.print_summary(summary, examples, folder.path)


class _Meter:
    """Counts steps and target tokens, times them, and stops the run on a NaN loss. Wall
    time adds `earlier`, the seconds earlier processes of a resumed run took to reach its
    checkpoint; tokens/s is this process's.

    It reads a step's metrics one step late: `hold` keeps them on the device, and `read`
    (called after the next step is dispatched, or before the hooks of its step)
    brings the oldest to the host, so the host never waits for the step it has just
    dispatched. Metrics stay held until read without a NaN, even if an interrupt cuts
    the read short.
    """

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

    def summary(self, last_eval: dict[str, float], metrics: tuple[str, ...]) -> dict[str, Any]:
        wall = time.perf_counter() - self.start
        return {
            "steps": self.step,
            "steps_run": self.step - self.first,
            "wall_seconds": round(self.earlier + wall, 2),
            "seconds_to_first_step": None
            if self.to_first_step is None
            else round(self.to_first_step, 2),
            "train_tokens_per_second": round(self.tokens / max(wall, 1e-9), 1),
            "eval_loss": last_eval.get("eval_loss"),  # label-smoothed, as trained
            "eval_nll": last_eval.get("eval_nll"),
            "eval_perplexity": last_eval.get("eval_perplexity"),
            "token_accuracy": last_eval.get("eval_token_accuracy"),
            **{name: last_eval.get(name) for name in metrics},
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
        done, record, internals = meter.read(folder)
        if internals is not None:
            folder.log(report.internals_record(done, internals))
        if done % run.runtime.log_every == 0 or done == run.optim.steps:
            folder.log(record)
            shown.show(record)
            meter.restart_window()
    return record
