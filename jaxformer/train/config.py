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

from jaxformer import trackers
from jaxformer.checks import (
    BadValue,
    InputError,
    as_given,
    check_bool,
    check_choice,
    check_divisible,
    check_int,
    check_number,
    named_as_fields,
)
from jaxformer.config import PRESETS, TransformerConfig, load_config_file, lora_targets, setting
from jaxformer.data import registry as datasets
from jaxformer.data.tasks import TASKS
from jaxformer.data.tokenizers import ByteTokenizer
from jaxformer.train.optim import OPTIMIZERS, SCHEDULES, UNDECAYED, check_optimizer

TOKENIZERS = ("byte", "bpe")
SOURCES = ("task", "data_tsv", "data_text", "dataset", "data_shards")  # exactly one per run


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataOptions:
    """What a run trains on: one source (a task, a data file or a dataset), its tokenizer,
    and how its examples are cut and padded."""

    task: str | None = setting(
        None, "a synthetic task; default dates, unless a data file is given", TASKS, resume=True
    )
    data_tsv: str | None = setting(
        None, "a file of source<TAB>target lines (translation)", resume=True
    )
    data_text: str | None = setting(None, "plain text for a decoder-only LM", resume=True)
    dataset: str | None = setting(
        None,
        "a dataset a plugin registers by name (jaxformer.data.registry)",
        resume=True,
    )
    data_shards: str | None = setting(
        None,
        "token shards (llm.c's .bin, `jaxformer prepare`'s) for a decoder-only LM, a glob "
        "('DIR/train_*.bin'); the tokenizer: theirs (DIR/tokenizer.json), else vocab_size ids",
        resume=True,
    )
    val_shards: str | None = setting(None, "their held-out shards ('DIR/val_*.bin')", resume=True)
    eot_id: int | None = setting(
        None, "shards' end-of-text id; default the tokenizer's EOS, else GPT-2's", resume=True
    )
    pack: bool = setting(
        True, "LM rows hold whole documents, best-fit; off: one a row, padded", resume=True
    )
    tokenizer: str = setting(
        dataclasses.MISSING,
        "bytes, or BPE trained on the data file or the dataset's training texts "
        "(default: bpe with --dataset, else byte)",
        TOKENIZERS,
        resume=True,
    )
    init_from: str | None = setting(
        None,
        "fine-tune a trained model, its architecture, weights and tokenizer: a jaxformer "
        "run folder (its averaged or latest checkpoint) or a Hugging Face model folder",
        resume=True,
    )
    bpe_vocab_size: int | None = setting(
        None, "BPE vocabulary; default sized from the data", resume=True
    )
    seq_len: int = setting(128, "tokens per row of packed text (language modelling)", resume=True)
    pad_multiple: int = setting(
        16,
        "translation batches are padded to a multiple of this many tokens: larger means "
        "fewer shapes to compile and more padding",
    )
    shared_lengths: bool = setting(
        False,
        "translation: every seed's batches come in the same order of lengths (each holds "
        "that seed's own pairs), so seeds in one vmapped step (--vmap-seeds on) pad little",
        resume=True,
    )
    batch_tokens: int | None = setting(
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
            named = " and ".join(as_given(n) for n in shard_options)
            raise BadValue(f"{named} go with {as_given('data_shards')}")
        if not self.pack and (self.task or self.data_tsv):
            raise BadValue(
                f"{as_given('pack', False)} lays out language-model rows: give "
                f"{as_given('data_text')}, {as_given('data_shards')} or a text {as_given('dataset')}"
            )
        if self.data_shards and self.tokenizer == "bpe":
            raise BadValue(
                f"token shards are tokenized: their tokenizer.json is the tokenizer; leave "
                f"{as_given('tokenizer')} unset"
            )
        if self.tokenizer == "bpe" and self.task:
            raise BadValue(
                f"the BPE tokenizer is trained on data; use it with {as_given('data_tsv')}, "
                f"{as_given('data_text')} or {as_given('dataset')}"
            )
        if self.bpe_vocab_size is not None:
            check_int("bpe_vocab_size", self.bpe_vocab_size, minimum=300)
        check_int("seq_len", self.seq_len)
        check_int("pad_multiple", self.pad_multiple)
        if self.batch_tokens is not None:
            check_int("batch_tokens", self.batch_tokens)
            if self.task or self.data_text:
                raise BadValue(
                    f"{as_given('batch_tokens')} batches translation pairs: give "
                    f"{as_given('data_tsv')} or a translation {as_given('dataset')}"
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
            raise BadValue(
                f"a model given by {as_given('init_from')} brings its tokenizer; leave "
                f"{as_given('tokenizer')} unset"
            )
        if init_from is not None and given.get("bpe_vocab_size") is not None:
            raise BadValue(
                f"a model given by {as_given('init_from')} brings its tokenizer; leave "
                f"{as_given('bpe_vocab_size')} unset"
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

    steps: int = setting(1500, "optimizer steps")
    batch_size: int = setting(64, "examples (rows) per step", resume=True)
    accum_steps: int = setting(1, "micro-batches per step (gradient accumulation)", resume=True)
    schedule: str = setting(
        "cosine", "learning-rate schedule; paper: eq. (3)", SCHEDULES, resume=True
    )
    lr: float | None = setting(
        None, "peak lr, default 3e-3 (paper schedule: a multiplier, default 1)", resume=True
    )
    warmup_steps: int | None = setting(
        None, "default: 10% of steps (cosine), 4000 (paper)", resume=True
    )
    optimizer: str = setting(
        "adam",
        "adam (Adam(0.9, 0.98, 1e-9) as the paper), adamw, muon, schedule_free_adamw, or "
        "a registered optimizer (jaxformer.train.OPTIMIZERS)",
        resume=True,
    )
    weight_decay: float = setting(
        0.0, "decoupled weight decay, times the lr (adamw, muon, schedule-free)", resume=True
    )
    muon_lr_scale: float | None = setting(
        None, "muon: the layers' matrices' lr over the schedule's (default 10)", resume=True
    )
    adam_lr_scale: float | None = setting(
        None,
        "muon: the other parameters' (AdamW's) lr over the schedule's (default 1)",
        resume=True,
    )
    clip_norm: float | None = setting(
        1.0, "global gradient-norm clipping; none to turn off", resume=True
    )
    lora_rank: int | None = setting(None, "train rank-R LoRA adapters, W frozen", resume=True)
    lora_alpha: float | None = setting(None, "LoRA: W + alpha/rank A B (default r)", resume=True)
    lora_targets: str | None = setting(None, "LoRA: of q,k,v,o,ff those adapted (q,v)", resume=True)

    def __post_init__(self):
        for name in ("steps", "batch_size", "accum_steps"):
            check_int(name, getattr(self, name))
        check_divisible("batch_size", self.batch_size, "accum_steps", self.accum_steps)
        check_choice("schedule", self.schedule, SCHEDULES)
        if self.warmup_steps is not None:
            check_int("warmup_steps", self.warmup_steps, minimum=0)
        check_optimizer(self.optimizer, self.optimizer_options)
        for name in ("lr", "clip_norm", *self.optimizer_options):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), "(0, inf)")
        check_number("weight_decay", self.weight_decay, "[0, inf)")
        if (
            OPTIMIZERS[self.optimizer].options.get("schedule_free")
            and self.schedule not in UNDECAYED
        ):
            raise BadValue(
                f"{self.optimizer} averages its iterates in place of a decaying schedule: give "
                f"{as_given('schedule', 'warmup_constant')} (or constant), got {self.schedule}"
            )
        lora = [n for n in ("lora_alpha", "lora_targets") if getattr(self, n) is not None]
        if self.lora_rank is None and lora:
            raise BadValue(f"{as_given(lora[0])} needs {as_given('lora_rank')} (LoRA)")
        if self.lora_rank is not None:
            check_int("lora_rank", self.lora_rank)
            lora_targets(self.lora_targets)
            if OPTIMIZERS[self.optimizer].options.get("schedule_free"):
                why = f"{self.optimizer}'s average over frozen weights is not supported"
                raise BadValue(f"{as_given('lora_rank')} trains adapters alone: {why}")
        if self.lora_alpha is not None:
            check_number("lora_alpha", self.lora_alpha, "(0, inf)")

    @property
    def optimizer_options(self) -> dict[str, Any]:
        """The optimizer's own options that are given (muon_lr_scale, adam_lr_scale)."""
        names = ("muon_lr_scale", "adam_lr_scale")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

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

    eval_every: int = setting(250, "steps between held-out evaluations")
    eval_examples: int = setting(
        1000,
        "held-out examples (of a dataset's dev split: a sample, the same for every seed)",
    )
    eval_sample: int = setting(
        200, "of those, decoded greedily at each in-run evaluation; the final model decodes all"
    )
    final_test: bool = setting(
        False, "also score the final model on the dataset's test split: opt-in"
    )
    eval_beam: int | None = setting(
        None, "beam of held-out decoding, 1 = greedy; default 4 (the paper) for BLEU data, else 1"
    )
    eval_alpha: float = setting(0.6, "length penalty of that beam search (the paper: 0.6)")
    average_checkpoints: int = setting(
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

    seed: int = setting(0, "initialisation, dropout and data order", resume=True)
    out: str = setting(dataclasses.MISSING, "run folder; default runs/<task or data file name>")
    log_every: int = setting(10, "steps between logged metrics")
    checkpoint_every: int = setting(500, "steps between checkpoints")
    keep_checkpoints: int = setting(3, "checkpoints kept")
    profile: str | None = setting(
        None, "START:STOP: a jax.profiler trace of steps START+1..STOP in <out>/profile"
    )
    mesh: str | None = setting(
        None, "device mesh, e.g. data=2,fsdp=2,tensor=2 (one size may be -1)"
    )
    pmap: bool = setting(False, "data parallel with jax.pmap over this process's devices")
    log_internals: int | None = setting(
        None, "every N steps log gradient/parameter/update norms, attention entropy, activation RMS"
    )
    tracker: str = setting("jsonl", "where the metrics go: jsonl (always), tensorboard, wandb")
    tracker_group: str | None = setting(None, "the run's W&B group (a sweep: its name)")
    tracker_job: str | None = setting(None, "the run's W&B job type (a sweep: the variant)")

    def __post_init__(self):
        check_int("seed", self.seed, minimum=None)
        for name in ("log_every", "checkpoint_every", "keep_checkpoints"):
            check_int(name, getattr(self, name))
        if self.log_internals is not None:
            check_int("log_internals", self.log_internals)
        check_bool("pmap", self.pmap)
        trackers.names(self.tracker)
        if self.mesh is not None and self.pmap:
            raise BadValue(f"give a {as_given('mesh')} or {as_given('pmap')}, not both")
        _ = self.profile_steps  # checks the format

    @property
    def profile_steps(self) -> tuple[int, int] | None:
        """`profile` "START:STOP" as (START, STOP): trace from after step START until
        step STOP is done; None without a profile."""
        if self.profile is None:
            return None
        start, _, stop = str(self.profile).partition(":")
        if not (start.strip().isdigit() and stop.strip().isdigit()):
            raise BadValue(
                f"{as_given('profile')} must be START:STOP (steps, e.g. 10:12), got {self.profile!r}"
            )
        if not int(start) < int(stop):
            raise BadValue(
                f"{as_given('profile', self.profile)} is an empty or reversed range: give "
                "START < STOP"
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
                f"{as_given('average_checkpoints', k)} needs {as_given('keep_checkpoints')} "
                f">= {k}, got {as_given('keep_checkpoints', kept)}"
            )
        steps, every = self.optim.steps, self.runtime.checkpoint_every
        saved = math.ceil(steps / every)  # every checkpoint_every, and the last
        if k > saved:
            raise BadValue(
                f"{as_given('average_checkpoints', k)} but {as_given('steps', steps)} with "
                f"{as_given('checkpoint_every', every)} saves {saved} checkpoint(s)"
            )
        if k > 1 and OPTIMIZERS[self.optim.optimizer].options.get("schedule_free"):
            raise BadValue(
                f"{as_given('average_checkpoints', k)} averages the trained parameters, and "
                f"{self.optim.optimizer} evaluates its own average: leave "
                f"{as_given('average_checkpoints')} at 1"
            )
        tokens = self.data.batch_tokens
        if tokens and (self.optim.accum_steps > 1 or self.runtime.mesh or self.runtime.pmap):
            raise BadValue(
                f"{as_given('batch_tokens', tokens)} makes batches of varying rows, which "
                f"{as_given('accum_steps')}, a {as_given('mesh')} and {as_given('pmap')} cannot "
                f"split: use {as_given('batch_size')} with them"
            )
        profile = self.runtime.profile_steps
        if profile and profile[1] > steps:
            raise BadValue(
                f"{as_given('profile', self.runtime.profile)} goes past "
                f"{as_given('steps', steps)}: give STOP <= {steps}"
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
        cosine = self.optim.schedule == "cosine"
        settings["cosine_total_steps"] = self.optim.steps if cosine else None
        return settings

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name: {"task": "dates", ..., "steps": 1500, ...}."""
        groups = [dataclasses.asdict(getattr(self, g)) for g in self.groups()]
        return {name: value for group in groups for name, value in group.items()}


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
        run: {data_tsv: pairs.tsv, steps: 2000}          # RunConfig options, by flat name

    the shape of a run folder's config.json. A file of TransformerConfig fields alone is read
    as its `model` section. An unknown key is an error naming the valid ones.
    """
    where = "" if file is None or isinstance(file, dict) else f"{file}: "
    sections = _run_sections(load_config_file(str(file)) if where else dict(file or {}), where)
    fields = sections["model"] | (model or {})
    preset = fields.pop("preset", "tiny")
    given = [*(model or {}), *(run or {})]
    from_file = {*sections["model"], *sections["run"]} - set(given)
    try:
        with named_as_fields(from_file):
            check_choice("preset", preset, PRESETS)
            config = getattr(TransformerConfig, preset)(ByteTokenizer.vocab_size).replace(**fields)
            options = RunConfig.from_options(**(sections["run"] | (run or {})))
    except InputError as e:
        named = (re.escape(as_given(name)) for name in given)
        if any(re.search(rf"(?<![\w-]){name}(?![\w-])", str(e)) for name in named):
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
