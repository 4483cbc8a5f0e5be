"""A training run's folder: what it holds, who writes it, whether a run may start there
(its checkpoints: `jaxformer.checkpoints`).

    config.json, tokenizer.json   the model and run configs; the tokenizer (for generate)
    metrics.jsonl    one JSON object per logged step and per evaluation
    summary.json     final metrics, timings, parameter count, the configs (written last)
    checkpoints/, averaged/   orbax checkpoints (the last `keep`); their mean parameters
    predictions.tsv, test_predictions.tsv   source<TAB>reference<TAB>prediction per pair
    loss.png, attention.png, tensorboard/, wandb/   plots, the trackers' files

Every process of a multi-process run opens the folder (orbax writes with all of them); only
process 0 writes the other files, each whole (a temporary file, renamed), as orbax does a
checkpoint: a killed process leaves the earlier ones intact, and a torn last line of
metrics.jsonl, which `read_metrics` drops with a warning. A resume refuses other damage to
what it reads (config.json, metrics.jsonl, checkpoints), naming the file."""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

from jaxformer.checkpoints import (
    AVERAGED,
    CHECKPOINTS,
    Checkpointer,
    abstract_train_state,
    check_compatible,
    save_averaged,
)
from jaxformer.checks import BadValue, as_given
from jaxformer.files import read_json, read_metrics, write_whole
from jaxformer.parallel import Placement, is_main_process
from jaxformer.trackers import Trackers
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
                f"{self.path} exists and is not a folder; choose another {as_given('out')}"
            )
        steps = list((self.path / CHECKPOINTS).glob("[0-9]*"))
        if (self.path / "summary.json").is_file() and not steps:  # before orbax starts there
            raise BadValue(
                f"{self.path} holds a finished run (summary.json) and no checkpoint to resume "
                f"from: choose another {as_given('out')}, or remove that run to train anew"
            )
        self.placement, self.meta = placement, meta
        self.is_main, self.verbose = is_main_process(), verbose
        self._made, self._held = _make(self.path)
        self.checkpoints = Checkpointer(self.path, keep=keep_checkpoints)
        self.metrics_path = self.path / "metrics.jsonl"
        self.trackers = None
        # set by restore: the seconds the kept steps took, in all and evaluating
        self.resumed_seconds = dict.fromkeys(CLOCKS, 0.0)

    def start(self, *, resume: bool) -> bool:
        """Whether to resume from the latest checkpoint. A fresh start empties the metrics.
        Refused: checkpoints without `resume` (the run would overwrite them), a resume whose
        config.json is damaged or whose checkpoint does not match the run's meta (a finished
        run's summary.json without checkpoints is refused on opening). Averaged parameters of an
        earlier end are removed (the run's end writes them again) only once the checkpoint
        is restored: a refused resume keeps them."""
        latest = self.checkpoints.latest_step()
        if latest is not None and not resume:
            raise BadValue(
                f"{self.path} already holds checkpoints (latest step {latest}); pass "
                f"{as_given('resume', True)} to continue that run, or choose another {as_given('out')}"
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

    def open_trackers(self, runtime, first_step: int, config: dict) -> None:
        """From now on also send each record to the run's trackers (`jaxformer.trackers`)."""
        if self.is_main:
            self.trackers = Trackers(runtime, self.path, first_step, config)

    def log(self, record: dict[str, Any]) -> None:
        """Append one record to metrics.jsonl (and send it to the trackers when open)."""
        if not self.is_main:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.trackers is not None:
            self.trackers.log(record)

    def write_json(self, name: str, value: Any) -> None:
        self._write(name, json.dumps(value, indent=1))

    def say(self, message: str) -> None:
        if self.is_main and self.verbose:
            print(message, flush=True)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self.checkpoints.close()
        if self.trackers is not None:
            self.trackers.finish(summary)

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
            f"cannot make the run folder {path} ({e.strerror}); choose another {as_given('out')}"
        ) from None
    return made, held
