"""Where a run's numbers go besides metrics.jsonl (always): the trackers `tracker` names
("jsonl,tensorboard,wandb"). Each gets each record as the loop logs it (on the host, one
step late: nothing waits on the device) and the summary at the end. One that cannot start
is bad input, before the first step; one that fails later is stopped with one warning,
and the run goes on."""

from __future__ import annotations

import atexit
import difflib
import importlib
import os
import pathlib
import sys
from typing import Any, Protocol

from jaxformer.checks import BadValue, MissingPackage, as_given

TRACKERS = ("jsonl", "tensorboard", "wandb")
PACKAGES = {  # tracker: (module, what installs it)
    "tensorboard": ("tensorboardX", "pip install 'jaxformer[tensorboard]'"),
    "wandb": ("wandb", "pip install wandb==0.31.0 (or 'jaxformer[wandb]')"),
}


class Tracker(Protocol):  # finish(None): the run stopped
    def log(self, record: dict[str, Any]) -> None: ...
    def finish(self, summary: dict[str, Any] | None) -> None: ...


def names(tracker: str) -> tuple[str, ...]:
    """The trackers a comma list names, jsonl first; an unknown name names the closest."""
    given = [name.strip() for name in str(tracker).split(",") if name.strip()]
    for name in (n for n in given if n not in TRACKERS):
        close = difflib.get_close_matches(name, TRACKERS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise BadValue(f"{as_given('tracker')}: no tracker {name!r}; {hint}(one of {TRACKERS})")
    return tuple(dict.fromkeys(["jsonl", *given]))


def package(name: str):
    """The module tracker `name` writes with, or an error saying how to install it."""
    module, install = PACKAGES[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackage(f"the {name} tracker writes with {module}: {install}") from None


def numbers(record: dict[str, Any]) -> dict[str, int | float]:
    return {k: v for k, v in record.items() if k != "step" and isinstance(v, int | float)}


class TensorBoard:
    """<out>/tensorboard: the numbers as scalars, flushed every 30 s (a flush per record costs
    more than it) and at exit (a stopped run's too); earlier tries' later steps are hidden."""

    def __init__(self, path: pathlib.Path, first_step: int, config: dict, runtime):
        writer = package("tensorboard").SummaryWriter
        self.writer = writer(str(path / "tensorboard"), purge_step=first_step + 1, flush_secs=30)
        atexit.register(self.writer.close)  # closing twice is closing once

    def log(self, record: dict[str, Any]) -> None:
        for name, value in numbers(record).items():
            self.writer.add_scalar(name, value, record["step"])

    def finish(self, summary: dict[str, Any] | None) -> None:
        self.writer.close()


class WandB:
    """A W&B run (files in <out>/wandb) in $WANDB_PROJECT (default jaxformer) of `config`,
    grouped by `runtime.tracker_group` and `tracker_job` (a sweep's name, variant). A resumed
    run continues its folder's W&B run, which keeps its first numbers of the steps run again."""

    def __init__(self, path: pathlib.Path, first_step: int, config: dict, runtime):
        wandb, id_file = package("wandb"), path / "wandb" / "run_id"
        run_id = id_file.read_text() if first_step > 0 and id_file.exists() else None
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "jaxformer"), dir=path, name=str(path),
                id=run_id, resume="allow", config=config, group=runtime.tracker_group,
                job_type=runtime.tracker_job, reinit="create_new",
            )  # fmt: skip
        except Exception as error:  # an unreachable server, refused credentials, ...
            raise BadValue(
                f"W&B could not start a run ({_line(error)}): log in (wandb login), run "
                f"offline (WANDB_MODE=offline), or leave wandb out of {as_given('tracker')}"
            ) from None
        id_file.write_text(self.run.id)
        self.next_step = self.run.step if run_id else 0  # W&B refuses a step before its last

    def log(self, record: dict[str, Any]) -> None:
        if record["step"] >= self.next_step:
            self.run.log(numbers(record), step=record["step"])

    def finish(self, summary: dict[str, Any] | None) -> None:
        self.run.summary.update(numbers(summary or {}))
        self.run.finish(exit_code=0 if summary is not None else 1)


KINDS = {"tensorboard": TensorBoard, "wandb": WandB}  # each tracker but jsonl (RunFolder's)


class Trackers:
    """The trackers but jsonl of `runtime.tracker` on the folder `path` from `first_step`; one
    that raises is stopped with one warning on stderr (metrics.jsonl keeps every number)."""

    def __init__(self, runtime, path: pathlib.Path, first_step: int, config: dict):
        self.open: dict[str, Tracker] = {}
        try:
            for name in names(runtime.tracker)[1:]:
                self.open[name] = KINDS[name](path, first_step, config, runtime)
        except BaseException:
            self.finish(None)
            raise

    def log(self, record: dict[str, Any]) -> None:
        for name, tracker in list(self.open.items()):
            self._guarded(name, lambda t=tracker: t.log(record), f"at step {record['step']}")

    def finish(self, summary: dict[str, Any] | None) -> None:
        for name, tracker in list(self.open.items()):
            self._guarded(name, lambda t=tracker: t.finish(summary), "closing")
        self.open = {}

    def _guarded(self, name: str, call, when: str) -> None:
        try:
            call()
        except Exception as error:
            del self.open[name]
            why = f"warning: the {name} tracker failed {when} ({_line(error)}); it is stopped"
            print(f"{why}, and metrics.jsonl keeps every number", file=sys.stderr)


def _line(error: Exception) -> str:
    return ": ".join([type(error).__name__, *str(error).strip().splitlines()[:1]])
