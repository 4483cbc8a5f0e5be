"""The training loop: batch -> compiled step -> periodic actions (log, evaluate,
checkpoint), with Ctrl-C held until a step's donated state is back.

The pieces it composes live beside it: the run folder (`run_folder`), evaluation
(`evaluate`), the report (`report`), the steps (`steps`) and the placement that lays
out and compiles them (`jaxformer.parallel`). The options `mesh` ("data=2,fsdp=2,tensor=2")
or `pmap` (`RunConfig.runtime`) spread the run over devices. On several processes (after
`parallel.initialize`) every process runs this same loop: each builds the global batch
(a pure function of seed and index) and the placement transfers only its own rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxformer import decode
from jaxformer.checks import BadValue
from jaxformer.config import RunConfig, TransformerConfig
from jaxformer.data import BPETokenizer, ByteTokenizer, TaskData, TextData, TsvData, bible
from jaxformer.data.datasets import read_text_lines
from jaxformer.interop import hf
from jaxformer.models import MODEL_KINDS, count_params
from jaxformer.parallel import Placement, host_copy, make_placement
from jaxformer.train import report
from jaxformer.train.checkpoint import abstract_train_state, save_averaged
from jaxformer.train.evaluate import check_metrics, eval_beam, evaluate, score
from jaxformer.train.optim import make_optimizer, make_schedule
from jaxformer.train.run_folder import RunFolder, tensorboard_writer
from jaxformer.train.steps import (
    TrainState,
    create_train_state,
    make_eval_step,
    make_train_step,
)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def train(
    model_config: TransformerConfig, run: RunConfig, *, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Train, evaluate and report; returns the summary (also written to summary.json).

    The model's vocabulary is the tokenizer's (the run says so when `model_config` asked
    for another size). With `resume`, continue from the latest checkpoint in `run.runtime.out`
    if there is one.
    Raises TrainingDiverged on a NaN or infinite loss (the last good checkpoint stays
    intact) and re-raises KeyboardInterrupt after saving the last completed step.
    """
    started = time.perf_counter()
    job = _Job.prepare(model_config, run)  # everything that can fail before the folder exists
    folder = RunFolder(run.runtime.out, keep_checkpoints=run.runtime.keep_checkpoints)
    state, first = job.start(folder, resume=resume)
    if run.runtime.tensorboard:
        folder.open_tensorboard(first)
    shown = report.Progress(progress and folder.is_main, first, run.optim.steps)
    meter = _Meter(first, started, folder.resumed_wall_seconds)
    profiler = _Profiler(run.runtime.profile_steps, folder)
    try:
        for step in range(first, run.optim.steps):
            profiler.before(step)
            step_fn = job.step_for(step + 1)
            with _interrupts_held():
                state, metrics = step_fn(state, job.data.train_batch(step, run.optim.batch_size))
            done = step + 1
            profiler.after(done, state)
            meter.hold(done, metrics)
            _read_metrics(meter, folder, shown, run, keep=1)  # step done - 1's, as done runs
            evaluating = _due(done, run.eval.eval_every, run.optim.steps) and done < run.optim.steps
            saving = _due(done, run.runtime.checkpoint_every, run.optim.steps)
            if evaluating or saving:  # a NaN stops the run before it is saved or evaluated
                _read_metrics(meter, folder, shown, run)
            if evaluating:
                sampled, _ = job.evaluate(state.params, sample=True)  # greedy, eval_sample
                folder.log({"step": done, **sampled})
                if folder.is_main:
                    shown.write(report.eval_line(done, sampled))
                meter.restart_window()
            if saving:
                folder.save(job.placement.one_copy(state), job.meta)
            shown.advance()
        _read_metrics(meter, folder, shown, run)
    except KeyboardInterrupt:
        _read_metrics(meter, folder, shown, run)  # no checkpoint of a diverged state
        shown.close()
        done = int(job.placement.one_copy(state.step))
        if done > (folder.checkpoints.latest_step() or 0):
            folder.save(job.placement.one_copy(state), job.meta)
        where = folder.checkpoints.directory
        folder.say(f"\ninterrupted: saved step {done} in {where}; continue with --resume")
        raise
    finally:
        shown.close()
        profiler.close()
    last_eval, predictions = job.evaluate(state.params)  # every held-out pair, eval_beam
    folder.log({"step": meter.step, **last_eval})
    folder.say(report.eval_line(meter.step, last_eval))
    params, averaged, steps = state.params, None, None
    if run.eval.average_checkpoints > 1:
        params, steps = job.average(folder, state)
        averaged, predictions = job.evaluate(params)
        folder.log({"step": meter.step, "averaged_steps": steps, **averaged})
        folder.say(report.eval_line(meter.step, averaged, averaged_steps=steps))
    summary = meter.summary(averaged or last_eval, job.data.metrics) | {
        "eval_beam": eval_beam(run, job.data),
        "final_eval": last_eval,
        "averaged_eval": averaged,
        "averaged_steps": steps,
    }
    summary |= job.description()
    tested = None
    if run.eval.final_test and job.data.final_test_pairs:
        scores, test_predictions = job.test(params)
        folder.log({"step": meter.step, **scores})
        summary |= {"final_test": True, **scores}
        tested = (job.data.final_test_pairs, test_predictions)
    summary["eval_seconds"] = round(job.eval_seconds, 2)
    summary["train_seconds"] = round(summary["wall_seconds"] - job.eval_seconds, 2)
    params = host_copy(job.placement.one_copy(params))
    job.finish(folder, summary, params, (job.data.test_pairs, predictions), tested)
    return summary


@dataclasses.dataclass
class _Job:
    """A run before its first step: data, model, placement and the compiled steps."""

    run: RunConfig
    tokenizer: Any
    data: Any
    config: TransformerConfig
    graphdef: nnx.GraphDef
    state: TrainState  # fresh, not yet laid out
    params: int
    placement: Placement
    train_step: Callable
    eval_step: Callable
    requested_vocab: int
    internals_step: Callable | None = None  # train_step that also returns metrics["internals"]
    eval_seconds: float = 0.0  # spent in evaluate and test so far

    @classmethod
    def prepare(cls, model_config: TransformerConfig, run: RunConfig) -> _Job:
        if run.data.init_from is None:
            tokenizer, data = build_data(run)
            config = _fit_config(model_config, tokenizer, data)
            model = MODEL_KINDS[data.model_kind](config, rngs=nnx.Rngs(run.runtime.seed))
        else:
            model, tokenizer, data = _pretrained(run)
            config = model_config = model.config
        check_metrics(data.metrics)
        if run.eval.final_test and not data.final_test_pairs:
            raise BadValue(
                "final_test scores the final model on a separate test set (a Bible dataset's "
                f"test books); {type(data).__name__} has none: its held-out pairs are the "
                "ones evaluated"
            )
        if run.runtime.tensorboard:
            tensorboard_writer()  # installed, before the folder exists
        graphdef, state, train_fn, eval_fn, internals_fn = _steps(model, config, run)
        placement = make_placement(run.runtime.mesh, pmap=run.runtime.pmap)
        placement.check_rows(
            run.optim.batch_size // run.optim.accum_steps,
            f"batch_size / accum_steps = {run.optim.batch_size} / {run.optim.accum_steps} =",
        )
        train_step = placement.compile(train_fn, state, donate_state=True)
        eval_step = placement.compile(eval_fn, state.params)
        internals_step = internals_fn and placement.compile(internals_fn, state, donate_state=True)
        return cls(
            run, tokenizer, data, config, graphdef, state, count_params(model), placement,
            train_step, eval_step, requested_vocab=model_config.vocab_size,
            internals_step=internals_step,
        )  # fmt: skip

    def step_for(self, done: int) -> Callable:
        """The step that makes step `done`: with log_internals N the internals variant on
        step 1 and every Nth (compiled on first use), else the plain one."""
        n = self.run.runtime.log_internals
        if n is not None and (done == 1 or done % n == 0):
            return self.internals_step
        return self.train_step

    @property
    def meta(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run."""
        return {
            "model_kind": self.data.model_kind,
            "model_config": self.config.to_dict(),
            "run": self.run.resume_settings(),
        }

    def start(self, folder: RunFolder, *, resume: bool) -> tuple[TrainState, int]:
        """The laid-out state to start from (fresh or restored) and its step; writes the
        tokenizer and config.json."""
        state = self.placement.put(self.state)
        if folder.start(resume=resume):
            abstract = abstract_train_state(self.placement.one_copy(state))
            state = self.placement.put(folder.restore(abstract, self.meta))
        if folder.is_main:
            self.tokenizer.save(folder.path)
        folder.write_json(
            "config.json", {"model": self.config.to_dict(), "run": self.run.to_dict()}
        )
        asked = self.requested_vocab
        note = "" if asked == self.config.vocab_size else f"; the model config said {asked}"
        vocab = f"vocabulary of {self.config.vocab_size} ids (the tokenizer's{note})"
        if hasattr(self.data, "description"):  # what a dataset kept and dropped
            folder.say(self.data.description)
        folder.say(f"training on {self.placement.description}, {vocab}")
        return state, int(self.placement.one_copy(state.step))

    def evaluate(self, params, *, sample: bool = False) -> tuple[dict[str, float], list[str]]:
        """The held-out metrics of laid-out `params` and the held-out predictions: of the
        first `eval_sample` test pairs decoded greedily (`sample`, during training), else
        of all of them with the run's beam (the final model)."""
        started = time.perf_counter()
        pairs = (
            self.data.test_pairs[: self.run.eval.eval_sample] if sample else self.data.test_pairs
        )
        beam = 1 if sample else eval_beam(self.run, self.data)
        predictor = self._predictor(params, beam=beam)
        metrics, predictions = evaluate(
            self.eval_step, params, self.data, predictor, self.run.optim.batch_size, pairs
        )
        self.eval_seconds += time.perf_counter() - started
        return metrics | {"eval_pairs": len(pairs), "eval_beam": beam}, predictions

    def test(self, params) -> tuple[dict[str, float], list[str]]:
        """The data's metrics of laid-out `params` on its final test pairs ("test_bleu",
        ..., and their number, "test_pairs"), and the predictions."""
        started = time.perf_counter()
        pairs = self.data.final_test_pairs
        predictor = self._predictor(params, beam=eval_beam(self.run, self.data))
        scores, predictions = score(predictor, pairs, self.data.metrics)
        self.eval_seconds += time.perf_counter() - started
        return {f"test_{k}": v for k, v in scores.items()} | {"test_pairs": len(pairs)}, predictions

    def _predictor(self, params, beam: int) -> Callable[[list[str]], list[str]]:
        """Translations of sources by laid-out `params` (greedy for beam 1)."""

        def predictions(sources):
            model = nnx.merge(self.graphdef, self.placement.one_copy(params))
            return decode.generate(
                model,
                self.tokenizer,
                sources,
                "beam" if beam > 1 else "greedy",
                beam_size=beam,
                alpha=self.run.eval.eval_alpha,
                max_new_tokens=self.data.tgt_len,
                batch_size=self.run.optim.batch_size,
                pad_multiple=self.run.data.pad_multiple,
            )

        return predictions

    def average(self, folder: RunFolder, state: TrainState) -> tuple[Any, list[int]]:
        """The laid-out mean parameters of the last `average_checkpoints` checkpoints (also
        saved in <out>/averaged), and their steps."""
        abstract = abstract_train_state(self.placement.one_copy(state)).params
        mean, steps = folder.checkpoints.average_params(abstract, self.run.eval.average_checkpoints)
        save_averaged(folder.path, mean)
        return self.placement.put(mean), steps

    def description(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "device": str(jax.devices()[0].device_kind),
            "layout": self.placement.description,
            "model_kind": self.data.model_kind,
            "model_config": self.config.to_dict(),
            "run": self.run.to_dict(),
            **({"data_counts": self.data.counts} if hasattr(self.data, "counts") else {}),
        }

    def finish(
        self,
        folder: RunFolder,
        summary: dict[str, Any],
        params,
        held_out: tuple[list[tuple[str, str]], list[str]],
        tested: tuple[list[tuple[str, str]], list[str]] | None,
    ) -> None:
        """summary.json, predictions.tsv (the held-out (dev) pairs and their predictions,
        `held_out`), test_predictions.tsv (`tested`, with final_test), the plots and the
        console report (process 0 only); `params` (one host copy) and the predictions are
        the final model's: the averaged one when the run averages checkpoints."""
        folder.close()
        if not folder.is_main:
            return
        folder.write_json("summary.json", summary)
        report.loss_curves(folder.metrics_path, folder.path / "loss.png")
        if self.run.runtime.log_internals is not None:
            report.internals(folder.metrics_path, folder.path / "internals.png")
        model, data = nnx.merge(self.graphdef, params), self.data
        for name, written in (("predictions.tsv", held_out), ("test_predictions.tsv", tested)):
            if written and written[1]:
                report.write_predictions(*written, folder.path / name)
        pairs, predictions = held_out
        examples = [(s, p, t) for p, (s, t) in zip(predictions[:8], pairs[:8], strict=False)]
        if hasattr(model, "cross_attention_weights") and data.test_pairs:
            plot = folder.path / "attention.png"
            report.cross_attention(model, self.tokenizer, data.test_pairs[0], plot)
        report.print_summary(summary, examples, folder.path)


def build_data(run: RunConfig, tokenizer=None):
    """The tokenizer (`tokenizer`, else the one the run asks for) and the dataset of a run.
    A BPE tokenizer learns from the data file, or from a dataset's training books only."""
    if run.data.dataset:
        corpus = bible.load(run.data.dataset)
        tokenizer = tokenizer or _tokenizer(run, corpus.training_texts)
        data = corpus.data(
            tokenizer, max_len=run.data.seq_len, seed=run.runtime.seed,
            test_size=run.eval.eval_examples, pad_multiple=run.data.pad_multiple,
        )  # fmt: skip
        return tokenizer, data

    def lines():
        return [line for _, line in read_text_lines(run.data.data_tsv or run.data.data_text)]

    tokenizer = tokenizer or _tokenizer(run, lines)
    if run.data.task:
        return tokenizer, TaskData(
            run.data.task, tokenizer, seed=run.runtime.seed, test_size=run.eval.eval_examples
        )
    if run.data.data_tsv:
        data = TsvData(
            run.data.data_tsv, tokenizer, max_len=run.data.seq_len, seed=run.runtime.seed,
            test_size=run.eval.eval_examples, pad_multiple=run.data.pad_multiple,
        )  # fmt: skip
        return tokenizer, data
    return tokenizer, TextData(
        run.data.data_text, tokenizer, seq_len=run.data.seq_len, seed=run.runtime.seed
    )


def _tokenizer(run: RunConfig, texts: Callable[[], list[str]]):
    """The run's tokenizer; BPE learns from `texts()`."""
    if run.data.tokenizer == "bpe":
        return BPETokenizer.train(texts(), run.data.bpe_vocab_size)
    return ByteTokenizer()


def _pretrained(run: RunConfig):
    """(model, tokenizer, data) of a run that fine-tunes the Hugging Face folder init_from."""
    model, tokenizer = hf.load(run.data.init_from)
    _, data = build_data(run, tokenizer)
    kind = type(model).__name__
    if kind != data.model_kind:
        needs = {
            "DecoderLM": "text (data_text, or a dataset VER-lm)",
            "Transformer": "pairs (a task, data_tsv, or a dataset SRC-TGT)",
        }
        raise BadValue(f"{run.data.init_from} holds a {kind}, which trains on {needs[kind]}")
    if model.config.max_len < data.max_len:
        raise BadValue(
            f"the data needs sequences of {data.max_len} tokens but {run.data.init_from} takes "
            f"{model.config.max_len} (max_position_embeddings)"
        )
    return model, tokenizer, data


def _fit_config(config: TransformerConfig, tokenizer, data) -> TransformerConfig:
    """`config` with the tokenizer's vocabulary, checked against the data's length."""
    if config.max_len < data.max_len:
        raise BadValue(
            f"the data needs sequences of {data.max_len} tokens but max_len={config.max_len}"
        )
    return config.replace(vocab_size=tokenizer.vocab_size)


class _Steps(NamedTuple):
    """A run's fresh train state and its pure step functions."""

    graphdef: nnx.GraphDef
    state: TrainState
    train: Callable
    eval: Callable
    train_with_internals: Callable | None  # None unless run.runtime.log_internals


def _steps(model, config: TransformerConfig, run: RunConfig) -> _Steps:
    """The run's optimizer and schedule, its fresh train state and its step functions."""
    schedule = make_schedule(
        run.optim.schedule,
        lr=run.optim.peak_lr,
        d_model=config.d_model,
        warmup_steps=run.optim.warmup,
        total_steps=run.optim.steps,
    )
    optimizer = make_optimizer(
        schedule,
        name=run.optim.optimizer,
        weight_decay=run.optim.weight_decay,
        clip_norm=run.optim.clip_norm,
    )
    graphdef, state = create_train_state(model, optimizer, run.runtime.seed)
    smoothing = config.label_smoothing
    kw = dict(label_smoothing=smoothing, accum_steps=run.optim.accum_steps)
    internals_fn = None
    if run.runtime.log_internals is not None:
        internals_fn = make_train_step(graphdef, optimizer, schedule, **kw, internals=True)
    return _Steps(
        graphdef,
        state,
        train=make_train_step(graphdef, optimizer, schedule, **kw),
        eval=make_eval_step(graphdef, label_smoothing=smoothing),
        train_with_internals=internals_fn,
    )


class _Meter:
    """Counts steps and target tokens, times them, and stops the run on a NaN loss. Wall
    time adds `earlier`, the seconds earlier processes of a resumed run took to reach its
    checkpoint; tokens/s is this process's.

    It reads a step's metrics one step late: `hold` keeps them on the device, and `read`
    (called after the next step is dispatched, or before an evaluation or checkpoint)
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
        """Start a new tokens/s window (after a log record, and after an evaluation)."""
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


def _read_metrics(meter: _Meter, folder: RunFolder, shown, run: RunConfig, keep: int = 0) -> None:
    """Read the meter's held metrics but the newest `keep` (stopping the run on a NaN loss)
    and log them: the internals always, a step's record when its log is due."""
    while len(meter.held) > keep:
        done, record, internals = meter.read(folder)
        if internals is not None:
            folder.log(report.internals_record(done, internals))
        if _due(done, run.runtime.log_every, run.optim.steps):
            folder.log(record)
            shown.show(record)
            meter.restart_window()


def _due(done: int, every: int, total: int) -> bool:
    return done % every == 0 or done == total


@contextlib.contextmanager
def _interrupts_held():
    """Hold Ctrl-C until the block ends. The compiled step donates the old state, so an
    interrupt raised inside it (e.g. while its outputs are unpacked) would leave no state
    to save."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt
