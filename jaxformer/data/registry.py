"""Named datasets a run gives as `dataset` (`--dataset`): families of corpora, each owning
the names it lists, or every name that starts with its prefix. A family registers here,
from its plugin (`jaxformer.plugins`); the library ships none and imports none. A name
resolves exactly: two families that would own one name are an error at registration.

A corpus is what `load` returns: `training_texts()` (what a BPE tokenizer may learn from),
`data(tokenizer, **options)` (a `TrainingData`) and `description()` (one line for the log)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

from jaxformer import plugins
from jaxformer.checks import BadType, BadValue


@dataclasses.dataclass(frozen=True)
class Family:
    about: str  # its names, for errors and --help
    check: Callable[[str], None]  # raise an InputError unless the name can be loaded here
    load: Callable[[str], Any]  # the corpus
    names: frozenset[str] = frozenset()  # the names it owns, exactly
    prefix: str | None = None  # or: every name that starts with this

    def owns(self, name: str) -> bool:
        return name in self.names or (self.prefix is not None and name.startswith(self.prefix))


DATASETS: dict[str, Family] = {}


def register(name: str, family: Family) -> None:
    """Add `family` under `name`; a name or prefix another family owns is an error."""
    if bool(family.names) == (family.prefix is not None):
        raise BadValue(f"dataset family {name!r}: give its names or its prefix, one of them")
    for other_name, other in DATASETS.items():
        taken = sorted(n for n in family.names if other.owns(n))
        taken += sorted(n for n in other.names if family.owns(n))
        mine, theirs = family.prefix, other.prefix
        if None not in (mine, theirs) and (mine.startswith(theirs) or theirs.startswith(mine)):
            taken.append(f"{mine}*")
        if taken and other_name != name:
            raise BadValue(
                f"dataset family {name!r} would own {taken[0]!r}, which family "
                f"{other_name!r} owns: choose other names"
            )
    DATASETS[name] = family


def family_of(dataset: str) -> Family:
    """The family that owns a dataset name (plugins loaded first); an error lists them."""
    if not isinstance(dataset, str):
        raise BadType(f"dataset must be a string, a registered dataset's name, got {dataset!r}")
    plugins.load()
    for family in DATASETS.values():
        if family.owns(dataset):
            return family
    known = "; ".join(f.about for f in DATASETS.values()) or "none is installed"
    names = [name for family in DATASETS.values() for name in family.names]
    close = difflib.get_close_matches(dataset, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise BadValue(
        f"dataset {dataset!r} is no registered dataset's name; {hint}({known}; a package "
        f"adds datasets through the {plugins.GROUP!r} entry point)"
    )


def check(dataset: str) -> None:
    family_of(dataset).check(dataset)


def load(dataset: str):
    return family_of(dataset).load(dataset)
