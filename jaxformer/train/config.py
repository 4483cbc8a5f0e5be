"""A run's configuration: RunConfig, its data, optimisation, evaluation and runtime
options (frozen dataclasses that check themselves, each field an option of `jaxformer
train`), and `load_run`, the one resolution of a run file's model and run."""

from __future__ import annotations

import dataclasses
import difflib
import math
import pathlib
import re
import typing
from typing import Any

from jaxformer.checks import (
    BadValue,
    InputError,
    check_bool,
    check_choice,
    check_divisible,
    check_int,
    check_number,
)
from jaxformer.checks import option as as_given
from jaxformer.config import PRESETS, TransformerConfig, load_config_file, option
from jaxformer.data import registry as datasets
from jaxformer.data.tasks import TASKS
from jaxformer.data.tokenizers import ByteTokenizer

SCHEDULES = ("paper", "cosine", "constant")
OPTIMIZERS = ("adam", "adamw")
TOKENIZERS = ("byte", "bpe")
SOURCES = ("task", "data_tsv", "data_text", "dataset", "data_shards")  # exactly one per run


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataOptions:
    """What a run trains on: one source (a task, a data file or a dataset), its tokenizer,
    and how its examples are cut and padded."""

    task: str | None = option(
        None, "a synthetic task; default dates, unless a data file is given", TASKS, resume=True
    )
    data_tsv: str | None = option(
        None, "a file of source<TAB>target lines (translation)", resume=True
    )
    data_text: str | None = option(
        None, "plain text for a decoder-only language model", resume=True
    )
    dataset: str | None = option(
        None,
        "a registered dataset (jaxformer.data.registry), e.g. the lab's Bibles: SRC-TGT "
        "translation between two versions (wyc-web), SRC+EXTRA-TGT with other versions' "
        "training books as extra training pairs (wyc+kjv-web), or VER-lm, an LM (web-lm)",
        resume=True,
    )
    data_shards: str | None = option(
        None,
        "token shards (llm.c's .bin, `jaxformer prepare`'s) for a decoder-only LM, a glob "
        "('DIR/train_*.bin'); the tokenizer: theirs (DIR/tokenizer.json), else vocab_size ids",
        resume=True,
    )
    val_shards: str | None = option(None, "their held-out shards ('DIR/val_*.bin')", resume=True)
    eot_id: int | None = option(
        None, "shards' end-of-text id; default the tokenizer's EOS, else GPT-2's", resume=True
    )
    pack: bool = option(
        True, "LM rows hold whole documents, best-fit; off: one a row, padded", resume=True
    )
    tokenizer: str = option(
        dataclasses.MISSING,
        "bytes, or BPE trained on the data file or the dataset's training books "
        "(default: bpe with --dataset, else byte)",
        TOKENIZERS,
        resume=True,
    )
    init_from: str | None = option(
        None,
        "fine-tune a trained model, its architecture, weights and tokenizer: a jaxformer "
        "run folder (its averaged or latest checkpoint) or a Hugging Face model folder",
        resume=True,
    )
    bpe_vocab_size: int | None = option(
        None, "BPE vocabulary; default sized from the data", resume=True
    )
    seq_len: int = option(128, "tokens per row of packed text (language modelling)", resume=True)
    pad_multiple: int = option(
        16,
        "translation batches are padded to a multiple of this many tokens: larger means "
        "fewer shapes to compile (wyc-web, batch 64: 10 at 16, 6 at 32, 3 at 64) and more padding",
    )
    shared_lengths: bool = option(
        False,
        "translation: every seed's batches come in the same order of lengths (each holds "
        "that seed's own pairs), so seeds in one vmapped step (--vmap-seeds on) pad little",
        resume=True,
    )
    batch_tokens: int | None = option(
        None,
        "translation: batches of up to this many tokens a side (rows x the padded longer "
        "side, as the paper's ~25,000) in place of batch_size pairs; one process, one device",
        resume=True,
    )

    def __post_init__(self):
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            how_many = "not several" if given else "got none"
            *some, last = (as_given(name) for name in SOURCES)
            raise BadValue(f"give one of {', '.join(some)} or {last}, {how_many}")
        if self.task is not None:
            check_choice("task", self.task, TASKS)
        if self.dataset is not None:
            datasets.check(self.dataset)
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        check_bool("pack", self.pack)
        if self.eot_id is not None:
            check_int("eot_id", self.eot_id, minimum=0)
        shard_options = [n for n in ("val_shards", "eot_id") if getattr(self, n) is not None]
        if shard_options and not self.data_shards:
            raise BadValue(f"{', '.join(shard_options)} go with data_shards")
        lm = self.data_text or self.data_shards or (self.dataset or "").endswith("-lm")
        if not self.pack and not lm:
            raise BadValue("pack=False lays out LM rows: give data_text, data_shards or VER-lm")
        if self.data_shards and self.tokenizer == "bpe":
            raise BadValue("token shards are tokenized: their tokenizer.json is the tokenizer")
        if self.tokenizer == "bpe" and self.task:
            raise BadValue(
                "the BPE tokenizer is trained on data; use it with data_tsv, data_text or dataset"
            )
        if self.bpe_vocab_size is not None:
            check_int("bpe_vocab_size", self.bpe_vocab_size, minimum=300)
        check_int("seq_len", self.seq_len)
        check_int("pad_multiple", self.pad_multiple)
        if self.batch_tokens is not None:
            check_int("batch_tokens", self.batch_tokens)
            if not (self.data_tsv or (self.dataset and not self.dataset.endswith("-lm"))):
                raise BadValue(
                    "batch_tokens batches translation pairs: give data_tsv or a SRC-TGT dataset"
                )

    @classmethod
    def from_options(cls, **given) -> DataOptions:
        """The options given, and the defaults that depend on others (for those unset or
        None): the dates task when no data is given; BPE for a dataset, else bytes (a model
        given by init_from brings its own tokenizer: a resolved configuration, such as a
        run folder's config.json, records "byte" for it, and no other may be given)."""
        given = dict(given)
        if all(given.get(name) is None for name in SOURCES):
            given["task"] = "dates"
        init_from = given.get("init_from")
        if given.get("tokenizer") is None:  # verses in bytes are long: BPE for a dataset
            bpe = given.get("dataset") is not None and init_from is None
            given["tokenizer"] = "bpe" if bpe else "byte"
        elif init_from is not None and given["tokenizer"] != "byte":  # "byte": as resolved
            raise BadValue("a model given by init_from brings its tokenizer; leave tokenizer unset")
        if init_from is not None and given.get("bpe_vocab_size") is not None:
            raise BadValue(
                "a model given by init_from brings its tokenizer; leave bpe_vocab_size unset"
            )
        return cls(**given)

    @property
    def name(self) -> str:
        """The task, the dataset, the data file's name or the shards' folder's (that of the
        default run folder)."""
        if self.data_shards:
            return pathlib.Path(self.data_shards).parent.name or "shards"
        return self.task or self.dataset or pathlib.Path(self.data_tsv or self.data_text).stem


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimOptions:
    """How the model is optimised: steps and batches, the learning-rate schedule and the
    optimizer."""

    steps: int = option(1500, "optimizer steps")
    batch_size: int = option(64, "examples (rows) per step", resume=True)
    accum_steps: int = option(1, "micro-batches per step (gradient accumulation)", resume=True)
    schedule: str = option(
        "cosine", "learning-rate schedule; paper: eq. (3)", SCHEDULES, resume=True
    )
    lr: float | None = option(
        None, "peak lr, default 3e-3 (paper schedule: a multiplier, default 1)", resume=True
    )
    warmup_steps: int | None = option(
        None, "default: 10% of steps (cosine), 4000 (paper)", resume=True
    )
    optimizer: str = option(
        "adam", "Adam(0.9, 0.98, 1e-9) as the paper, or AdamW", OPTIMIZERS, resume=True
    )
    weight_decay: float = option(0.0, "decoupled weight decay (adamw)", resume=True)
    clip_norm: float | None = option(
        1.0, "global gradient-norm clipping; none to turn off", resume=True
    )

    def __post_init__(self):
        for name in ("steps", "batch_size", "accum_steps"):
            check_int(name, getattr(self, name))
        check_divisible("batch_size", self.batch_size, "accum_steps", self.accum_steps)
        check_choice("schedule", self.schedule, SCHEDULES)
        if self.warmup_steps is not None:
            check_int("warmup_steps", self.warmup_steps, minimum=0)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        for name in ("lr", "clip_norm"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), "(0, inf)")
        check_number("weight_decay", self.weight_decay, "[0, inf)")

    @property
    def peak_lr(self) -> float | None:
        """The lr given to the schedule: as given, else 3e-3 (None = 1x for "paper")."""
        if self.lr is not None or self.schedule == "paper":
            return self.lr
        return 3e-3

    @property
    def warmup(self) -> int:
        """Warm-up steps: as given, else the paper's 4000 or a tenth of the run (at least
        1, and fewer than `steps`, so that a one-step run has a cosine schedule too)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return 4000 if self.schedule == "paper" else min(max(1, self.steps // 10), self.steps - 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """How the held-out data is evaluated, during the run and at its end."""

    eval_every: int = option(250, "steps between held-out evaluations")
    eval_examples: int = option(
        1000,
        "held-out examples (a Bible's dev books: a sample stratified by book, the same for every seed)",
    )
    eval_sample: int = option(
        200, "of those, decoded greedily at each in-run evaluation; the final model decodes all"
    )
    final_test: bool = option(
        False, "also score the final model on the test set (a Bible's test books): opt-in"
    )
    eval_beam: int | None = option(
        None, "beam of held-out decoding, 1 = greedy; default 4 (the paper) for BLEU data, else 1"
    )
    eval_alpha: float = option(0.6, "length penalty of that beam search (the paper: 0.6)")
    average_checkpoints: int = option(
        1, "at the end, also evaluate the mean parameters of the last K checkpoints; 1 = off"
    )

    def __post_init__(self):
        for name in ("eval_every", "eval_examples", "eval_sample", "average_checkpoints"):
            check_int(name, getattr(self, name))
        check_bool("final_test", self.final_test)
        if self.eval_beam is not None:
            check_int("eval_beam", self.eval_beam)
        check_number("eval_alpha", self.eval_alpha, "[0, inf)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """One run of an experiment: its seed (what a sweep varies between the runs of one
    variant), its folder and what it records there, and the devices it runs on."""

    seed: int = option(0, "initialisation, dropout and data order", resume=True)
    out: str = option(dataclasses.MISSING, "run folder; default runs/<task or data file name>")
    log_every: int = option(10, "steps between logged metrics")
    checkpoint_every: int = option(500, "steps between checkpoints")
    keep_checkpoints: int = option(3, "checkpoints kept")
    profile: str | None = option(
        None, "START:STOP: a jax.profiler trace of steps START+1..STOP in <out>/profile"
    )
    mesh: str | None = option(None, "device mesh, e.g. data=2,fsdp=2,tensor=2 (one size may be -1)")
    pmap: bool = option(False, "data parallel with jax.pmap over this process's devices")
    log_internals: int | None = option(
        None, "every N steps log gradient/parameter/update norms, attention entropy, activation RMS"
    )
    tensorboard: bool = option(
        False, "also write the metrics as TensorBoard event files in <out>/tensorboard"
    )

    def __post_init__(self):
        check_int("seed", self.seed, minimum=None)
        for name in ("log_every", "checkpoint_every", "keep_checkpoints"):
            check_int(name, getattr(self, name))
        if self.log_internals is not None:
            check_int("log_internals", self.log_internals)
        check_bool("pmap", self.pmap)
        if self.mesh is not None and self.pmap:
            raise BadValue("give a mesh or pmap, not both")
        _ = self.profile_steps  # checks the format

    @property
    def profile_steps(self) -> tuple[int, int] | None:
        """`profile` "START:STOP" as (START, STOP): trace from after step START until
        step STOP is done; None without a profile."""
        if self.profile is None:
            return None
        start, _, stop = str(self.profile).partition(":")
        if not (start.strip().isdigit() and stop.strip().isdigit()):
            raise BadValue(f"profile must be START:STOP (steps, e.g. 10:12), got {self.profile!r}")
        if not int(start) < int(stop):
            raise BadValue(
                f"profile {self.profile!r} is an empty or reversed range: give START < STOP"
            )
        return int(start), int(stop)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What to train on and how (the model itself is a TransformerConfig), in four groups:
    `data`, `optim`, `eval` and `runtime`. Each option has one flat name everywhere (CLI,
    sweep specs, config.json, `to_dict()`); `RunConfig.from_options(task="sort", steps=60)`
    builds one from flat names, filling in dependent defaults.
    """

    data: DataOptions
    optim: OptimOptions = dataclasses.field(default_factory=OptimOptions)
    eval: EvalOptions = dataclasses.field(default_factory=EvalOptions)
    runtime: RuntimeOptions

    def __post_init__(self):
        k, kept = self.eval.average_checkpoints, self.runtime.keep_checkpoints
        if k > kept:
            raise BadValue(
                f"average_checkpoints={k} needs keep_checkpoints >= {k}, got keep_checkpoints={kept}"
            )
        steps, every = self.optim.steps, self.runtime.checkpoint_every
        saved = math.ceil(steps / every)  # every checkpoint_every, and the last
        if k > saved:
            raise BadValue(
                f"average_checkpoints={k} but steps={steps} with checkpoint_every={every} "
                f"saves {saved} checkpoint(s)"
            )
        tokens = self.data.batch_tokens
        if tokens and (self.optim.accum_steps > 1 or self.runtime.mesh or self.runtime.pmap):
            raise BadValue(
                f"batch_tokens={tokens} makes batches of varying rows, which accum_steps, a "
                "mesh and pmap cannot split: use batch_size with them"
            )
        profile = self.runtime.profile_steps
        if profile and profile[1] > steps:
            raise BadValue(
                f"profile {self.runtime.profile!r} goes past steps={steps}: give STOP <= steps"
            )

    @classmethod
    def groups(cls) -> dict[str, type]:
        """Each group's attribute and class: {"data": DataOptions, "optim": OptimOptions, ...}."""
        return typing.get_type_hints(cls)

    @classmethod
    def options(cls) -> dict[str, str]:
        """Each option's flat name and the group that holds it: {"task": "data", ...}."""
        return {f.name: g for g, kind in cls.groups().items() for f in dataclasses.fields(kind)}

    @classmethod
    def from_options(cls, **options) -> RunConfig:
        """The run of flat options (steps=100, out="runs/x", ...), each sent to its group.
        Unset or None, task and tokenizer default by the other data options (see
        DataOptions.from_options) and out is runs/<the data's name>. An unknown name is an
        error naming the closest option."""
        where = cls.options()
        for name in options:
            if name not in where:
                close = difflib.get_close_matches(name, where, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"the options are {list(where)}"
                raise BadValue(f"unknown run option {name!r}; {hint}")
        groups = {g: {n: v for n, v in options.items() if where[n] == g} for g in cls.groups()}
        data = DataOptions.from_options(**groups["data"])
        if groups["runtime"].get("out") is None:
            groups["runtime"]["out"] = f"runs/{data.name}"
        return cls(
            data=data,
            optim=OptimOptions(**groups["optim"]),
            eval=EvalOptions(**groups["eval"]),
            runtime=RuntimeOptions(**groups["runtime"]),
        )

    def resume_settings(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpoint to continue exactly:
        the options marked `resume`.

        `steps` may grow on resume, except with the cosine schedule, whose shape depends
        on the total number of steps.
        """
        settings = {
            f.name: getattr(getattr(self, group), f.name)
            for group, kind in self.groups().items()
            for f in dataclasses.fields(kind)
            if f.metadata["resume"]
        }
        settings = without_added_defaults(settings)
        cosine = self.optim.schedule == "cosine"
        settings["cosine_total_steps"] = self.optim.steps if cosine else None
        return settings

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name: {"task": "dates", ..., "steps": 1500, ...}."""
        groups = [dataclasses.asdict(getattr(self, g)) for g in self.groups()]
        return {name: value for group in groups for name, value in group.items()}


# Run options added after runs recorded their settings (a checkpoint's meta, a sweep's
# config hash): recorded only when set away from their default, so earlier runs still match.
ADDED_RUN_OPTIONS = (
    "shared_lengths",
    "batch_tokens",
    "data_shards",
    "val_shards",
    "eot_id",
    "pack",
)


def without_added_defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (flat run options) less the ADDED_RUN_OPTIONS at their defaults."""
    added = with_added_defaults({})
    return {k: v for k, v in fields.items() if k not in added or v != added[k]}


def with_added_defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` (flat run options, as an earlier run recorded them) with the defaults of
    the ADDED_RUN_OPTIONS it lacks."""
    defaults = {f.name: f.default for f in dataclasses.fields(DataOptions)}
    return {name: defaults[name] for name in ADDED_RUN_OPTIONS} | fields


RUN_SECTIONS = ("model", "run")  # a run file's


def load_run(
    file: str | pathlib.Path | dict | None = None,
    *,
    model: dict | None = None,
    run: dict | None = None,
) -> tuple[TransformerConfig, RunConfig]:
    """The model and run configuration of a run file, with `model` fields and `run` options
    given over the file's: the one place presets and defaults are resolved.

    A run file (YAML or JSON; or its mapping) has two sections, each optional:

        model: {preset: paper_base, dropout_rate: 0.3}  # a preset (default tiny), its fields
        run: {dataset: wyc-web, steps: 2000}             # RunConfig options, by flat name

    the shape of a run folder's config.json. A file of TransformerConfig fields alone is read
    as its `model` section. An unknown key is an error naming the valid ones.
    """
    where = "" if file is None or isinstance(file, dict) else f"{file}: "
    sections = _run_sections(load_config_file(str(file)) if where else dict(file or {}), where)
    fields = sections["model"] | (model or {})
    preset = fields.pop("preset", "tiny")
    try:
        check_choice("preset", preset, PRESETS)
        config = getattr(TransformerConfig, preset)(ByteTokenizer.vocab_size).replace(**fields)
        options = RunConfig.from_options(**(sections["run"] | (run or {})))
    except InputError as e:
        if any(re.search(rf"\b{name}\b", str(e)) for name in [*(model or {}), *(run or {})]):
            raise  # a value given over the file's: the error is not the file's
        raise type(e)(f"{where}{e}") from None
    return config, options


def _run_sections(fields: dict, where: str) -> dict[str, dict]:
    """The `model` and `run` sections of a run file's mapping, their keys checked."""
    if not set(fields) & set(RUN_SECTIONS):  # a model file
        fields = {"model": fields}
    extra = sorted(set(fields) - set(RUN_SECTIONS))
    if extra:
        raise BadValue(
            f"{where}unknown key(s) {extra} beside model and run: a run file holds model "
            "(a preset and TransformerConfig fields) and run (RunConfig options)"
        )
    valid = {
        "model": ["preset", *(f.name for f in dataclasses.fields(TransformerConfig))],
        "run": list(RunConfig.options()),
    }
    sections = {}
    for name in RUN_SECTIONS:
        section = fields.get(name) or {}
        if not isinstance(section, dict):
            raise BadValue(f"{where}{name} must be a mapping of {name} fields, got {section!r}")
        unknown = [key for key in section if key not in valid[name]]
        if unknown:
            other = next(s for s in RUN_SECTIONS if s != name)
            close = difflib.get_close_matches(str(unknown[0]), valid[name], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if unknown[0] in valid[other]:
                hint = f" ({unknown[0]!r} is a {other} key: put it under {other}:)"
            raise BadValue(
                f"{where}unknown {name} key(s) {unknown}{hint}; valid keys are {valid[name]}"
            )
        sections[name] = dict(section)
    return sections
