"""Named datasets a run gives as `dataset` (`--dataset`): families of corpora, each owning
the names of one shape ("wyc-web", "web-lm" are the lab's Bibles). A family registers
here, from its plugin (`jaxformer.plugins`); the library ships none and imports none.

A corpus is what `load` returns: `training_texts()` (what a BPE tokenizer may learn from),
`data(tokenizer, **options)` (a `TrainingData`) and `description()` (one line for the log)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxformer import plugins
from jaxformer.checks import BadType, BadValue


@dataclasses.dataclass(frozen=True)
class Family:
    about: str  # its names, for errors and --help: "SRC-TGT or VER-lm Bible datasets"
    owns: Callable[[str], bool]  # whether a name has this family's shape
    check: Callable[[str], None]  # raise an InputError unless the name can be loaded here
    load: Callable[[str], Any]  # the corpus


DATASETS: dict[str, Family] = {}


def register(name: str, family: Family) -> None:
    DATASETS[name] = family


def family_of(dataset: str) -> Family:
    """The family that owns a dataset name (plugins loaded first); an error lists them."""
    if not isinstance(dataset, str):
        raise BadType(f"dataset must be a string such as 'wyc-web', got {dataset!r}")
    plugins.load()
    for family in DATASETS.values():
        if family.owns(dataset):
            return family
    known = "; ".join(f.about for f in DATASETS.values()) or "none is installed"
    raise BadValue(
        f"dataset {dataset!r} is no registered dataset's name ({known}); a package adds "
        f"datasets through the {plugins.GROUP!r} entry point, as jaxformer-lab adds the Bibles"
    )


def check(dataset: str) -> None:
    family_of(dataset).check(dataset)


def load(dataset: str):
    return family_of(dataset).load(dataset)
