"""A training run's folder: what it holds, who writes it, and whether a run may start there.

    config.json, tokenizer.json   the model and run configs; the tokenizer (for generate)
    metrics.jsonl    one JSON object per logged step and per evaluation
    summary.json     final metrics, timings, parameter count, the configs (written last)
    checkpoints/, averaged/   orbax checkpoints (the last `keep`); their mean parameters
    predictions.tsv, test_predictions.tsv   source<TAB>reference<TAB>prediction per pair
    loss.png, attention.png, tensorboard/   plots (`jaxformer.train.report`), scalars

Every process of a multi-process run opens the folder (orbax writes with all of them); only
process 0 writes the other files. A killed process can leave a torn last line of
metrics.jsonl, which `read_metrics` drops with a warning; the other files are written whole
(a temporary file, renamed). A resume refuses other damage to what it reads (config.json,
metrics.jsonl, checkpoints), naming the file, and overwrites what it derives unread.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import warnings
from typing import Any

from jaxformer.checks import BadValue, InputWarning, MissingFile, MissingPackage, option
from jaxformer.parallel import Placement, is_main_process
from jaxformer.train.checkpoint import (
    AVERAGED,
    Checkpointer,
    abstract_train_state,
    check_compatible,
    save_averaged,
)
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
        step is saved already; returns its step."""
        one = self.placement.one_copy(state)
        step = int(one.step)
        if step > (self.checkpoints.latest_step() or 0):
            self.checkpoints.save(one, self.meta)
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
