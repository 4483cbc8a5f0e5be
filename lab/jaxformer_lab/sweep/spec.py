"""A sweep's spec, the folder of each of its runs, and what a run folder says about it.

A spec (YAML or JSON) names a base configuration, variants (each a set of overrides of
RunConfig options and TransformerConfig fields), an optional grid, and seeds:

    base: {task: dates, steps: 600, preset: tiny}   # any fields, and `preset`
    variants: {baseline: {}, squared_relu: {activation: squared_relu}}
    grid: {num_heads: [1, 4], dropout_rate: [0.0, 0.3]}   # each combination a variant
    seeds: 3                                               # or a list: [0, 1, 2]

and, optionally, baseline, readings, stages, variant_files, out (default runs/sweeps/<the
spec's file name>), paper and target (a held-out figure to reach: `target`). A run's fields (base, then its variant's, then the sweep's
seed and folder) resolve as a run file would (jaxformer.train.config.load_run), and each
run of `<out>/<variant>/seed<k>` records the hash of its resolved configuration in
`config_hash.json` when it is launched. Every key: docs/research.md, "The sweep spec"."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import pathlib

import yaml

from jaxformer.checks import BadValue, InputError
from jaxformer.cli import import_variants
from jaxformer.config import TransformerConfig, load_config_file
from jaxformer.files import read_json
from jaxformer.train.config import RunConfig, load_run
from jaxformer_lab.sweep.paper import Paper
from jaxformer_lab.sweep.target import Target

SPEC_KEYS = (
    *("base", "variants", "grid", "seeds", "baseline", "readings", "variant_files", "out"),
    *("paper", "stages", "target"),
)
MODEL_FIELDS = ("preset", *(f.name for f in dataclasses.fields(TransformerConfig)))
RUN_FIELDS = tuple(RunConfig.options())
SWEEP_OWNS = ("seed", "out")  # set by the sweep for each run
SWEEP_WIDE = ("final_test",)  # set in base only: every variant scores the same sets
HASH_FILE = "config_hash.json"
TRACKING = ("tracker", "tracker_group", "tracker_job")  # where the numbers go: not hashed
HASH_VERSION = 2  # raised when what a run's configuration holds changes (new options)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A checked sweep spec; `Spec.load(path)` reads one."""

    base: dict
    variants: dict[str, dict]
    seeds: tuple[int, ...]
    baseline: str
    variant_files: tuple[str, ...]
    out: pathlib.Path
    readings: tuple[str, ...] = ()  # other baselines the runs are read against
    paper: Paper | None = None  # a paper's figures and findings, which the report reads
    stages: dict[str, dict] = dataclasses.field(default_factory=dict)  # runs variants start from
    target: Target | None = None  # a held-out figure each run's steps and seconds to it count

    @classmethod
    def load(
        cls, path: str | pathlib.Path, out: str | None = None, overrides: tuple[str, ...] = ()
    ) -> Spec:
        """The spec in `path`, its base changed by `overrides` ("key=value", a YAML value)."""
        fields = _read(path)
        unknown = [k for k in fields if k not in SPEC_KEYS]
        if unknown:
            raise BadValue(f"{path}: unknown key {unknown[0]!r}; a spec has {', '.join(SPEC_KEYS)}")
        variants = _variants(fields, path)
        base = _mapping(fields.get("base", {}), f"{path}: base") | _overrides(overrides)
        spec = cls(
            base=base,
            variants=variants,
            seeds=_seeds(fields.get("seeds", 1), path),
            baseline=str(fields.get("baseline", next(iter(variants)))),
            variant_files=_variant_files(fields.get("variant_files", []), path),
            out=pathlib.Path(
                out or fields.get("out") or pathlib.Path("runs/sweeps") / pathlib.Path(path).stem
            ),
            readings=_readings(fields.get("readings", []), path),
            stages=_stages(fields.get("stages", {}), base, variants, path),
            paper=None
            if "paper" not in fields
            else Paper.read(fields["paper"], path, MODEL_FIELDS),
            target=None if "target" not in fields else Target.read(fields["target"], path),
        )
        for name in spec.baselines:
            if name not in spec.variants:
                key = "baseline" if name == spec.baseline else "readings:"
                raise BadValue(
                    f"{path}: {key} {name!r} is not one of the variants {list(spec.variants)}"
                )
        import_variants(list(spec.variant_files))
        for name in spec.runs:  # every configuration is checked before any run starts
            spec.configs(name, spec.seeds[0])
        return spec

    @property
    def runs(self) -> tuple[str, ...]:
        """The names of a seed's runs in the order they run: the stages, then the variants."""
        return (*self.stages, *self.variants)

    def stage_of(self, name: str) -> str | None:
        """The stage a variant starts from (None: it starts from scratch or a folder)."""
        init_from = self.variants.get(name, {}).get("init_from")
        return init_from["stage"] if isinstance(init_from, dict) else None

    @property
    def baselines(self) -> tuple[str, ...]:
        """The baseline, then the other readings' baselines: each variant is compared with
        each, and the verdicts of all those comparisons are one family."""
        return (self.baseline, *dict.fromkeys(r for r in self.readings if r != self.baseline))

    def folder(self, variant: str, seed: int) -> pathlib.Path:
        return self.out / variant / f"seed{seed}"

    def configs(self, variant: str, seed: int) -> tuple[TransformerConfig, RunConfig]:
        """The model and run configuration of one run, of a variant or a stage (errors
        name it)."""
        where = self.what(variant)
        for key in self._overrides(variant):
            if key in SWEEP_WIDE:
                raise BadValue(f"{where}: {key!r} is set for the whole sweep, in base")
        fields = self.base | self._overrides(variant)
        for key in fields:
            if key in SWEEP_OWNS:
                raise BadValue(f"{where}: {key!r} is set by the sweep (seeds, out)")
            _check_field(key, where)
        model = {k: v for k, v in fields.items() if k in MODEL_FIELDS}
        try:
            return load_run(model=model, run=self.run_options(variant, seed))
        except InputError as e:
            raise type(e)(f"{where}: {e}") from None

    def run_options(self, variant: str, seed: int) -> dict:
        """The run options of one run as the spec gives them (base, then the variant's),
        with the sweep's seed and folder (and a stage's folder for `init_from: {stage:
        NAME}`), and unless given, the sweep's name and the variant as the W&B group and job
        type; the defaults are load_run's."""
        fields = self.base | self._overrides(variant)
        given = {k: v for k, v in fields.items() if k in RUN_FIELDS}
        stage = self.stage_of(variant)
        if stage is not None:
            given["init_from"] = str(self.folder(stage, seed))
        tracked = {"tracker_group": self.out.name, "tracker_job": variant}
        return tracked | given | {"seed": seed, "out": str(self.folder(variant, seed))}

    def what(self, name: str) -> str:
        """ "variant 'NAME'" or "stage 'NAME'", for messages."""
        return f"{'stage' if name in self.stages else 'variant'} {name!r}"

    def _overrides(self, name: str) -> dict:
        return self.stages[name] if name in self.stages else self.variants[name]

    def config_hash(self, variant: str, seed: int) -> str:
        """A hash of the run's resolved model and run configuration (its folder and TRACKING
        aside), of the variant files it registers and of HASH_VERSION: a folder of an earlier
        version, made before options were added, is refused as changed (`--rerun-changed`)."""
        model, run = self.configs(variant, seed)
        resolved = {
            "model": model.to_dict(),
            "run": {k: v for k, v in run.to_dict().items() if k not in TRACKING} | {"out": None},
            "variant_files": list(self.variant_files),
            "hash_version": HASH_VERSION,
        }
        stage = self.stage_of(variant)
        if stage is not None:  # the stage's configuration, not its folder: a moved sweep keeps it
            resolved["run"]["init_from"] = None
            resolved["stage"] = self.config_hash(stage, seed)
        text = json.dumps(resolved, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def recorded_hash(self, variant: str, seed: int) -> str | None:
        """The hash its folder recorded at launch; None if it holds none."""
        path = self.folder(variant, seed) / HASH_FILE
        return read_json(path).get("config_hash") if path.exists() else None


def status(folder: pathlib.Path) -> str:
    """ "done", "diverged", "failed" (see its train.log) or "pending"."""
    for name in ("done", "diverged", "failed"):
        if (folder / ("summary.json" if name == "done" else f"{name}.json")).exists():
            return name
    return "pending"


def _check_field(key: str, where: str) -> None:
    if key not in MODEL_FIELDS + RUN_FIELDS:
        close = difflib.get_close_matches(key, MODEL_FIELDS + RUN_FIELDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        what = "not a TransformerConfig field or RunConfig option"
        raise BadValue(f"{where}: unknown field {key!r} ({what}){hint}")


def _variants(fields: dict, path) -> dict[str, dict]:
    """The named variants, then the grid's, each name once."""
    named = fields.get("variants", {})
    if not isinstance(named, dict) or not (named or fields.get("grid")):
        raise BadValue(
            f"{path}: variants must be a non-empty mapping: name -> overrides (or give a grid)"
        )
    variants = {str(k): _mapping(v or {}, f"{path}: variant {k!r}") for k, v in named.items()}
    for name, overrides in _grid(fields.get("grid", {}), path):
        if name in variants:
            raise BadValue(f"{path}: the grid's variant {name!r} is also a named variant")
        variants[name] = overrides
    return variants


def _grid(grid, path) -> list[tuple[str, dict]]:
    """Every combination of a {field: [values]} mapping, as (name, overrides)."""
    grid = _mapping(grid, f"{path}: grid")
    for key, values in grid.items():
        _check_field(key, f"{path}: grid")
        if key in SWEEP_OWNS + SWEEP_WIDE:
            raise BadValue(f"{path}: grid: {key!r} cannot vary between variants")
        if not isinstance(values, list) or not values:
            raise BadValue(f"{path}: grid: {key} must be a non-empty list, got {values!r}")
    combos = itertools.product(*grid.values())
    return [
        (
            ",".join(f"{k}={v}" for k, v in zip(grid, combo, strict=True)),
            dict(zip(grid, combo, strict=True)),
        )
        for combo in (combos if grid else [])
    ]


def _overrides(pairs: tuple[str, ...]) -> dict:
    """{key: value} of --set key=value options; the value is read as YAML (3, 0.1, true)."""
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadValue(f"--set takes key=value, got {pair!r}")
        _check_field(key, "--set")
        if key in SWEEP_OWNS:
            raise BadValue(f"--set: {key!r} is set by the sweep (seeds, out)")
        try:
            fields[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise BadValue(f"--set {pair}: not a YAML value ({str(e).splitlines()[0]})") from None
    return fields


def _read(path) -> dict:
    """The spec's mapping; a key given twice in one mapping (two variants of one name) is
    an error, where YAML and JSON readers keep the last silently."""
    fields = load_config_file(str(path))
    text = pathlib.Path(path).read_text(encoding="utf-8")
    try:
        if pathlib.Path(path).suffix in (".yaml", ".yml"):
            yaml.load(text, Loader=_UniqueKeyLoader)
        else:
            json.loads(text, object_pairs_hook=_unique)
    except ValueError as e:
        raise BadValue(f"{path}: {e}") from None
    return fields


def _unique(pairs: list[tuple]) -> dict:
    keys = [k for k, _ in pairs]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise BadValue(f"{twice!r} is given twice in one mapping (variant names must differ)")
    return dict(pairs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        _unique([(self.construct_object(k, deep=deep), None) for k, _ in node.value])
        return super().construct_mapping(node, deep=deep)


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadValue(f"{where} must be a mapping of config fields, got {value!r}")
    return dict(value)


def _stages(value, base: dict, variants: dict[str, dict], path) -> dict[str, dict]:
    """`stages: {NAME: overrides}`, each name not a variant's, each started from scratch
    or a folder; and every variant's `init_from: {stage: NAME}` one of them (set in the
    variants, not in base, which the stages share)."""
    if isinstance(base.get("init_from"), dict):
        raise BadValue(f"{path}: base: init_from {{stage: NAME}} is set in a variant")
    stages = {
        str(k): _mapping(v or {}, f"{path}: stage {k!r}")
        for k, v in _mapping(value, f"{path}: stages").items()
    }
    for name, overrides in stages.items():
        if name in variants:
            raise BadValue(f"{path}: {name!r} is both a stage and a variant")
        if isinstance(overrides.get("init_from"), dict):
            raise BadValue(f"{path}: stage {name!r}: a stage cannot start from a stage")
    for name, overrides in variants.items():
        init_from = overrides.get("init_from")
        if isinstance(init_from, dict) and (
            list(init_from) != ["stage"] or init_from["stage"] not in stages
        ):
            raise BadValue(
                f"{path}: variant {name!r}: init_from {init_from!r} names no stage; give a "
                f"folder or {{stage: NAME}}, NAME one of the stages {list(stages)}"
            )
    return stages


def _variant_files(value, path) -> tuple[str, ...]:
    """`variant_files: [FILE.py or MODULE, ...]`."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadValue(f"{path}: variant_files must be a list of files or modules, got {value!r}")
    return tuple(value)


def _readings(value, path) -> tuple[str, ...]:
    """`readings: [NAME, ...]`: the other baselines, each a variant's name."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise BadValue(f"{path}: readings must be a list of variant names, got {value!r}")
    return tuple(value)


def _seeds(value, path) -> tuple[int, ...]:
    """`seeds: N` (0 .. N-1) or a list of distinct ints."""
    seeds = list(range(value)) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise BadValue(
            f"{path}: seeds must be a count >= 1 or a list of distinct ints, got {value!r}"
        )
    return tuple(seeds)
