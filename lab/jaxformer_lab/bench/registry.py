"""The benchmarks behind `jaxformer bench NAME`: each a name, a frozen dataclass of typed
options and a function `run(options) -> Record`, registered where it is defined:

    @dataclass(frozen=True)
    class DecodeOptions(Options):
        quick: bool = setting(False, "output lengths 16 and 64 (a CPU in seconds)")

    @BENCHMARKS.register("decode", DecodeOptions)
    def run(options: DecodeOptions) -> Record:
        '''The KV cache against recomputing the prefix (its help line).'''

Each field is an option of the command (`add_options`, `options_from`; `command(name,
options)` gives the command line back). `run(name, options)` writes the record to --out
(default results/NAME.json) and prints data["headline"] last on stdout, progress on
stderr (`say`). To write one: docs/performance.md, "A benchmark of your own"."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shlex
import sys
import typing
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from jaxformer.checks import BadType, BadValue, check_instance
from jaxformer_lab.results import Record, check_out


def setting(default, help: str, **extra) -> Any:
    """A field of an options dataclass: its default and one line of help; `choices=(...)`
    limits a string's values."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


@dataclasses.dataclass(frozen=True)
class Options:
    """What every benchmark takes: where its record goes. A benchmark whose --out is a
    folder (FOLDER: its record is FOLDER/record.json) says so."""

    FOLDER: ClassVar[bool] = False
    out: str = setting(
        "", "the record, a .json path (default: results/NAME.json); other files go next to it"
    )

    def __post_init__(self):
        if not isinstance(self.out, str) or (
            self.out and not self.FOLDER and not self.out.endswith(".json")
        ):
            raise BadValue(f"--out must be a .json path, got {self.out!r}")
        if self.out and not self.FOLDER:
            check_out(self.out)

    def record_path(self) -> pathlib.Path:
        """Where the record goes: --out, or record.json in the --out folder."""
        return pathlib.Path(self.out) / "record.json" if self.FOLDER else pathlib.Path(self.out)


class Stopped(BaseException):
    """A benchmark stopped (a signal, its time limit) after writing what it had; `code`
    is the exit status to give. A BaseException, as KeyboardInterrupt is, so that no
    `except Exception` (around a library call that may fail) swallows a stop."""

    def __init__(self, why: str, code: int):
        super().__init__(why)
        self.code = code


class Benchmark(NamedTuple):
    name: str
    options: type  # a frozen dataclass derived from Options
    run: Callable[[Any], Record]
    help: str  # the first line of run's docstring


class Registry:
    """Benchmarks by name. `register(name, options)` decorates a run function; `[name]`
    returns its Benchmark; `check(name)` names the registered ones."""

    def __init__(self):
        self._benchmarks: dict[str, Benchmark] = {}

    def register(self, name: str, options: type):
        """A decorator registering `run(options) -> Record` as benchmark `name`, its
        options the frozen dataclass `options` (derived from Options; flags default False)."""
        if not (isinstance(options, type) and issubclass(options, Options)):
            raise BadType(f"benchmark {name!r}: options must be a frozen Options dataclass")
        if any(f.default is True for f in dataclasses.fields(options)):
            raise BadValue(f"benchmark {name!r}: a flag's default must be False")

        def decorate(fn: Callable[[Any], Record]) -> Callable[[Any], Record]:
            if name in self._benchmarks and self._benchmarks[name].run is not fn:
                raise BadValue(f"benchmark {name!r} is already registered")
            help = (fn.__doc__ or name).strip().splitlines()[0]
            self._benchmarks[name] = Benchmark(name, options, fn, help)
            return fn

        return decorate

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._benchmarks)

    def check(self, name) -> None:
        if name not in self._benchmarks:
            raise BadValue(f"benchmark must be one of {self.names}, got {name!r}")

    def __getitem__(self, name: str) -> Benchmark:
        self.check(name)
        return self._benchmarks[name]


BENCHMARKS = Registry()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser, cls: type, name: str = "NAME") -> None:
    """One command-line option per field of the options dataclass `cls` (of benchmark
    `name`): a bool is a flag, a tuple takes one or more values, `X | None` takes an X."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = _base_type(hints[f.name])
        tuple_of = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else None
        shown = " ".join(map(str, f.default)) if tuple_of else f.default
        given = f.default in (None, "", ()) or kind is bool
        help = f.metadata["help"].replace("NAME", name) + ("" if given else f" (default: {shown})")
        kw: dict[str, Any] = {"default": f.default, "help": help.replace("%", "%%")}
        if kind is bool:
            kw["action"] = "store_true"
        else:
            kw |= {"type": tuple_of or kind, "choices": f.metadata.get("choices")}
            kw |= {"nargs": "+"} if tuple_of else {}
        parser.add_argument(flag(f.name), **kw)


def _base_type(hint):
    """The type of an annotation such as `int | None` (int), `tuple[int, ...]` kept."""
    if typing.get_origin(hint) is tuple:
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def options_from(args: argparse.Namespace, cls: type):
    """The options of a parsed command line (add_options's); checked by `cls`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def command(name: str, options) -> str:
    """The command line that gives `options`: every option that differs from its default
    (--out left out where it is the default, results/NAME.json)."""
    words = ["jaxformer", "bench", name]
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value == f.default or (f.name == "out" and value == default_out(name)):
            continue
        if isinstance(value, bool):
            words.append(flag(f.name))
        elif isinstance(value, tuple):
            words += [flag(f.name), *map(str, value)]
        else:
            words += [flag(f.name), str(value)]
    return shlex.join(words)


def default_out(name: str) -> str:
    return f"results/{name}.json"


def beside(options: Options, suffix: str) -> pathlib.Path:
    """A file next to the record: results/NAME.json -> results/NAME{suffix}; a folder
    with suffix ""."""
    out = pathlib.Path(options.out)
    return out.with_name(out.stem + suffix)


def say(line: str) -> None:
    """Progress, as it happens (stderr, flushed)."""
    print(line, file=sys.stderr, flush=True)


def run(name: str, options) -> Record:
    """Run benchmark `name` with `options`, write its record to --out (default
    results/NAME.json) with the command that reproduces it, and print its headline."""
    benchmark = BENCHMARKS[name]
    check_instance("options", options, benchmark.options)
    given = command(name, options)
    options = dataclasses.replace(options, out=options.out or default_out(name))
    record = benchmark.run(options)
    record.command = given
    record.write(options.record_path())
    headline = (record.data or {}).get("headline", {})
    print(json.dumps({"record": str(options.record_path())} | headline), flush=True)
    return record
