"""The lab's commands, added to `jaxformer` as a plugin (`jaxformer_lab.plugin`):

jaxformer sweep sweep.yaml [--jobs 2]      # variants x seeds, with a verdict
jaxformer sweep sweep.yaml --ray auto      # ... each run a task on a Ray cluster
jaxformer train ray --ray auto --hosts 2 -- --out /shared/runs/a ...   # one run, 2 hosts
jaxformer sweep report sweep.yaml --out docs/results/sweep.json   # its tables, as a record
jaxformer sweep report --runs runs/speedrun runs/other --out speedrun.json
jaxformer bench decode --quick             # a benchmark: results/decode.json
jaxformer gpu-report --parts peers         # the GPU tables, in resumable parts
jaxformer compile-check --target tpu:v5e:2x4   # TPU programs compiled with no TPU
jaxformer docs [--check]                   # the docs' results sections from their records
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import signal
import sys

from jaxformer.checks import BadValue, MissingFile, check_int
from jaxformer.cli import VMAP_SEEDS, vmap_seeds_option


def add_commands(sub) -> dict[str, argparse.ArgumentParser]:
    """Add the lab's commands to the `jaxformer` subparsers; each parser by name."""
    commands = {"sweep": _sweep_parser(sub)}
    commands["sweep-report"] = _sweep_report_parser(sub)
    commands["sweep-calibrate"] = _sweep_calibrate_parser(sub)
    commands["train-ray"] = _train_ray_parser(sub)
    commands["bench"], benchmarks = _bench_parser(sub)
    commands["docs"] = _docs_parser(sub)
    commands["gpu-report"] = _gpu_report_parser(sub)
    commands["compile-check"] = _compile_check_parser(sub)
    commands["eval"] = _eval_parser(sub)
    return commands | benchmarks


def run(args) -> int:
    """Run one of the lab's commands (`jaxformer_lab.plugin.COMMANDS`); its exit code."""
    if args.command == "gpu-report":
        return _gpu_report(args)
    return {
        "sweep": _sweep,
        "sweep-report": _sweep_report,
        "sweep-calibrate": _sweep_calibrate,
        "train-ray": _train_ray,
        "bench": _bench,
        "docs": _docs,
        "compile-check": _compile_check,
        "eval": _eval,
    }[args.command](args)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _eval_parser(sub) -> argparse.ArgumentParser:
    about = "score a DecoderLM on lm-evaluation-harness tasks (local files)"
    e = sub.add_parser("eval", help=about, description=about + "; pip install -e 'lab[eval]'")
    e.add_argument("checkpoint", metavar="CHECKPOINT", help="a run folder or Hugging Face folder")
    e.add_argument("--tasks", required=True, metavar="T1,T2", help="task names, comma-separated")
    e.add_argument("--include-path", metavar="DIR", help="a folder of task YAML files")
    e.add_argument("--limit", type=int, metavar="N", help="the first N examples of each task")
    e.add_argument("--batch-size", type=int, default=8, metavar="B", help="rows (default: 8)")
    e.add_argument("--output", metavar="FILE", help="results JSON (default: CHECKPOINT/eval.json)")
    return e


def _eval(args) -> int:
    from jaxformer_lab import lm_eval

    return lm_eval.run(args)


def _compile_check_parser(sub) -> argparse.ArgumentParser:
    from jaxformer_lab import aot

    c = sub.add_parser(
        "compile-check",
        description=aot.__doc__.split("\n\n")[0].replace("\n", " ")
        + " With libtpu (pip install 'jaxformer[tpu]') they are compiled for the named "
        "topology; without it, lowered only.",
    )
    c.add_argument("--target", required=True, metavar="tpu:GEN:TOPOLOGY",
                   help="e.g. tpu:v5e:2x4 (v5e-8), tpu:v5p:2x2x1 (v5p-8), tpu:v6e:2x4")  # fmt: skip
    c.add_argument("--model", default="gpt2_small", metavar="NAME[,NAME...]",
                   help=f"one or more of {', '.join(aot.MODEL_NAMES)}")  # fmt: skip
    c.add_argument("--program", default="all", choices=(*aot.PROGRAMS, "all"))
    c.add_argument("--layout", default="all", choices=(*aot.LAYOUTS, "all"))
    c.add_argument("--batch", type=int, help="global batch (default: the model's per chip x chips)")
    c.add_argument("--length", type=int, help="tokens per row (default: the model's)")
    c.add_argument("--lowered-only", action="store_true", help="lower, do not compile")
    c.add_argument("--pack", action="store_true",
                   help="also compile a decoder's train and eval steps on packed rows (segment "
                   "ids and positions per document), beside the unpacked ones")  # fmt: skip
    c.add_argument("--no-largest-batch", action="store_true",
                   help="skip the search for the largest batch that fits (2-4 more compiles)")  # fmt: skip
    c.add_argument("--out", type=pathlib.Path, metavar="FILE.json",
                   help="also write the table as a results record (jaxformer docs renders it)")  # fmt: skip
    return c


def _docs_parser(sub) -> argparse.ArgumentParser:
    d = sub.add_parser(
        "docs",
        description="Rewrite each results section of the docs pages from the committed file "
        "it names (jaxformer_lab.results): a page shows results/NAME.json between "
        "<!-- results:NAME:start --> and <!-- results:NAME:end --> (NAME may name a "
        "subfolder's record: xla_vs_eager/DIR/record, an XLA-vs-eager report).",
    )
    d.add_argument("--docs", type=pathlib.Path, default=pathlib.Path("docs"), metavar="DIR")
    d.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    return d


def _gpu_report_parser(sub) -> argparse.ArgumentParser:
    from jaxformer_lab import gpu_report

    g = sub.add_parser(
        "gpu-report",
        description=gpu_report.__doc__.split("\n\n")[0],
    )
    gpu_report.add_options(g)
    return g


def _sweep_parser(sub) -> argparse.ArgumentParser:
    w = sub.add_parser(
        "sweep",
        description="Run every (variant, seed) of a sweep spec as a `jaxformer train` run in "
        "its own folder (finished runs are kept, others resume), then write results.md, "
        "results.json and curves.png: mean and 95% CI over seeds, and against the baseline, "
        "seed by seed on dev, the seed-paired t-test and the crossed two-level bootstrap, "
        "both Holm-adjusted over every comparison reported, and a verdict. See "
        "jaxformer_lab.sweep.spec for the spec. `jaxformer sweep report --help`: its tables as a "
        "results file for the docs; `jaxformer sweep calibrate --help`: the verdict rule's "
        "error rates and power by simulation.",
    )
    w.add_argument("spec", metavar="SPEC", help="YAML or JSON: base, variants, seeds, ...")
    w.add_argument("--out", metavar="DIR", help="the sweep's folder (default: the spec's out)")
    w.add_argument(
        "--jobs", type=int, metavar="N", help="runs at once (default: one per GPU, or 1)"
    )
    w.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the spec's base (a YAML value: 3, 0.1, true); repeatable",
    )
    w.add_argument(
        "--rerun-changed",
        action="store_true",
        help="empty and rerun each run whose folder was made by another configuration "
        "(without it the sweep refuses, naming the run)",
    )
    w.add_argument(
        "--retry-failed", action="store_true", help="empty and rerun failed and diverged runs"
    )
    vmap_seeds_option(
        w,
        "on: a variant's seeds as one vmapped program (`train --seeds`); off: each seed "
        "its own process, seed-major; auto (default): on with an NVIDIA GPU, else off",
    )
    _ray_options(w)
    return w


def _ray_options(w) -> None:
    w.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run each job as a task on the Ray cluster at ADDRESS (HOST:PORT of its head, "
        "or auto: the one this machine belongs to; local: a head started here for this "
        "sweep); --jobs: tasks at once (default: as many as the cluster holds)",
    )
    _ray_resource_options(w, "a run")


def _ray_resource_options(w, each: str) -> None:
    w.add_argument("--ray-cpus", type=float, default=1, metavar="N",
                   help=f"CPUs {each} asks the Ray cluster for (default 1)")  # fmt: skip
    w.add_argument("--ray-gpus", type=float, metavar="N",
                   help=f"GPUs {each} asks for (default: 1 on a cluster with GPUs, else 0)")  # fmt: skip
    w.add_argument("--ray-tpus", type=float, metavar="N",
                   help=f"TPU chips {each} asks for (default: a TPU host's, on a cluster with TPUs)")  # fmt: skip
    w.add_argument(
        "--shared-storage",
        action="store_true",
        help="the run folder is on storage every node of the Ray cluster sees (else, "
        "with several nodes, it must be on a network filesystem)",
    )


def _train_ray_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser(
        "train-ray",
        prog="jaxformer train ray",
        description="Train one run as --hosts processes on a Ray cluster, one task a host "
        "(jaxformer_lab.train_ray): each runs `jaxformer train` with the options after -- "
        "(--out DIR among them, on storage every node sees) and its own --coordinator, "
        "--num-processes and --process-id; its output goes to DIR/train.process<I>.log. "
        "Ctrl-C or SIGTERM stops every process, each saving its step.",
    )
    r.add_argument("--ray", required=True, metavar="ADDRESS",
                   help="the Ray cluster: HOST:PORT of its head, auto, or local (a head here)")  # fmt: skip
    r.add_argument("--hosts", type=int, required=True, metavar="N", help="processes, one a host")
    _ray_resource_options(r, "each process")
    r.add_argument("train_args", nargs="*", metavar="-- TRAIN-OPTIONS",
                   help="`jaxformer train` options (--out DIR among them)")  # fmt: skip
    return r


def _bench_parser(sub) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """`jaxformer bench`, and each benchmark's parser as "bench NAME" (options from its
    dataclass)."""
    from jaxformer_lab.bench import BENCHMARKS
    from jaxformer_lab.bench.registry import add_options

    b = sub.add_parser(
        "bench",
        description="Benchmarks (jaxformer_lab.bench): each times through jaxformer_lab.bench.stats "
        "and writes a record (jaxformer_lab.results) to --out, default results/NAME.json, with "
        "the command that reproduces it. `jaxformer bench NAME --help` lists its options.",
    )
    benchmarks = b.add_subparsers(dest="subcommand", required=True, metavar="NAME")
    commands = {}
    for name in sorted(BENCHMARKS.names):
        help = BENCHMARKS[name].help
        n = benchmarks.add_parser(name, help=help, description=help)
        add_options(n, BENCHMARKS[name].options, name)
        commands[f"bench {name}"] = n
    return b, commands


def _sweep_calibrate_parser(sub) -> argparse.ArgumentParser:
    from jaxformer_lab.sweep import stats

    c = sub.add_parser(
        "sweep-calibrate",
        prog="jaxformer sweep calibrate",
        description="The sweep's verdict rule by simulation (jaxformer_lab.sweep.calibration): "
        "how often it calls a variant better or worse when all 4 of a sweep's variants equal "
        "the baseline, and how often it finds a real gain, at 2, 3, 5 and 8 seeds; writes "
        "the table as a results file for the docs.",
    )
    c.add_argument("--repetitions", type=int, default=1000, help="simulated sweeps a cell")
    c.add_argument("--samples", type=int, default=stats.BOOTSTRAP_SAMPLES, help="bootstrap")
    c.add_argument("--out", default="results/verdict_calibration.json", help="the record")
    return c


def _sweep_report_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser(
        "sweep-report",
        prog="jaxformer sweep report",
        description="A results file (jaxformer_lab.results.Record, the docs' format) of a sweep's "
        "tables, recomputed from its run folders (not from a results.json an earlier version "
        "wrote): the figures per variant, the seed-paired differences and the verdicts "
        "(jaxformer_lab.sweep.report); or, with --runs, of single runs of the wyc-web speedrun "
        "compared with the first, the speedrun command's (jaxformer_lab.sweep.runs). Prints a "
        "JSON line: the verdicts, or each run's row.",
    )
    r.add_argument("spec", nargs="?", metavar="SPEC", help="the sweep's spec (YAML or JSON)")
    r.add_argument(
        "--sweep-out",
        metavar="DIR",
        help="the sweep's folder (or its .tar.xz), if not the spec's out",
    )
    r.add_argument(
        "--baseline",
        metavar="NAME",
        help="read the runs against this variant, not the spec's baseline (it joins the "
        "family of readings whose comparisons Holm's adjustment covers)",
    )
    r.add_argument(
        "--comparisons-only",
        action="store_true",
        help="leave out the figures per variant (the differences and verdicts only)",
    )
    r.add_argument("--curves", metavar="PNG", help="also draw the runs' curves to this file")
    r.add_argument(
        "--runs",
        nargs="+",
        type=pathlib.Path,
        metavar="RUN",
        help="run folders (or in a .tar.xz), not a sweep",
    )
    r.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        type=pathlib.Path,
        metavar=("BASE", "RUN"),
        help="with --runs: also compare RUN with BASE (two of the runs); repeatable",
    )
    text = dict(metavar="TEXT")
    r.add_argument(
        "--about", default="", help="what was trained, on what (before the caption)", **text
    )
    r.add_argument("--note", action="append", default=[], help="a note under the tables", **text)
    r.add_argument("--device", help="the machine the runs ran on (default: this one)", **text)
    r.add_argument("--source", help="what the runs were and where they are", **text)
    r.add_argument("--out", required=True, metavar="FILE.json", help="the results file to write")
    return r


def _compile_check(args) -> int:
    from jaxformer_lab import aot, results

    target = aot.parse_target(args.target)
    aot.stand_in_cpus(target.chips)
    models = args.model.split(",")
    for name in models:
        if name not in aot.MODEL_NAMES:
            raise BadValue(f"--model {name!r}: expected one of {', '.join(aot.MODEL_NAMES)}")
        if args.pack and aot.models()[name].config.num_encoder_layers:
            raise BadValue(f"--pack: packed rows are for decoder-only models, not {name}")
    if args.out is not None and not args.out.parent.is_dir():
        raise MissingFile(f"--out {args.out}: no folder {args.out.parent}")
    if args.out is not None:
        results.check_out(args.out)
    for name in ("batch", "length"):
        if getattr(args, name) is not None:
            check_int(f"--{name}", getattr(args, name))
    programs = aot.PROGRAMS if args.program == "all" else (args.program,)
    layouts = aot.LAYOUTS if args.layout == "all" else (args.layout,)
    reports = []
    for model in models:
        for program in programs:
            steps = program in ("train", "eval")
            packings = (False, True) if args.pack and steps else (False,)
            for layout, packed in itertools.product(layouts if steps else ("fsdp",), packings):
                _progress(
                    f"compiling {model} {program}{', packed' * packed} ({layout}) for {target.name}"
                )
                reports.append(
                    aot.check(
                        model,
                        target,
                        program=program,
                        layout=layout,
                        batch=args.batch,
                        length=args.length,
                        lowered_only=args.lowered_only,
                        find_largest_batch=not args.no_largest_batch,
                        packed=packed,
                    )  # fmt: skip
                )
    table = aot.results_table(reports)
    print("\n".join(table.markdown()).rstrip())
    if args.out is not None:
        record = results.capture(
            [table], data={"reports": [dataclasses.asdict(r) for r in reports]}
        )
        record.device = f"{target.name}, {table.caption.split(', ', 1)[1][:-1]}; on {record.device}"
        record.write(args.out)
    return 0


def _docs(args) -> int:
    from jaxformer_lab.results import render_pages

    if not args.docs.is_dir():
        raise MissingFile(f"--docs {args.docs}: no such folder")
    changed = render_pages(args.docs, write=not args.check)
    for page in changed:
        print(f"{'differs' if args.check else 'updated'}: {page}")
    return 1 if args.check and changed else 0


def _gpu_report(args) -> int:
    from jaxformer_lab import gpu_report, stops
    from jaxformer_lab.results import command_line

    def report() -> int:
        gpu_report.run(args)
        return 0

    rerun = f"finished parts are kept: rerun `{command_line()}` to continue"
    return stops.stoppable("jaxformer gpu-report", report, rerun)


def _bench(args) -> int:
    from jaxformer_lab import stops
    from jaxformer_lab.bench import BENCHMARKS, registry

    options = registry.options_from(args, BENCHMARKS[args.subcommand].options)
    where = f"jaxformer bench {args.subcommand}"

    def bench() -> int:
        try:
            registry.run(args.subcommand, options)
        except registry.Stopped as e:
            print(f"{where}: {e}", file=sys.stderr)
            return e.code
        return 0

    rerun = f"no record written: rerun `{registry.command(args.subcommand, options)}`"
    return stops.stoppable(where, bench, rerun)


def _sweep(args) -> int:
    from jaxformer.signals import Terminated
    from jaxformer_lab import results, sweep

    if args.jobs is not None and args.jobs < 1:
        raise BadValue(f"--jobs must be >= 1, got {args.jobs}")
    spec = sweep.Spec.load(args.spec, out=args.out, overrides=tuple(args.set))
    cluster = _ray_cluster(args, spec)
    try:
        sweep.run(
            spec,
            jobs=args.jobs,
            rerun_changed=args.rerun_changed,
            retry_failed=args.retry_failed,
            vmap_seeds=VMAP_SEEDS[args.vmap_seeds],
            cluster=cluster,
        )
    except KeyboardInterrupt as stop:  # and Terminated: SIGTERM, SIGHUP
        why = f"terminated by {stop}" if isinstance(stop, Terminated) else "interrupted"
        print(
            f"jaxformer sweep: {why}: the runs in flight were stopped, each saving its step "
            f"(above); continue with {results.command_line()}",
            file=sys.stderr,
        )
        return 128 + stop.signum if isinstance(stop, Terminated) else 130
    finally:
        if cluster is not None:
            cluster.close()
    print((spec.out / "results.md").read_text())
    print(f"results in {spec.out}/: results.md results.json curves.png")
    return 0


def _ray_cluster(args, spec):
    """The Ray cluster of --ray, checked against the runs' needs and the sweep's folder
    (None without --ray)."""
    if args.ray is None:
        options = {
            "--ray-cpus": args.ray_cpus != 1,
            "--ray-gpus": args.ray_gpus is not None,
            "--ray-tpus": args.ray_tpus is not None,
            "--shared-storage": args.shared_storage,
        }
        if given := [option for option, used in options.items() if used]:
            raise BadValue(f"{', '.join(given)} ask(s) for a Ray cluster: give --ray ADDRESS")
        return None
    from jaxformer_lab.sweep import ray_jobs

    _check_ray_resources(args)
    cluster = ray_jobs.connect(args.ray, cpus=args.ray_cpus, gpus=args.ray_gpus, tpus=args.ray_tpus)
    try:
        cluster.check(spec.out, shared_storage=args.shared_storage)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _check_ray_resources(args) -> None:
    if args.ray_cpus <= 0 or (args.ray_gpus or 0) < 0 or (args.ray_tpus or 0) < 0:
        raise BadValue("--ray-cpus must be > 0, and --ray-gpus and --ray-tpus >= 0")


def _train_ray(args) -> int:
    """One run over --hosts processes on the Ray cluster: checked (one line, exit 2, before
    any folder is made), placed, started, waited for; stopped, each process saves."""
    from jaxformer_lab import ray_cluster, train_ray

    check_int("--hosts", args.hosts)
    _check_ray_resources(args)
    out = train_ray.run_folder(args.train_args)
    ray = ray_cluster.join(args.ray)
    try:
        needs = ray_cluster.run_needs(ray, args.ray_cpus, args.ray_gpus, args.ray_tpus)
        nodes = ray_cluster.live_nodes(ray)
        how = train_ray.strategy(nodes, args.hosts, needs, args.ray)
        # packed processes still land on a node Ray picks, not always this one
        ray_cluster.check_storage(out, len(nodes), args.shared_storage)
        group = train_ray.place(ray, args.hosts, needs, how)
        out.mkdir(parents=True, exist_ok=True)
        return _train_on_ray(args, ray, group, needs, out)
    finally:
        ray.shutdown()


def _train_on_ray(args, ray, group, needs: dict, out: pathlib.Path) -> int:
    from jaxformer.files import command_line
    from jaxformer.signals import (
        Terminated,
        repeats_dropped,
        signals_held,
        stop_signals_raise,
    )
    from jaxformer_lab import train_ray

    where, refs = "jaxformer train ray", []
    try:
        with stop_signals_raise():
            with signals_held():  # a stop while they start is raised once refs holds them
                address, refs = train_ray.launch(
                    ray, group, args.hosts, needs, args.train_args, out
                )
            logs = out / train_ray.LOG.format("<I>")
            _progress(f"{where}: {args.hosts} process(es), coordinator {address}; output in {logs}")
            ended = train_ray.wait(ray, refs, out)
    except KeyboardInterrupt as stop:  # and Terminated: SIGTERM, SIGHUP
        with repeats_dropped():
            train_ray.stop(ray, refs, out, getattr(stop, "signum", signal.SIGINT))
        why = f"terminated by {stop}" if isinstance(stop, Terminated) else "interrupted"
        again = command_line() + ("" if "--resume" in args.train_args else " --resume")
        _progress(
            f"{where}: {why}: every process was stopped, saving its step; continue with {again}"
        )
        return 128 + stop.signum if isinstance(stop, Terminated) else 130
    failed = [(i, code) for i, code in ended if code]
    if not failed:
        return 0
    i, code = failed[0]  # the first to fail; the others were stopped
    others = " (the others were stopped)" if len(ended) > 1 else ""
    _progress(
        f"{where}: process {i} exited with {code}{others}: see {out / train_ray.LOG.format(i)}"
    )
    return code if code > 0 else 1


def _sweep_report(args) -> int:
    import json

    from jaxformer_lab import results

    _check_report_options(args)
    results.check_out(args.out)
    record, line = _report_runs(args) if args.runs else _report_sweep(args)
    given = {"device": args.device, "source": args.source}
    record = dataclasses.replace(record, **{k: v for k, v in given.items() if v is not None})
    record.write(args.out)
    print(json.dumps(line | {"out": args.out}))
    return 0


def _sweep_calibrate(args) -> int:
    import json

    from jaxformer_lab import results
    from jaxformer_lab.sweep import calibration

    check_int("--repetitions", args.repetitions)
    check_int("--samples", args.samples)
    results.check_out(args.out)
    record = calibration.record(args.repetitions, args.samples, say=_progress)
    record.write(args.out)
    print(json.dumps({"out": args.out, "rows": record.tables[0].rows}))
    return 0


def _check_report_options(args) -> None:
    """A sweep's SPEC or --runs, and only the options that read it."""
    if (args.spec is None) == (args.runs is None):
        raise BadValue("give a sweep's SPEC or --runs RUN..., one of them")
    spec_only = ("--sweep-out", "--baseline", "--comparisons-only", "--curves")
    given = [f for f in spec_only if getattr(args, f[2:].replace("-", "_")) not in (None, False)]
    if args.runs and given:
        raise BadValue(f"{', '.join(given)} read(s) a sweep: give its SPEC, not --runs")
    if args.spec and args.pair:
        raise BadValue("--pair compares two of --runs; a sweep's runs are paired by seed")


def _report_runs(args) -> tuple:
    """The speedrun runs' record, and each run's row."""
    from jaxformer_lab import records
    from jaxformer_lab.sweep import runs

    folders = [records.tree(f) for f in args.runs]  # a folder, or in its archive
    pairs = [tuple(records.tree(f) for f in pair) for pair in args.pair]
    record = runs.record(folders, pairs, about=args.about, notes=tuple(args.note))
    return record, {str(f): row for f, row in zip(args.runs, record.tables[0].rows, strict=True)}


def _report_sweep(args) -> tuple:
    """The sweep's record (and its curves, with --curves), and its verdicts."""
    from jaxformer_lab import records, sweep

    spec = sweep.Spec.load(args.spec, out=args.sweep_out)
    spec = dataclasses.replace(spec, out=records.tree(spec.out))  # or in its archive
    record, results = sweep.report.record(
        spec,
        f"jaxformer sweep {args.spec}",
        baseline=args.baseline,
        comparisons_only=args.comparisons_only,
        about=args.about,
        notes=tuple(args.note),
    )
    if args.curves:
        sweep.report.curves(spec, pathlib.Path(args.curves))
    return record, {"sweep": str(spec.out), "verdicts": sweep.report.verdicts(results)}
