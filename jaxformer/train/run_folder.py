"""A training run's folder: what it holds, who writes it, whether a run may start there;
its orbax checkpoints (`Checkpointer`), and `restore_model` (a trained run's model back).

    config.json, tokenizer.json   the model and run configs; the tokenizer (for generate)
    metrics.jsonl    one JSON object per logged step and per evaluation
    summary.json     final metrics, timings, parameter count, the configs (written last)
    checkpoints/, averaged/   orbax checkpoints (the last `keep`); their mean parameters
    predictions.tsv, test_predictions.tsv   source<TAB>reference<TAB>prediction per pair
    loss.png, attention.png, tensorboard/   plots (`jaxformer.train.report`), scalars

Every process of a multi-process run opens the folder (orbax writes with all of them); only
process 0 writes the other files, each whole (a temporary file, renamed), as orbax does a
checkpoint: a killed process leaves the earlier ones intact, and a torn last line of
metrics.jsonl, which `read_metrics` drops with a warning. A resume refuses other damage to
what it reads (config.json, metrics.jsonl, checkpoints), naming the file."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import pathlib
import shutil
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx

from jaxformer.checks import (
    BadValue,
    InputWarning,
    MissingFile,
    MissingPackage,
    check_int,
    option,
)
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizers import Tokenizer, load_tokenizer
from jaxformer.models import MODEL_KINDS
from jaxformer.parallel import Placement, is_main_process
from jaxformer.train.optim import eval_params
from jaxformer.train.steps import TrainState

# Clocks that metrics.jsonl records carry as running totals (a resume continues them):
# the run's wall time (step records) and the dev evaluations' (in-run evaluation records).
CLOCKS = ("wall_seconds", "eval_seconds")


class RunFolder:
    """The folder `path` of one run, created on opening (an existing file is an error).
    Its checkpoints hold one copy of states that `placement` lays out, with `meta` (what a
    checkpoint must match to be resumed: `Setup.meta`). `say` prints on process 0 when
    `verbose`."""

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        placement: Placement,
        meta: dict[str, Any],
        keep_checkpoints: int = 3,
        verbose: bool = True,
    ):
        self.path = pathlib.Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise BadValue(
                f"{self.path} exists and is not a folder; choose another {option('out')}"
            )
        self.placement, self.meta = placement, meta
        self.is_main, self.verbose = is_main_process(), verbose
        self._made, self._held = _make(self.path)
        self.checkpoints = Checkpointer(self.path, keep=keep_checkpoints)
        self.metrics_path = self.path / "metrics.jsonl"
        self.tensorboard = None
        # set by restore: the seconds the kept steps took, in all and evaluating
        self.resumed_seconds = dict.fromkeys(CLOCKS, 0.0)

    def start(self, *, resume: bool) -> bool:
        """Whether to resume from the latest checkpoint. A fresh start empties the metrics;
        checkpoints without `resume` are refused (the run would overwrite them), and so is a
        resume whose config.json is damaged or whose checkpoint does not match the run's
        meta. Averaged parameters of an earlier end are removed (the run's end writes them
        again) only once the checkpoint is restored: a refused resume keeps them."""
        latest = self.checkpoints.latest_step()
        if latest is not None and not resume:
            raise BadValue(
                f"{self.path} already holds checkpoints (latest step {latest}); pass "
                f"{option('resume', True)} to continue that run, or choose another {option('out')}"
            )
        if resume and (self.path / "config.json").exists():
            read_json(self.path / "config.json")
        if latest is not None:
            check_compatible(
                self.checkpoints.read_meta(latest), self.meta, self.checkpoints.directory
            )
            return True
        self._remove_averaged()
        if resume:
            self.say(f"no checkpoint in {self.checkpoints.directory} yet: starting from step 0")
        self._write("metrics.jsonl", "")
        return False

    def restore(self, state: TrainState) -> TrainState:
        """The latest checkpoint (which must match the run's meta) as one copy of the
        laid-out `state` (its shapes, dtypes and shardings); metrics logged after it are
        dropped, as the steps will run again."""
        abstract = abstract_train_state(self.placement.one_copy(state))
        state, _ = self.checkpoints.restore(abstract, self.meta)
        self._remove_averaged()
        step = int(state.step)
        if self.is_main and self.metrics_path.exists():
            records = [r for r in read_metrics(self.metrics_path) if r["step"] <= step]
            self._write("metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
            self.resumed_seconds = {
                clock: max((r[clock] for r in records if clock in r), default=0.0)
                for clock in CLOCKS
            }
        self.say(f"resumed from step {step} in {self.checkpoints.directory}")
        return state

    def _remove_averaged(self) -> None:
        if self.is_main:
            shutil.rmtree(self.path / AVERAGED, ignore_errors=True)

    def save(self, state: TrainState) -> int:
        """Checkpoint the laid-out `state` (one copy of it, with the run's meta) unless its
        step is saved already, and a schedule-free state's average in <path>/averaged;
        returns its step."""
        one = self.placement.one_copy(state)
        step = int(one.step)
        if step > (self.checkpoints.latest_step() or 0):
            self.checkpoints.save(one, self.meta)
            if (params := eval_params(one)) is not one.params:  # schedule-free: its average
                save_averaged(self.path, params)  # what restore_model reads
        return step

    def average_checkpoints(self, state: TrainState, count: int) -> tuple[Any, list[int]]:
        """The mean parameters of the last `count` checkpoints, as one copy of the laid-out
        `state`'s (also saved in <path>/averaged), and their steps."""
        abstract = abstract_train_state(self.placement.one_copy(state)).params
        mean, steps = self.checkpoints.average_params(abstract, count)
        save_averaged(self.path, mean)
        return mean, steps

    def open_tensorboard(self, first_step: int) -> None:
        """From now on also write each logged number as a TensorBoard scalar (tensorboardX)
        in <path>/tensorboard; events past `first_step` of an earlier try are hidden, as
        metrics.jsonl drops them on resume."""
        if self.is_main:
            self.tensorboard = tensorboard_writer()(
                str(self.path / "tensorboard"), purge_step=first_step + 1
            )

    def log(self, record: dict[str, Any]) -> None:
        """Append one record to metrics.jsonl (and to TensorBoard when open)."""
        if not self.is_main:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, int | float):
                    self.tensorboard.add_scalar(name, value, record["step"])
            self.tensorboard.flush()

    def write_json(self, name: str, value: Any) -> None:
        self._write(name, json.dumps(value, indent=1))

    def say(self, message: str) -> None:
        if self.is_main and self.verbose:
            print(message, flush=True)

    def close(self) -> None:
        self.checkpoints.close()
        if self.tensorboard is not None:
            self.tensorboard.close()

    def undo(self) -> None:
        """Close, and remove what opening and starting made: the folder (and the parents it
        needed) if it was new, else the entries it did not hold; never what was there."""
        self.close()
        if not self.is_main:
            return
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
            return
        for entry in self.path.iterdir():
            if entry.name in self._held:
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def _write(self, name: str, text: str) -> None:
        if self.is_main:
            write_whole(self.path / name, text)


def _make(path: pathlib.Path) -> tuple[pathlib.Path | None, set[str]]:
    """Make the folder `path`: (the first of its folders that did not exist, or None,
    and the names `path` held before). A folder that cannot be made names the option."""
    made = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    held = set() if made is not None else {entry.name for entry in path.iterdir()}
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadValue(
            f"cannot make the run folder {path} ({e.strerror}); choose another {option('out')}"
        ) from None
    return made, held


def write_whole(path: pathlib.Path, text: str) -> None:
    """Write `text` to `path` so that a killed process leaves the old file or the new one,
    never part of it (a temporary file beside it, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: str | pathlib.Path) -> dict[str, Any]:
    """The JSON object in a run folder's file (config.json, summary.json, ...); a missing
    or damaged file is an error naming it. `path` may be a file in an archive (an object
    with pathlib.Path's read_text, such as zipfile.Path)."""
    path = pathlib.Path(path) if isinstance(path, str) else path
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingFile(f"{path}: no such file") from None
    except ValueError as e:  # JSON and UTF-8 errors
        raise BadValue(f"{path}: not valid JSON ({e}); the file is damaged") from None
    if not isinstance(value, dict):
        raise BadValue(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, each a JSON object with an integer "step". A torn
    last line (a process killed while appending it) is left out with an InputWarning; a
    bad line elsewhere is an error naming the file and the line; `path` as read_json's."""
    path = pathlib.Path(path) if isinstance(path, str) else path
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            if number == len(lines):  # no newline after it: the append was cut short
                warnings.warn(f"{path}:{number}: left out a torn last line", InputWarning, 2)
                break
            raise BadValue(f"{path}:{number}: not a JSON record ({e})") from None
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            raise BadValue(f"{path}:{number}: a record must be a JSON object with an int 'step'")
        records.append(record)
    return records


def tensorboard_writer():
    """tensorboardX's SummaryWriter, or an error saying how to install it."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise MissingPackage(
            "tensorboard=True writes event files with tensorboardX: pip install 'jaxformer[tensorboard]'"
        ) from None
    return SummaryWriter


# Checkpoints with orbax: a run folder's checkpoints/<step>/ and averaged/.
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"  # the parameters averaged over the last checkpoints, if the run did


class Checkpointer:
    """Saves and restores a TrainState plus JSON metadata in `run_dir/checkpoints`."""

    def __init__(self, run_dir: str | pathlib.Path, *, keep: int = 3):
        check_int("keep", keep)
        self.directory = pathlib.Path(run_dir).resolve() / CHECKPOINTS
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                cleanup_tmp_directories=True,
                enable_async_checkpointing=False,
            ),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, meta: dict[str, Any]) -> None:
        """Write the checkpoint of `state.step` and wait until it is complete on disk."""
        step = int(state.step)
        params, train = _on_disk(state)
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train=ocp.args.StandardSave(train),
                meta=ocp.args.JsonSave(meta),
            ),
            force=True,
        )
        self.manager.wait_until_finished()

    def restore(
        self, abstract: TrainState, expected_meta: dict[str, Any]
    ) -> tuple[TrainState, dict]:
        """The latest checkpoint, after checking it belongs to the same model and run
        settings as `expected_meta` (a mismatch is an error naming the fields)."""
        step = self.latest_step()
        if step is None:
            raise MissingFile(f"no checkpoint to resume from in {self.directory}")
        meta = self.read_meta(step)
        check_compatible(meta, expected_meta, self.directory)
        params, train = _on_disk(abstract)
        restored = self._restore(
            step,
            ocp.args.Composite(
                params=ocp.args.StandardRestore(params),
                train=ocp.args.StandardRestore(train),
            ),
        )
        t = _from_disk(restored.train)
        state = TrainState(
            step=t["step"],
            params=_from_disk(restored.params),
            opt_state=t["opt_state"],
            rng=t["rng"],
        )
        return state, meta

    def average_params(self, abstract_params, count: int) -> tuple[Any, list[int]]:
        """The mean parameters of the last `count` checkpoints (summed in float32, cast
        back to each parameter's dtype, laid out as `abstract_params`) and their steps."""
        steps = sorted(self.manager.all_steps())[-count:]
        if len(steps) < count:
            raise BadValue(
                f"average_checkpoints={count} but {self.directory} holds {len(steps)} "
                f"checkpoint(s) (steps {steps})"
            )
        total = params = None
        for step in steps:
            args = ocp.args.Composite(
                params=ocp.args.StandardRestore(_as_variables(abstract_params))
            )
            params = _from_disk(self._restore(step, args).params)
            total = _as_float32(params) if total is None else _add_float32(total, params)
        return _mean(total, params, count), steps

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        step = self.latest_step() if step is None else step
        if step is None:
            raise MissingFile(f"no checkpoint in {self.directory}")
        where = self.directory / str(step)
        try:
            with _reads_awaited():
                meta = self.manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                ).meta
        except Exception as e:  # orbax raises various errors for damaged folders
            raise BadValue(f"checkpoint {where} cannot be read: {e}") from None
        if not isinstance(meta, dict) or meta.get("model_kind") not in MODEL_KINDS:
            raise BadValue(
                f"checkpoint {where}: its meta names no model kind of {list(MODEL_KINDS)}"
            )
        return meta

    def _restore(self, step: int, args):
        """manager.restore, with a damaged checkpoint reported by `_read`."""
        where = self.directory / str(step)
        advice = "delete that folder to resume from an earlier checkpoint"
        return _read(where, advice, lambda: self.manager.restore(step, args=args))

    def close(self) -> None:
        self.manager.close()


def _read(where: pathlib.Path, advice: str, read: Callable[[], Any]) -> Any:
    """read(), with a damaged (e.g. truncated) checkpoint reported in one line naming its
    folder `where`, with `advice`, instead of orbax's or TensorStore's traceback."""
    try:
        with _reads_awaited():
            return read()
    except Exception as e:
        cause = str(e.__cause__ or e).strip().splitlines()[0][:300]
        raise BadValue(
            f"checkpoint {where} cannot be read ({cause}); it may be truncated or damaged: "
            + advice
        ) from None


@contextlib.contextmanager
def _reads_awaited():
    """Orbax runs a restore in a new event loop that it closes as soon as the restore
    returns or raises: after one array's read fails, the other reads are left unfinished,
    and each prints a traceback when TensorStore completes it or Python collects it (after
    the error line, up to exit). Meanwhile, a new event loop awaits its unfinished tasks
    (those reads) before closing. They are not cancelled: cancelling a TensorStore read
    whose result is arriving can deadlock."""
    new_event_loop = asyncio.new_event_loop

    def awaiting_loop():
        loop = new_event_loop()
        close = loop.close

        def await_then_close():
            if not loop.is_closed() and (left := asyncio.all_tasks(loop)):
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            close()

        with contextlib.suppress(AttributeError):  # a loop of C code (uvloop) stays as it is
            loop.close = await_then_close
        return loop

    asyncio.new_event_loop = awaiting_loop
    try:
        yield
    finally:
        asyncio.new_event_loop = new_event_loop


@jax.jit
def _as_float32(params):
    return jax.tree.map(lambda p: p.astype(jnp.float32), params)


@jax.jit
def _add_float32(total, params):
    return jax.tree.map(lambda t, p: t + p.astype(jnp.float32), total, params)


@functools.partial(jax.jit, static_argnums=2)
def _mean(total, like, count: int):
    """total / count in the dtypes of `like`."""
    return jax.tree.map(lambda t, p: (t / count).astype(p.dtype), total, like)


def check_compatible(saved: dict, expected: dict, where) -> None:
    """Raise if a checkpoint's model or run settings differ from this run's."""
    problems = []
    if saved.get("model_kind") != expected.get("model_kind"):
        problems.append(
            f"model {saved.get('model_kind')} (checkpoint) vs {expected.get('model_kind')} (now)"
        )
    for section in ("model_config", "run"):
        old, new = saved.get(section, {}), expected.get(section, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                problems.append(f"{key}={old.get(key)!r} (checkpoint) vs {new.get(key)!r} (now)")
    if problems:
        raise BadValue(
            f"the checkpoint in {where} was written for a different configuration: "
            + "; ".join(problems)
        )


def _as_variables(params):
    """Parameters (plain arrays) as checkpoints hold them: each under the key "value", as
    nnx Variables are written (so folders written before the state was plain resume)."""
    return jax.tree.map(lambda x: {"value": x}, params)


def _on_disk(state: TrainState) -> tuple[Any, dict]:
    """(params, the rest) of a TrainState as a checkpoint holds them: the parameters and
    every optimizer-state entry shaped like them (Adam's moments) `_as_variables`."""
    structure = jax.tree.structure(state.params)

    def as_variables(tree):
        return _as_variables(tree) if jax.tree.structure(tree) == structure else tree

    opt_state = jax.tree.map(
        as_variables, state.opt_state, is_leaf=lambda t: jax.tree.structure(t) == structure
    )
    return _as_variables(state.params), {
        "step": state.step,
        "opt_state": opt_state,
        "rng": state.rng,
    }


def _from_disk(tree):
    """`tree` with each {"value": x} of `_as_variables` as x."""
    is_variable = lambda t: isinstance(t, dict) and list(t) == ["value"]  # noqa: E731
    return jax.tree.map(lambda t: t["value"] if is_variable(t) else t, tree, is_leaf=is_variable)


def save_averaged(run_dir: str | pathlib.Path, params) -> None:
    """Write averaged parameters to run_dir/averaged, replacing any there (every process
    calls this)."""
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(pathlib.Path(run_dir).resolve() / AVERAGED, _as_variables(params), force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()


def restore_model(run_dir: str | pathlib.Path) -> tuple[nnx.Module, Tokenizer]:
    """The trained model and tokenizer of a run folder (its averaged parameters if the
    run averaged checkpoints, else the latest checkpoint's), or those of a Hugging Face
    model folder (see `interop.hf.load`). The parameters go to this process's first
    device, whatever mesh the run trained on; `decode.generate(model, tokenizer, texts)`
    decodes with them. A missing folder is a FileNotFoundError, a damaged checkpoint or
    tokenizer a ValueError naming it."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_dir():
        raise MissingFile(f"{run_dir}: no such run folder")
    if not (run_dir / CHECKPOINTS).is_dir():
        from jaxformer.interop import hf  # a model folder: only then the converter

        if hf.is_model_folder(run_dir):
            return hf.load(run_dir)
        raise MissingFile(
            f"{run_dir}: neither a `jaxformer train --out` folder (no {CHECKPOINTS}/) nor a "
            "Hugging Face model folder (config.json and safetensors weights)"
        )
    tokenizer = load_tokenizer(run_dir)
    checkpointer = Checkpointer(run_dir)
    meta = checkpointer.read_meta()
    config = TransformerConfig.from_dict(meta["model_config"])
    cls = MODEL_KINDS[meta["model_kind"]]
    abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract)
    # Onto this process's first device, whatever mesh the run was trained on.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_params
    )
    if (run_dir / AVERAGED).is_dir():
        averaged = (run_dir / AVERAGED).resolve()
        advice = "delete that folder to use the latest checkpoint"
        with ocp.StandardCheckpointer() as reader:
            params = _read(averaged, advice, lambda: reader.restore(averaged, abstract_params))
    else:
        params = checkpointer._restore(
            checkpointer.latest_step(),
            ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)),
        ).params
    checkpointer.close()
    return nnx.merge(graphdef, params), tokenizer


def abstract_train_state(state: TrainState) -> TrainState:
    """Shapes, dtypes and shardings of `state`, as the restore target: a state laid out
    over a mesh is restored with the same layout, each process reading only its pieces."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
