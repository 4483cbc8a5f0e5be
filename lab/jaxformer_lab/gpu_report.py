"""`jaxformer gpu-report`: the GPU tables as parts (configs/gpu_report.yaml: each part's
commands and budget, in priority order), resumable across calls so that a series of short
GPU sessions completes them (`jaxformer_lab.parts`).

A part runs as subprocesses under its budget; one that runs over is killed with its process
group and marked "timed out", and what it wrote stays. A finished part (ok, some failed,
failed, timed out) is skipped by later calls unless --force; one whose call was killed
stays "running" and reruns. Each part writes to --out/<part>/, the status of every part
and call to --out/summary.json, and the tables of all finished parts to
--out/gpu_tables.md. `--dry-run` (a CPU, seconds) only checks that every part starts and
that every benchmark's options parse. A machine whose JAX sees no GPU is refused.

It runs from a checkout (configs/ and tests/ beside the package). Installing it on a GPU
machine without network, from wheels: docs/performance.md ("The GPU report in parts").
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import yaml

from jaxformer.checks import BadValue, MissingFile
from jaxformer.files import write_whole
from jaxformer.signals import stop_signals_raise
from jaxformer_lab import results, stops
from jaxformer_lab.bench import plan
from jaxformer_lab.markdown import table
from jaxformer_lab.parts import Clock, run_parts

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout: configs/, docs/results/
CONFIG = ROOT / "configs/gpu_report.yaml"
PY = sys.executable
MAX_PART_S = 240  # a part's budget, compile included: several fit one short GPU session
LM_BATCHES = (16, 32, 64)
LM_REMATS = ("none", "dots", "full")
BENCH = [PY, "-m", "jaxformer", "bench"]


@dataclasses.dataclass
class Part:
    """A named list of commands run in order within `budget_s` seconds."""

    name: str
    budget_s: float
    commands: list[list[str]]
    dry: list[str]  # a command that shows the part starts (seconds on a CPU)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    keep_going: bool = False  # run the next command after one fails


def config() -> list[dict]:
    """configs/gpu_report.yaml's parts, in priority order (options as strings)."""
    if not CONFIG.is_file():
        raise MissingFile(f"{CONFIG}: not found (gpu-report runs from a checkout)")
    parts = yaml.safe_load(CONFIG.read_text())["parts"]
    return [p | {"options": [str(o) for o in p.get("options", [])]} for p in parts]


def gpu_tests() -> dict[str, list[str]]:
    """The test parts' paths by part: `make test-gpu`'s subset."""
    return {p["name"]: p["tests"] for p in config() if "tests" in p}


def attention_names() -> list[str]:
    """ "auto", then every kernel registered in jaxformer's ATTENTION (read at run time),
    jaxformer's own before tokamax's."""
    from jaxformer.functional import ATTENTION

    return ["auto", *sorted(ATTENTION.names, key=lambda name: name.startswith("tokamax"))]


def lm_runs() -> dict[str, list[tuple[str, int, str, str]]]:
    """lm-throughput's runs (attention, batch, remat, head) by kind, most informative first."""
    return {
        "kernels": [(a, 32, "none", "auto") for a in attention_names()],
        "heads": [("auto", 32, "none", h) for h in ("dense", "chunked")]
        + [("auto", b, "none", "auto") for b in LM_BATCHES if b != 32],
        "remat": [("auto", b, r, "auto") for b in LM_BATCHES for r in LM_REMATS[1:]],
    }


def lm_throughput_argv(run: tuple[str, int, str, str], out: pathlib.Path) -> list[str]:
    """lm-throughput's options for one run, its record out/<attention-bBATCH-remat-head>.json."""
    attention, batch, remat, head = run
    name = f"{attention}-b{batch}-{remat}-{head}"
    return [
        *("--attention", attention, "--batch", str(batch), "--remat", remat),
        *("--lm-head", head, "--steps", "10", "--out", str(out / f"{name}.json")),
    ]


def parts(out: pathlib.Path, jobs: int) -> list[Part]:
    """Every part of configs/gpu_report.yaml in its order, with its budget in seconds."""
    made = []
    for p in config():
        if "bench" in p:
            record = ["--out", str(out / p["name"] / f"{p['bench']}.json")]
            command = [*BENCH, p["bench"], *p["options"], *record]
            made.append(Part(p["name"], p["budget_s"], [command], [*BENCH, p["bench"], "--help"]))
        elif "tests" in p:
            made.append(_test_part(p["name"], p["budget_s"], p["tests"]))
        elif "lm" in p:
            made.append(_lm_part(p["name"], p["budget_s"], lm_runs()[p["lm"]], out))
        elif p.get("lab") == "quick":
            made.append(_lab_part(p["name"], ["--quick"], plan.GPU_QUICK, out / p["name"]))
        elif p.get("lab") == "full":
            made += _lab_full_parts(p["name"], out / p["name"])
        else:
            made.append(_sweep_part(p, out, jobs))
    return made


def _sweep_part(p: dict, out: pathlib.Path, jobs: int) -> Part:
    """A sweep, its runs sharing the GPU (`jobs` at once), each run's train.log naming every
    program it compiles and the seconds it took (Table 3's first GPU part spent minutes
    starting and evaluating against seconds training: the log says which programs)."""
    sweep = [PY, "-m", "jaxformer", "sweep"]
    command = [*sweep, str(ROOT / p["sweep"]), "--jobs", str(jobs), *p["options"]]
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / jobs:.2f}", "JAX_LOG_COMPILES": "1"}
    return Part(
        p["name"],
        p["budget_s"],
        [[*command, "--out", str(out / p["name"])]],
        [*sweep, "--help"],
        env,
    )


LAB = [*BENCH, "xla-vs-eager", "--target", "gpu", "--allow-load"]


def _lab_part(name: str, options: list[str], profile, out: pathlib.Path, parts=None) -> Part:
    """The XLA-vs-eager lab's `parts` of `profile` (all: None) as one part: its budget the
    lab's budgets plus its start; the lab stops itself, writing what it measured, at that
    budget less its start (--time-limit). On a busy host its figures are marked, not lost."""
    parts = parts or profile.part_names()
    budget = sum(profile.budgets[p] for p in parts) + plan.STARTUP_S
    limit = ["--time-limit", str(budget - plan.STARTUP_S)]
    chosen = ["--parts", *parts] if parts != profile.part_names() else []
    command = [*LAB, *options, *chosen, *limit, "--out", str(out)]
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # JAX and torch share the GPU
    return Part(name, budget, [command], [*LAB, "--help"], env)


def lab_full_groups() -> list[list[str]]:
    """The lab's full GPU plan cut, in order, into groups whose budgets with the lab's
    start fit MAX_PART_S."""
    groups, room = [], MAX_PART_S - plan.STARTUP_S
    for name in plan.GPU_FULL.part_names():
        if (
            groups
            and sum(plan.GPU_FULL.budgets[p] for p in groups[-1]) + plan.GPU_FULL.budgets[name]
            <= room
        ):
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def _lab_full_parts(name: str, out: pathlib.Path) -> list[Part]:
    """The full plan's groups as parts NAME_1 ... NAME_N, resuming in one folder."""
    return [
        _lab_part(f"{name}_{i}", [], plan.GPU_FULL, out, group)
        for i, group in enumerate(lab_full_groups(), 1)
    ]


def _test_part(name: str, budget_s: float, paths: list[str]) -> Part:
    """pytest on `paths` (the dry run checks they exist), with pytest-xdist's 8 workers
    sharing the GPU where it is installed (as on the H200)."""
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
    env = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    pytest = [PY, "-m", "pytest", "-q", "-m", "not slow", *workers]
    return Part(name, budget_s, [pytest + paths], [PY, "-m", "pytest", "--version"], env)


def _lm_part(name: str, budget_s: float, runs: list, out: pathlib.Path) -> Part:
    """One lm-throughput process per run; one may fail alone."""
    commands = [
        [*BENCH, "lm-throughput", *lm_throughput_argv(r, out / "lm_throughput")] for r in runs
    ]
    return Part(name, budget_s, commands, [*BENCH, "lm-throughput", "--help"], keep_going=True)


def child_env() -> dict[str, str]:
    """The environment of a part's commands: the checkout's library and lab importable, and
    the lab's plugin loaded, installed or not."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "lab"), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "JAXFORMER_PLUGINS": "jaxformer_lab.plugin"}


def run_part(part: Part, out: pathlib.Path, budget_s: float) -> dict:
    """Run the part's commands in order until one fails (unless keep_going) or the budget
    is spent: status ok, some failed, failed (exit N) or timed out."""
    folder = out / part.name
    folder.mkdir(parents=True, exist_ok=True)
    env = child_env()
    env |= part.env
    started, runs, status = time.perf_counter(), [], "ok"
    for i, cmd in enumerate(part.commands):
        left = budget_s - (time.perf_counter() - started)
        if left < 5:
            status = "timed out"
            runs += [dict(command=shlex.join(c), status="skipped") for c in part.commands[i:]]
            break
        t0 = time.perf_counter()
        with open(folder / f"log{i}.txt", "w") as log:
            outcome = _run(cmd, env, log, left)
        runs.append(dict(command=shlex.join(cmd), status=outcome, wall_s=time.perf_counter() - t0))
        if outcome == "timed out" or (outcome != "ok" and not part.keep_going):
            status = outcome
            break
    if any(r["status"] != "ok" for r in runs) and status == "ok":
        status = "some failed"
    return dict(status=status, wall_s=round(time.perf_counter() - started, 1), runs=runs)


def _run(cmd: list[str], env: dict, log, timeout: float) -> str:
    """Run cmd in its own process group, all of which is killed if it runs past timeout
    (Table 3's sweep and the peers' benchmark start processes of their own)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out"
    finally:  # also when this process is stopped (SIGTERM, SIGHUP: Terminated)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return "ok" if rc == 0 else f"failed (exit {rc})"


def dry_run_part(part: Part) -> dict:
    """Start the part's `dry` command; 'started' if it exits 0."""
    t0 = time.perf_counter()
    env = child_env()
    proc = subprocess.run(part.dry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    status = "started" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-300:]}"
    return dict(
        status=status, wall_s=round(time.perf_counter() - t0, 1), command=shlex.join(part.dry)
    )


def dry_run(chosen: list[Part], out: pathlib.Path) -> dict:
    """Every chosen part's dry command, after checking that every benchmark command's
    options are valid (raises, naming the option, if not) and the test paths exist."""
    for command in (c for p in chosen for c in p.commands if c[: len(BENCH)] == BENCH):
        check_bench(command[len(BENCH) :])
    missing = [t for paths in gpu_tests().values() for t in paths if not (ROOT / t).exists()]
    if missing:
        raise MissingFile(f"{CONFIG.name} names missing test paths {missing}")
    pool = ThreadPoolExecutor(4)
    try:
        return dict(zip([p.name for p in chosen], pool.map(dry_run_part, chosen), strict=True))
    except BaseException:  # a stop: end the parts' processes, so that their threads return
        stops.end_descendants()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


def check_bench(words: list[str]) -> None:
    """Parse `jaxformer bench NAME OPTIONS` (words: NAME OPTIONS) into its options,
    checked as the command checks them."""
    from jaxformer_lab.bench import BENCHMARKS, registry

    name, cls = words[0], BENCHMARKS[words[0]].options
    parser = argparse.ArgumentParser(prog=f"jaxformer bench {name}")
    registry.add_options(parser, cls, name)
    registry.options_from(parser.parse_args(words[1:]), cls)


def machine() -> dict:
    """Device and versions, read by a child process (this one never starts JAX)."""
    code = (
        "import json, jax, flax, optax; d = jax.devices()[0]; "
        "print(json.dumps(dict(device=d.device_kind, platform=d.platform, jax=jax.__version__, "
        "jaxlib=jax.lib.__version__ if hasattr(jax.lib, '__version__') else None, "
        "flax=flax.__version__, optax=optax.__version__)))"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    info = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-300:]}
    for package in ("tokamax", "torch"):
        try:
            from importlib.metadata import version

            info[package] = version(package)
        except Exception:  # not installed: say so
            info[package] = None
    return info


def add_options(parser: argparse.ArgumentParser) -> None:
    """`jaxformer gpu-report`'s options."""
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "results/gpu_report")
    parser.add_argument("--parts", nargs="+", help="these parts only (default: all, in order)")
    parser.add_argument("--force", action="store_true", help="rerun chosen parts that finished")
    parser.add_argument("--dry-run", action="store_true", help="check every part starts (CPU)")
    parser.add_argument("--budget-minutes", type=float, default=9.0, help="this call's time")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="times each part's budget")
    parser.add_argument("--jobs", type=int, default=3, help="Table 3 runs at once on the GPU")


def check(args: argparse.Namespace) -> None:
    """Bad options raise BadValue, naming them."""
    if args.budget_minutes <= 0 or args.budget_scale <= 0 or args.jobs < 1:
        raise BadValue("--budget-minutes and --budget-scale must be > 0, --jobs >= 1")
    names = part_names()
    unknown = sorted(set(args.parts or ()) - set(names))
    if unknown:
        raise BadValue(f"unknown parts {unknown}; the parts are {names}")


def part_names() -> list[str]:
    """The parts' names in priority order."""
    return [p.name for p in parts(ROOT / "results/gpu_report", 1)]


def run(args: argparse.Namespace) -> dict:
    """One call: the dry run's result, or the summary of every call into --out so far
    (refused, before --out is made, where JAX sees no GPU). Stopped by SIGTERM (a
    command's time limit) or SIGHUP, it raises Terminated through the `finally` of _run,
    which kills the running part's processes instead of leaving them on the GPU."""
    check(args)
    call = dict(date=_now(), command=results.command_line(), machine=machine())
    if not args.dry_run:
        check_gpu(call["machine"])
    out = args.out.resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadValue(f"--out {args.out}: cannot make the folder ({e.strerror})") from None
    chosen = [p for p in parts(out, args.jobs) if not args.parts or p.name in args.parts]
    if args.dry_run:
        result = call | {"parts": dry_run(chosen, out)}
        write_whole(out / "dry_run.json", json.dumps(result, indent=2))
        print(json.dumps({k: v["status"] for k, v in result["parts"].items()}))
        return result
    summary = load_summary(out)
    summary["calls"].append(call | {"ran": []})
    with stop_signals_raise():
        ran = run_call(chosen, summary, out, args)
    left = [name for name in part_names() if not finished(summary, name)]
    print(json.dumps({"ran": ran, "left": left}))
    return summary


def check_gpu(found: dict) -> None:
    """Refuse (BadValue) a machine whose JAX sees no GPU (`found`: `machine()`'s answer),
    before any folder is made: the parts would run on its CPU."""
    if found.get("platform") == "gpu":
        return
    error = found.get("error", "").strip().splitlines()[-1:]
    seen = f"its first device is {found['device']}" if "device" in found else "it did not start"
    why = f" ({error[0]})" if error else ""
    raise BadValue(
        f"no NVIDIA GPU here: JAX says {seen}{why}; the report runs on a GPU machine with a "
        "CUDA build of JAX (`jaxformer gpu-report --dry-run` checks on a CPU that every "
        "part starts)"
    )


def run_call(chosen: list[Part], summary: dict, out: pathlib.Path, args) -> dict:
    """Run the chosen parts not yet finished (all of them with --force) in order, while
    the next one's budget fits in --budget-minutes (`jaxformer_lab.parts`); record each in
    the summary, saved (with the markdown) before and after each part. Returns {part:
    status}."""
    by_name, ran = {p.name: p for p in chosen}, {}
    device = summary["calls"][-1]["machine"].get("device")

    def run_one(name: str, budget: float) -> None:
        record = dict(status="running", budget_s=round(budget), date=_now(), device=device)
        summary["parts"][name] = record
        save(summary, out)
        summary["parts"][name] = record | run_part(by_name[name], out, budget)
        summary["calls"][-1]["ran"].append(name)
        ran[name] = summary["parts"][name]["status"]
        save(summary, out)

    run_parts(
        list(by_name),
        budgets={p.name: p.budget_s * args.budget_scale for p in chosen},
        finished=lambda name: finished(summary, name) and not args.force,
        run_one=run_one,
        clock=Clock(args.budget_minutes * 60),
    )
    save(summary, out)
    return ran


def finished(summary: dict, name: str) -> bool:
    """Whether part `name` ran to an outcome (not killed with its call while running)."""
    return summary["parts"].get(name, {}).get("status", "running") != "running"


def load_summary(out: pathlib.Path) -> dict:
    """The summary of earlier calls into `out`, or an empty one."""
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {"calls": [], "parts": {}}


def save(summary: dict, out: pathlib.Path) -> None:
    """summary.json, and gpu_tables.md rendered from it and the parts' files."""
    write_whole(out / "summary.json", json.dumps(summary, indent=2))
    (out / "gpu_tables.md").write_text(render(summary, out))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def render(summary: dict, out: pathlib.Path) -> str:
    """The report's markdown: the latest call's machine, each part's record in priority
    order, then each part's table read from the files it wrote (absent files left out)."""
    call = summary["calls"][-1]
    m = call["machine"]
    versions = ", ".join(f"{k} {m.get(k)}" for k in ("jax", "flax", "optax", "tokamax", "torch"))
    calls = "; ".join(f"`{c['command']}` ({c['date']})" for c in summary["calls"])
    lines = [f"# GPU report: {m.get('device')}", "", f"{call['date']}; {versions}.", ""]
    lines += [f"Calls: {calls}", ""]
    order = part_names()
    rows = [
        [name, s["status"], s.get("wall_s", ""), s["budget_s"], s["date"], s["device"]]
        for name, s in sorted(summary["parts"].items(), key=lambda kv: order.index(kv[0]))
    ]
    columns = ["part", "status", "wall (s)", "budget (s)", "date", "device"]
    lines += table(columns, rows, "llrrll")
    for title, text in sections(out):
        if text:
            lines += ["", f"## {title}", "", text.strip()]
    return "\n".join(lines) + "\n"


def sections(out: pathlib.Path) -> list[tuple[str, str]]:
    """(title, markdown) of each part's table, in the parts' order: a benchmark's from its
    record, the lab's report, the sweep's results; the tests' and lm-throughput's runs
    once, under their first part."""
    found = []
    for p in config():
        folder, what = out / p["name"], " ".join(p["options"])
        if "bench" in p:
            title = f"jaxformer bench {p['bench']} {what}".strip()
            found.append((title, _record(folder / f"{p['bench']}.json")))
        elif p.get("tests") == next(iter(gpu_tests().values())):
            found.append(("Tests (`make test-gpu`'s subset)", _tests(out)))
        elif p.get("lm") == "kernels":
            found.append(("GPT-2-small training throughput (lm-throughput)", _lm_table(out)))
        elif "lab" in p:
            title = f"XLA against eager, the {p['lab']} GPU plan (jaxformer bench xla-vs-eager)"
            found.append((title, _read(folder / "report.md")))
        elif "sweep" in p:
            found.append((f"jaxformer sweep {p['sweep']} {what}", _read(folder / "results.md")))
    return found


def _read(path: pathlib.Path) -> str:
    return path.read_text() if path.is_file() else ""


def _record(path: pathlib.Path) -> str:
    return results.Record.read(path).markdown() if path.is_file() else ""


def _tests(out: pathlib.Path) -> str:
    """Each test part's pytest closing line ("N passed, M failed in S s")."""
    lines = []
    for name, paths in gpu_tests().items():
        log = _read(out / name / "log0.txt").strip().splitlines()
        if log:
            lines.append(f"- {name} ({' '.join(paths)}): `{log[-1]}`")
    return "\n".join(lines)


def _lm_table(out: pathlib.Path) -> str:
    """A row per lm-throughput record."""
    rows = [results.Record.read(p).data for p in sorted(out.glob("lm_throughput/*.json"))]
    if not rows:
        return ""
    cells = []
    for r in rows:
        mfu = "" if r.get("mfu") is None else f"{r['mfu']:.1%}"
        temp = "" if r.get("temp_bytes") is None else f"{r['temp_bytes'] / 2**30:.2f}"
        cells.append(
            [r["attention"], r["lm_head"], r["batch"], r["remat"], r.get("tokens_per_second", "")]
            + [mfu, r.get("step_ms", ""), temp]
        )
    columns = ["attention", "lm_head", "batch", "remat", "tokens/s", "MFU", "step (ms)"]
    return "\n".join(table([*columns, "temp (GiB)"], cells, "llrlrrrr"))
