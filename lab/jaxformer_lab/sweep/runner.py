"""Seeded sweeps: the runner (the spec: `spec`; the report: `report`).

Every (variant, seed) is an ordinary `jaxformer train` run in `<out>/<variant>/seed<k>`,
its resolved configuration written there as a run file (`run.json`), with `command.txt`,
`train.log` and the configuration's hash (`config_hash.json`). With `vmap_seeds` a
variant's seeds at one step train as one vmapped program (`jaxformer train --seeds`); a
group in which a seed diverged runs its seeds again apart. Otherwise every run is its own
process, seed-major, so a drift of the machine's speed does not fall on one variant. A
variant started from a stage waits for that seed's stage run (and fails if it failed).

A run with a summary.json is never rerun; any other resumes from its last checkpoint. A
folder made by another configuration is refused, naming it, unless `rerun_changed`;
`retry_failed` reruns failed and diverged runs. Jobs run as local processes (`jobs` slots,
each pinned to a GPU or a share of the cores) or as Ray tasks (`ray_jobs`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from jaxformer.checkpoints import CHECKPOINTS, Checkpointer
from jaxformer.checks import BadValue
from jaxformer.files import read_json, write_whole
from jaxformer.signals import repeats_dropped, signals_held, stop_signals_raise
from jaxformer.train.seeds import UNVMAPPED
from jaxformer_lab.cores import on_cores, shares
from jaxformer_lab.sweep import report
from jaxformer_lab.sweep.spec import HASH_FILE, Spec, status

# `jaxformer train`'s exit codes after saving on a stop: Ctrl-C, SIGHUP, SIGTERM.
STOPPED = (130, 129, 143)
RUN_FILE = "run.json"  # the run's resolved configuration, which its command trains


def train_command(spec: Spec, variant: str, seed: int) -> list[str]:
    """`jaxformer train --config <folder>/run.json --resume` for one run: its resolved model
    and run configuration written as a run file into its folder (every field given, so
    the command resolves nothing again), and --resume (a fresh folder starts at step 0).
    Its output (to train.log, not a terminal) is a line per tenth of the run, each
    evaluation and the final report."""
    model, run = spec.configs(variant, seed)
    folder = spec.folder(variant, seed)
    folder.mkdir(parents=True, exist_ok=True)
    resolved = {"model": model.to_dict(), "run": run.to_dict()}
    write_whole(folder / RUN_FILE, json.dumps(resolved, indent=2))
    args = ["train", "--config", str(folder / RUN_FILE), "--resume"]
    for source in spec.variant_files:
        args += ["--variants", source]
    return args


def run(
    spec: Spec,
    *,
    jobs: int | None = None,
    rerun_changed: bool = False,
    retry_failed: bool = False,
    vmap_seeds: bool | None = None,
    cluster=None,
    say=print,
) -> dict:
    """Run every pending (variant, seed), a variant's seeds as one program with
    `vmap_seeds` (None: when an NVIDIA GPU is present; on a CPU the vmapped step measured
    slower), else one run at a time, seed-major; `jobs` processes at a time
    (default: one per NVIDIA GPU present, each pinned to its GPU, else 1; on a CPU each
    pinned to its share of the cores: `jaxformer_lab.cores`), then write the report; returns the
    results. Raises ValueError, before any run starts, for a folder
    made by another configuration (unless `rerun_changed`). Ctrl-C, SIGTERM and SIGHUP
    are passed on to the runs in flight; once each has saved its step and exited, it
    raises KeyboardInterrupt (Terminated for SIGTERM and SIGHUP). With a `cluster`
    (`ray_jobs.connect`) each job is a task on it: as many at once as it holds, each with
    the GPUs the cluster gives a run (and a variant's seeds vmapped with any)."""
    todo = [(v, s) for s in spec.seeds for v in spec.runs]
    _clear(spec, _changed(spec, todo, rerun_changed), "its configuration changed", say)
    if retry_failed:
        again = [(v, s) for v, s in todo if status(spec.folder(v, s)) in ("failed", "diverged")]
        _clear(spec, again, "retrying", say)
    _make_folder(spec.out)
    pending = [(v, s) for v, s in todo if status(spec.folder(v, s)) == "pending"]
    why = "a pending variant starts from it, and its checkpoints are gone"
    _clear(spec, _stages_without_checkpoints(spec, pending), why, say)
    pending = [(v, s) for v, s in todo if status(spec.folder(v, s)) == "pending"]
    say(f"sweep {spec.out}: {len(todo)} runs, {len(todo) - len(pending)} already ended")
    if cluster is None:  # (not JAX's backend: initialising it here would hold GPU memory)
        gpus = _gpu_count()
        slots = list(range(jobs or max(1, gpus)))
        pin = len(slots) > 1 and gpus >= len(slots)  # each slot runs on its own GPU
        cores = shares(len(slots)) if not gpus and len(slots) > 1 else None  # or its cores
    else:  # Ray places each task, and gives it its GPUs
        gpus, slots = cluster.accelerators, list(range(jobs or cluster.slots()))
        pin, cores = False, None
    queue = _jobs(spec, pending, gpus > 0 if vmap_seeds is None else vmap_seeds)
    running: dict[int, tuple] = {}
    done = len(todo) - len(pending)
    with stop_signals_raise():
        try:
            while queue or running:
                for variant, seed, why in _after_failed_stages(spec, queue):
                    done += 1
                    say(f"[{done}/{len(todo)}] {variant} seed {seed}: failed: {why}")
                while len(running) < len(slots) and (job := _ready(spec, queue)):
                    slot = next(s for s in slots if s not in running)
                    with signals_held():  # a stop finds every process started in `running`
                        gpu, share = slot if pin else None, cores and cores[slot]
                        proc = _launch(spec, *job, gpu=gpu, cores=share, cluster=cluster)
                        running[slot] = (*job, proc, time.time())
                if queue and not running:  # each waits for a stage run that was interrupted
                    _say_waiting(queue, say)
                    break
                time.sleep(0.2)
                done = _collect(spec, running, queue, done, len(todo), say)
        except KeyboardInterrupt as stop:  # Ctrl-C, and Terminated (SIGTERM, SIGHUP)
            _stop(running, stop)
            _collect(spec, running, queue, done, len(todo), say)
            raise
    return report.write(spec)


def _make_folder(out) -> None:
    """The sweep's folder; one that cannot be made is bad input naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadValue(
            f"cannot make the sweep folder {out} ({e.strerror}); choose another --out"
        ) from None


def _say_waiting(queue: list[tuple], say) -> None:
    for variant, seeds in queue:
        which = f"seed{'s' * (len(seeds) > 1)} {_names(seeds)}"
        say(f"{variant} {which}: not run: its stage run did not end (run the sweep again)")


def _collect(spec: Spec, running: dict, queue: list[tuple], done: int, total: int, say) -> int:
    """Take the jobs whose process ended out of `running`, recording and saying how each
    run ended (a group in which a seed diverged goes back to `queue`, its seeds apart);
    returns `done` counting them."""
    for slot, (variant, seeds, proc, t0) in list(running.items()):
        if proc.poll() is None:
            continue
        del running[slot]
        if proc.returncode == 1 and len(seeds) > 1:  # a seed diverged: find which
            say(f"{variant} seeds {_names(seeds)}: a seed diverged; running them apart")
            queue[:0] = [(variant, (seed,)) for seed in seeds]
            continue
        log = spec.folder(variant, seeds[0]) / "train.log"
        for seed in seeds:
            done += 1
            outcome = _finish(spec.folder(variant, seed), proc.returncode, log)
            say(f"[{done}/{total}] {variant} seed {seed}: {outcome} ({time.time() - t0:.0f} s)")
    return done


def _stop(running: dict, stop: KeyboardInterrupt) -> None:
    """Pass a stop (Ctrl-C's SIGINT, or Terminated's SIGTERM or SIGHUP) on to the runs in
    flight, and wait while each saves its last step and exits; a further stop meanwhile
    is dropped."""
    signum = getattr(stop, "signum", signal.SIGINT)
    with repeats_dropped():
        for *_, proc, _ in running.values():
            proc.send_signal(signum)  # (not to a process that has ended)
        for *_, proc, _ in running.values():
            proc.wait()


def _ready(spec: Spec, queue: list[tuple]) -> tuple | None:
    """The first job in `queue` whose stage runs (if it starts from a stage) are done,
    taken from the queue; None if each waits for one."""
    for i, (variant, seeds) in enumerate(queue):
        stage = spec.stage_of(variant)
        if stage is None or all(status(spec.folder(stage, s)) == "done" for s in seeds):
            return queue.pop(i)
    return None


def _stages_without_checkpoints(spec: Spec, pending: list[tuple[str, int]]) -> list[tuple]:
    """The finished stage runs that a pending variant starts from but that hold no
    checkpoint (a copy of the run's records, say): they must run again first."""
    stages = {(spec.stage_of(v), s) for v, s in pending if spec.stage_of(v) is not None}
    return [
        (stage, seed)
        for stage, seed in sorted(stages)
        if status(spec.folder(stage, seed)) == "done"
        and not (spec.folder(stage, seed) / CHECKPOINTS).is_dir()
    ]


def _after_failed_stages(spec: Spec, queue: list[tuple]) -> list[tuple[str, int, str]]:
    """Take from `queue` the seeds whose stage run failed or diverged, marking each
    failed (a retry reruns it with its stage); returns (variant, seed, why) of each."""
    failed = []
    for i, (variant, seeds) in enumerate(queue):
        stage = spec.stage_of(variant)
        states = {s: status(spec.folder(stage, s)) if stage else "done" for s in seeds}
        for seed in [s for s in seeds if states[s] in ("failed", "diverged")]:
            why = f"its stage {stage!r} seed {seed} {states[seed]}"
            folder = spec.folder(variant, seed)
            folder.mkdir(parents=True, exist_ok=True)
            write_whole(folder / "failed.json", json.dumps({"returncode": None, "message": why}))
            hashed = {"config_hash": spec.config_hash(variant, seed)}
            write_whole(folder / HASH_FILE, json.dumps(hashed))
            failed.append((variant, seed, why))
        queue[i] = (variant, tuple(s for s in seeds if states[s] not in ("failed", "diverged")))
    queue[:] = [job for job in queue if job[1]]
    return failed


def _jobs(spec: Spec, pending: list[tuple[str, int]], vmap_seeds: bool) -> list[tuple]:
    """The pending runs as (variant, seeds) jobs: with `vmap_seeds`, a variant's seeds
    that are at one step (none started, or all saved at one checkpoint) as one job, in
    the variants' order; else one job per run, in `pending`'s (seed-major) order."""
    groups: dict[tuple, list[int]] = {}
    for variant, seed in pending:
        run = spec.configs(variant, seed)[1]
        kept_apart = [getattr(run.runtime, n) not in (None, False) for n in UNVMAPPED]
        apart = not vmap_seeds or any(kept_apart) or run.data.batch_tokens is not None
        apart = apart or spec.stage_of(variant) is not None  # each seed its own init_from
        key = (variant, seed) if apart else (variant, _latest_step(spec.folder(variant, seed)))
        groups.setdefault(key, []).append(seed)
    return [(key[0], tuple(seeds)) for key, seeds in groups.items()]


def _latest_step(folder) -> int:
    """The step of the folder's latest checkpoint (0 for none)."""
    if not (folder / "checkpoints").is_dir():
        return 0
    return Checkpointer(folder).latest_step() or 0


def _names(seeds) -> str:
    return ", ".join(map(str, seeds))


def _changed(spec: Spec, todo: list[tuple[str, int]], rerun_changed: bool) -> list[tuple[str, int]]:
    """The runs whose folder was made by another configuration (or records none); unless
    `rerun_changed`, the first of them is an error."""
    changed = [
        (v, s)
        for v, s in todo
        if spec.folder(v, s).exists() and spec.recorded_hash(v, s) != spec.config_hash(v, s)
    ]
    if changed and not rerun_changed:
        (variant, seed), more = changed[0], len(changed) - 1
        folder, recorded = spec.folder(variant, seed), spec.recorded_hash(variant, seed)
        what = "was made by another configuration than the spec's"
        if recorded is None:
            what = "holds no config hash (an older sweep's run)"
        others = f" (and {more} other run{'s' * (more > 1)})" if more else ""
        raise BadValue(
            f"{spec.what(variant)} seed {seed}: {folder} {what}{others}; pass --rerun-changed "
            "to run it again (its folder is emptied), or restore the spec, or choose another --out"
        )
    return changed


def _clear(spec: Spec, runs: list[tuple[str, int]], why: str, say) -> None:
    """Empty the folders of `runs`, so they start again from step 0."""
    for variant, seed in runs:
        say(f"{variant} seed {seed}: {why}: emptying {spec.folder(variant, seed)}")
        shutil.rmtree(spec.folder(variant, seed))


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def _launch(
    spec: Spec,
    variant: str,
    seeds: tuple,
    *,
    gpu: int | None,
    cores: set[int] | None = None,
    cluster=None,
) -> subprocess.Popen:
    """One process training `seeds` of `variant` (several: `train --seeds`, in the first
    seed's run file with the variant's folder as --out), on GPU `gpu` or on `cores` only
    if given, or a task on `cluster` (`ray_jobs.RayRun`, used as a process); each seed's
    folder gets its run file, hash and command, the first seed's its output."""
    commands = {seed: train_command(spec, variant, seed) for seed in seeds}  # run files
    for seed in seeds:
        hashed = {"config_hash": spec.config_hash(variant, seed)}
        write_whole(spec.folder(variant, seed) / HASH_FILE, json.dumps(hashed))
    first, args = spec.folder(variant, seeds[0]), commands[seeds[0]]
    if len(seeds) > 1:
        args += [
            "--out",
            str(spec.out / variant),
            "--vmap-seeds",
            "on",
            "--seeds",
            *map(str, seeds),
        ]
    for seed in seeds:
        (spec.folder(variant, seed) / "command.txt").write_text(
            "jaxformer " + " ".join(args) + "\n"
        )
    if cluster is not None:
        return cluster.launch(args, first / "train.log")
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    command = [sys.executable, "-m", "jaxformer", *args]
    with open(first / "train.log", "a") as log, on_cores(cores):
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _finish(folder, returncode: int, log) -> str:
    """Record how a run ended (its process's output in `log`); returns a line for the
    progress output. The command exits 1 when the loss diverged, 2 on bad input (the spec
    was checked, so a bug), with one of STOPPED when stopped by a signal (the run resumes
    next time)."""
    if returncode == 0:
        summary = read_json(folder / "summary.json")
        shown = [
            f"{k} {summary[k]:.4g}"
            for k in ("bleu", "exact_match", "eval_perplexity")
            if k in summary
        ]
        return "done: " + ", ".join(shown)
    if returncode in STOPPED or returncode < 0:
        return "interrupted (resumes next time)"
    last = log.read_text().strip().splitlines()[-1:] or [""]
    name = "diverged" if returncode == 1 else "failed"
    write_whole(folder / f"{name}.json", json.dumps({"returncode": returncode, "message": last[0]}))
    return f"{name}: {last[0]}"
