"""Seeded sweeps: the spec and the runner.

A spec (YAML or JSON) names a base configuration, variants (each a set of overrides of
RunConfig and TransformerConfig fields) and seeds:

    base: {task: dates, steps: 600, preset: tiny}   # any fields, and `preset`
    variants:
      baseline: {}
      squared_relu: {activation: squared_relu}
    seeds: 3                       # or a list: [0, 1, 2]
    baseline: baseline             # default: the first variant
    variant_files: [experiments/variants/squared_relu.py]  # registrations, if any
    out: runs/sweeps/activations   # default: runs/sweeps/<the spec's file name>

Every (variant, seed) is an ordinary `jaxformer train` run in `<out>/<variant>/seed<k>`
(its command in `command.txt`, its output in `train.log`). A run with a summary.json is
finished and never rerun; any other resumes from its last checkpoint, so a killed sweep
continues where it stopped. A run whose loss diverges is recorded as diverged. Then
`results.json`, `results.md` and `curves.png` compare the variants (see `report`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from jaxformer.checks import BadValue
from jaxformer.config import PRESETS, RunConfig, TransformerConfig, load_config_file
from jaxformer.data.tokenizers import ByteTokenizer
from jaxformer.functional.registry import import_variants
from jaxformer.sweep import report

SPEC_KEYS = ("base", "variants", "seeds", "baseline", "variant_files", "out")
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(TransformerConfig))
RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig))
SWEEP_OWNS = ("seed", "out")  # set by the sweep for each run


@dataclasses.dataclass(frozen=True)
class Spec:
    """A checked sweep spec; `Spec.load(path)` reads one."""

    base: dict
    variants: dict[str, dict]
    seeds: tuple[int, ...]
    baseline: str
    variant_files: tuple[str, ...]
    out: pathlib.Path

    @classmethod
    def load(cls, path: str | pathlib.Path, out: str | None = None) -> Spec:
        fields = load_config_file(str(path))
        unknown = [k for k in fields if k not in SPEC_KEYS]
        if unknown:
            raise BadValue(f"{path}: unknown key {unknown[0]!r}; a spec has {', '.join(SPEC_KEYS)}")
        variants = fields.get("variants")
        if not isinstance(variants, dict) or not variants:
            raise BadValue(f"{path}: variants must be a non-empty mapping: name -> overrides")
        spec = cls(
            base=_mapping(fields.get("base", {}), f"{path}: base"),
            variants={str(k): _mapping(v or {}, f"{path}: variant {k!r}") for k, v in variants.items()},
            seeds=_seeds(fields.get("seeds", 1), path),
            baseline=str(fields.get("baseline", next(iter(variants)))),
            variant_files=tuple(fields.get("variant_files", ())),
            out=pathlib.Path(out or fields.get("out") or pathlib.Path("runs/sweeps") / pathlib.Path(path).stem),
        )  # fmt: skip
        if spec.baseline not in spec.variants:
            raise BadValue(
                f"{path}: baseline {spec.baseline!r} is not one of the variants {list(spec.variants)}"
            )
        import_variants(list(spec.variant_files))
        for name in spec.variants:  # every configuration is checked before any run starts
            spec.configs(name, spec.seeds[0])
        return spec

    def folder(self, variant: str, seed: int) -> pathlib.Path:
        return self.out / variant / f"seed{seed}"

    def configs(self, variant: str, seed: int) -> tuple[TransformerConfig, RunConfig]:
        """The model and run configuration of one run (errors name the variant)."""
        fields = self.base | self.variants[variant]
        where = f"variant {variant!r}"
        for key in fields:
            if key in SWEEP_OWNS:
                raise BadValue(f"{where}: {key!r} is set by the sweep (seeds, out)")
            if key not in MODEL_FIELDS + RUN_FIELDS + ("preset",):
                close = difflib.get_close_matches(key, MODEL_FIELDS + RUN_FIELDS, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise BadValue(
                    f"{where}: unknown field {key!r} (not a TransformerConfig or RunConfig field){hint}"
                )
        preset = fields.get("preset", "tiny")
        if preset not in PRESETS:
            raise BadValue(f"{where}: preset must be one of {PRESETS}, got {preset!r}")
        try:
            model = getattr(TransformerConfig, preset)(ByteTokenizer.vocab_size).replace(
                **{k: v for k, v in fields.items() if k in MODEL_FIELDS}
            )
            run = RunConfig(
                **{k: v for k, v in fields.items() if k in RUN_FIELDS},
                seed=seed,
                out=str(self.folder(variant, seed)),
            )
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        return model, run


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise BadValue(f"{where} must be a mapping of config fields, got {value!r}")
    return dict(value)


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


def train_command(spec: Spec, variant: str, seed: int) -> list[str]:
    """`jaxformer train ...` for one run: the model as a JSON file in the run folder, each
    run field that differs from its default as an option, and --resume (a fresh folder
    starts at step 0)."""
    model, run = spec.configs(variant, seed)
    folder = spec.folder(variant, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.json").write_text(json.dumps(model.to_dict(), indent=2))
    args = ["train", "--config", str(folder / "model.json"), "--resume", "--no-progress"]
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for name in RUN_FIELDS:
        value = getattr(run, name)
        flag = "--" + name.replace("_", "-")
        if value == defaults[name] and name not in SWEEP_OWNS:
            continue  # the command's default (config.json records every field)
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, "none" if value is None else str(value)]
    for source in spec.variant_files:
        args += ["--variants", source]
    return args


def status(folder: pathlib.Path) -> str:
    """ "done", "diverged", "failed" (see its train.log) or "pending"."""
    for name in ("done", "diverged", "failed"):
        if (folder / ("summary.json" if name == "done" else f"{name}.json")).exists():
            return name
    return "pending"


def run(spec: Spec, *, jobs: int | None = None, say=print) -> dict:
    """Run every pending (variant, seed), `jobs` at a time (default: one per NVIDIA GPU
    present, each pinned to its GPU, else 1), then write the report; returns results."""
    spec.out.mkdir(parents=True, exist_ok=True)
    todo = [(v, s) for v in spec.variants for s in spec.seeds]
    pending = [(v, s) for v, s in todo if status(spec.folder(v, s)) == "pending"]
    say(f"sweep {spec.out}: {len(todo)} runs, {len(todo) - len(pending)} already ended")
    gpus = _gpu_count()
    slots = list(range(jobs or max(1, gpus)))
    pin = len(slots) > 1 and gpus >= len(slots)  # each slot runs on its own GPU
    running: dict[int, tuple] = {}
    done = len(todo) - len(pending)
    while pending or running:
        while pending and len(running) < len(slots):
            slot = next(s for s in slots if s not in running)
            variant, seed = pending.pop(0)
            running[slot] = (
                variant,
                seed,
                _launch(spec, variant, seed, gpu=slot if pin else None),
                time.time(),
            )
        time.sleep(0.2)
        for slot, (variant, seed, proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[slot]
            done += 1
            outcome = _finish(spec.folder(variant, seed), proc.returncode)
            say(f"[{done}/{len(todo)}] {variant} seed {seed}: {outcome} ({time.time() - t0:.0f} s)")
    return report.write(spec)


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def _launch(spec: Spec, variant: str, seed: int, *, gpu: int | None) -> subprocess.Popen:
    args = train_command(spec, variant, seed)
    folder = spec.folder(variant, seed)
    command = [sys.executable, "-m", "jaxformer", *args]
    (folder / "command.txt").write_text("jaxformer " + " ".join(args) + "\n")
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    with open(folder / "train.log", "a") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _finish(folder: pathlib.Path, returncode: int) -> str:
    """Record how a run ended; returns a line for the progress output. The command exits
    1 when the loss diverged, 2 on bad input (the spec was checked, so a bug), 130 when
    interrupted (the run resumes next time)."""
    if returncode == 0:
        summary = json.loads((folder / "summary.json").read_text())
        shown = [
            f"{k} {summary[k]:.4g}"
            for k in ("bleu", "exact_match", "eval_perplexity")
            if k in summary
        ]
        return "done: " + ", ".join(shown)
    if returncode == 130 or returncode < 0:
        return "interrupted (resumes next time)"
    last = (folder / "train.log").read_text().strip().splitlines()[-1:] or [""]
    name = "diverged" if returncode == 1 else "failed"
    (folder / f"{name}.json").write_text(json.dumps({"returncode": returncode, "message": last[0]}))
    return f"{name}: {last[0]}"
