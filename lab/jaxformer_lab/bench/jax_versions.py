"""`jaxformer bench jax-versions`: train-step's jaxformer step on each installed JAX line,
timed in the same interleaved rounds against one GEMM peak, and where its time goes.

The lines (pythons.jax_lines): --pythons, or this interpreter and each `.venv*` one whose
JAX is another version. Each line runs in a worker process of its interpreter
(rounds.Worker, importing this checkout's code) serving three programs: train-step's step
(its model and batch) in float32 and in bfloat16 compute, and JAX's [2048, 2048] float32
product; this process times NumPy's product beside them. Rounds of --steps-per-round calls
rotate through every program (stats.time_interleaved; steps timed by the worker's clock).
The GEMM peak is ONE figure for all lines: the fastest GEMM program's median, so a share
of it means the same on every line; shares and each line's speed against the first are
taken round by round. Then each line in turn traces --profile-steps steps of each dtype
(op_profile): its operations by kind and by label, and the labels and kinds where a line
differs from the first beyond their intervals.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile

import numpy as np

from jaxformer.checks import BadValue, check_int, check_number
from jaxformer_lab.bench import load, op_profile, pythons, rounds, stats, train_step
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

DTYPES = ("float32", "bfloat16")
NUMPY = "numpy"  # the program name of NumPy's GEMM, timed here


@dataclasses.dataclass(frozen=True)
class JaxVersionsOptions(Options):
    pythons: tuple[str, ...] = setting(
        (),
        "the interpreters whose JAX to time (default: this one and each .venv* one with another JAX)",
    )
    quick: bool = setting(False, "6 rounds (a 2-core CPU in a few minutes)")
    rounds: int | None = setting(None, "interleaved rounds, >= 6 (default 10; quick 6)")
    steps_per_round: int = setting(2, "steps (GEMMs) of each program per round")
    batch: int = setting(32, "sequences per step")
    profile_steps: int = setting(6, "steps of each dtype traced per line, >= 6 (0: no profile)")
    ready_timeout: float = setting(900.0, "seconds for the lines' workers to build and compile")

    def __post_init__(self):
        super().__post_init__()
        check_int("--steps-per-round", self.steps_per_round)
        check_int("--batch", self.batch)
        check_number("--ready-timeout", self.ready_timeout, "(0, inf)")
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 6):
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")
        if self.profile_steps != 0 and (
            not isinstance(self.profile_steps, int) or self.profile_steps < 6
        ):
            raise BadValue(f"--profile-steps must be 0 or >= 6, got {self.profile_steps}")
        for python in self.pythons:
            pythons.check_python("--pythons", python)


@BENCHMARKS.register("jax-versions", JaxVersionsOptions)
def run(options: JaxVersionsOptions) -> Record:
    """The train step on each installed JAX line, side by side, against one GEMM peak."""
    n = options.rounds or (6 if options.quick else 10)
    infos = pythons.jax_lines(options.pythons)
    lines = dict(zip(line_names(infos), infos, strict=True))
    say("lines: " + ", ".join(f"{name} ({i['path']})" for name, i in lines.items()))
    if len(lines) < 2:
        say("one JAX line found: its figures alone (give others with --pythons)")
    times, ready, window, profiles = measure(options, lines, n)
    result = figures(times, options, lines, ready) | {"rounds": n, "load": window}
    result["profiles"] = profiles
    result["differences"] = differences(profiles, list(lines))
    tables = [table(result), *profile_tables(result)]
    data = result | {"headline": headline(result)}
    return capture(tables, data=data, summary=summary(result))


def line_names(infos: list[dict]) -> list[str]:
    """ "JAX v" per line, with its Python where two lines share a JAX version, and a number
    where they share both (an interpreter given twice: a line against itself)."""
    versions = [i["jax"] for i in infos]
    names = [
        f"JAX {i['jax']}" + (f" (Python {i['python']})" if versions.count(i["jax"]) > 1 else "")
        for i in infos
    ]
    return [
        n + (f" #{names[:k].count(n) + 1}" if names.count(n) > 1 else "")
        for k, n in enumerate(names)
    ]


def measure(options: JaxVersionsOptions, lines: dict, n: int) -> tuple:
    """(seconds per call of each program, the workers' ready messages, the load while
    timing, each line's profile per dtype)."""
    k = options.steps_per_round
    workers = {name: start(name, info, options) for name, info in lines.items()}
    monitor = load.Monitor()
    try:
        ready = rounds.ready_all(workers, options.ready_timeout)
        for name, message in ready.items():
            if "error" in message:
                raise rounds.WorkerError(f"the {name} line's worker: {message['error']}")
        calls = {
            f"{name}/{program}": functools.partial(worker.timed, k, program)
            for name, worker in workers.items()
            for program in (*DTYPES, "gemm")
        }
        calls |= numpy_gemm(k)
        say(f"timing {len(calls)} programs in {n} rounds of {k} calls")
        mark = monitor.mark()
        times = stats.time_interleaved(calls, n)
        window = monitor.window(mark)
        profiles = {}
        for name, worker in workers.items() if options.profile_steps else ():
            say(f"profiling {options.profile_steps} steps of each dtype on {name}")
            profiles[name] = {d: worker.ask("profile", d) for d in DTYPES}
    finally:
        monitor.close()
        for worker in workers.values():
            worker.close()
    say(f"other processes kept {window['others_cores']:.2f} cores busy while timing")
    return times, ready, window, profiles


def start(name: str, info: dict, options: JaxVersionsOptions) -> rounds.Worker:
    """The line's worker process, started now (its log: a temporary file)."""
    code = "import sys; from jaxformer_lab.bench import jax_versions as j; j.serve(*sys.argv[1:])"
    command = [info["path"], "-c", code, str(options.batch), str(options.profile_steps)]
    slug = "".join(c if c.isalnum() else "-" for c in name)
    log = tempfile.NamedTemporaryFile(
        "w", prefix=f"jax-versions-{slug}-", suffix=".log", delete=False
    )
    return rounds.Worker(name, command, pythons.worker_env(), log)


def numpy_gemm(k: int) -> dict:
    """{numpy/gemm: a call of k [PEAK_N, PEAK_N] float32 products by NumPy's BLAS}."""
    n = train_step.PEAK_N
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    return {f"{NUMPY}/gemm": lambda: [a @ a for _ in range(k)]}


def serve(batch: str, profile_steps: str) -> None:
    """A line's worker: train-step's step in each dtype (asked "profile": where its time
    goes, op_profile) and JAX's GEMM, served by name (rounds.serve)."""
    rounds.serve(functools.partial(build, int(batch), int(profile_steps)))


def build(batch: int, profile_steps: int) -> dict[str, rounds.Program]:
    """The line's programs (see `serve`)."""
    import jax
    import jax.numpy as jnp

    from jaxformer_lab.bench.host import xla_threads

    data = train_step.random_batch(np.random.default_rng(0), batch)
    data = {name: jnp.asarray(v) for name, v in data.items()}
    about = dict(device=jax.devices()[0].device_kind, xla_threads=xla_threads())
    about |= dict(jax=jax.__version__, python=sys.version.split()[0], executable=sys.executable)
    programs = {}
    for dtype in DTYPES:
        steps, info, compiled = train_step.jax_steps(dtype, data)
        asks = {"profile": functools.partial(profile, steps, compiled, profile_steps)}
        programs[dtype] = rounds.Program(steps, 0, info | about, asks=asks)
    n = train_step.PEAK_N
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), jnp.float32)
    matmul = jax.jit(jnp.matmul)

    def gemm(k: int) -> float:
        for _ in range(k):
            matmul(a, a).block_until_ready()
        return 0.0

    return programs | {"gemm": rounds.Program(gemm, 0, about)}


def profile(steps, compiled, n: int) -> dict:
    """Where n traced steps spent their time (op_profile.summarise)."""
    ops, marks = op_profile.trace_steps(steps, n)
    names = op_profile.labels(compiled.as_text())
    return op_profile.summarise(op_profile.per_step(ops, marks), names, marks)


def figures(times: dict, options: JaxVersionsOptions, lines: dict, ready: dict) -> dict:
    """Per line and dtype: seconds per step, share of the one GEMM peak and speed against
    the first line (round by round), with their intervals; each line's own GEMM; the peak."""
    k, size, first = options.steps_per_round, options.batch, next(iter(lines))
    per_step = {name: [t / k for t in ts] for name, ts in times.items()}
    n3 = 2 * train_step.PEAK_N**3
    gemms = {name: [n3 / t for t in ts] for name, ts in per_step.items() if name.endswith("/gemm")}
    peak = train_step.one_peak(gemms)
    config = train_step.shared.seq2seq_config(train_step.VOCAB)
    flops = train_step.analytic_train_flops(config, size, train_step.LENGTH, train_step.LENGTH)
    runs = {}
    for name in lines:
        runs[name] = {"gemm_flops": peak["each"][f"{name}/gemm"]}
        for dtype in DTYPES:
            seconds, ref = per_step[f"{name}/{dtype}"], per_step[f"{first}/{dtype}"]
            share = [flops / t / p for t, p in zip(seconds, peak["samples"], strict=True)]
            runs[name][dtype] = dict(
                seconds=stats.median_ci(seconds),
                share_of_peak=stats.median_ci(share),
                speed_vs_first=stats.paired_ratio(ref, seconds),
                samples=seconds,
            )
    interpreters = {name: lines[name] | _said(ready[name]) for name in lines}
    numpy = {"numpy": np.__version__, "python": sys.version.split()[0]}
    return dict(
        lines=interpreters,
        first=first,
        runs=runs,
        gemm_peak_flops=peak,
        gemm_peak_numpy=numpy,
        analytic_flops_per_step=flops,
        batch=dict(B=size, S=train_step.LENGTH, T=train_step.LENGTH),
        steps_per_round=k,
        profile_steps=options.profile_steps,
    )


def _said(message: dict) -> dict:
    """What a line's worker said of itself when ready (JSON values, the programs' XLA
    figures included)."""
    programs = message["programs"]
    about = {k: programs["gemm"][k] for k in ("device", "xla_threads")}
    keep = ("xla_flops", "temp_bytes", "argument_bytes", "first_step_s")
    xla = {d: {k: programs[d][k] for k in keep} for d in DTYPES}
    return about | {"xla": xla, "ready_s": message["ready_s"]}


def differences(profiles: dict, names: list[str]) -> dict:
    """Per dtype and line after the first: where its profile differs from the first's
    beyond the intervals (op_profile.differences)."""
    if not profiles:
        return {}
    first = names[0]
    return {
        d: {n: op_profile.differences(profiles[first][d], profiles[n][d]) for n in names[1:]}
        for d in DTYPES
    }


def _compute(dtype: str) -> str:
    return "bfloat16 compute" if dtype == "bfloat16" else dtype


def _share(ci: dict) -> str:
    return f"{ci['median']:.0%} [{ci['low']:.0%}, {ci['high']:.0%}]"


def _ci(ci: dict, scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
    m, lo, hi = (scale * ci[k] for k in ("median", "low", "high"))
    return f"{m:.{digits}f}{unit} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(r: dict) -> Table:
    """A row per line and dtype: ms / step, speed against the first line, share of the one
    GEMM peak, the line's own GEMM."""
    rows = []
    for name, run in r["runs"].items():
        py = r["lines"][name]["python"]
        for dtype in DTYPES:
            x = run[dtype]
            rows.append(
                [
                    f"{name}, Python {py}",
                    _compute(dtype),
                    _ci(x["seconds"], 1e3),
                    _ci(x["speed_vs_first"], digits=2, unit="x"),
                    _share(x["share_of_peak"]),
                    _ci(run["gemm_flops"], 1e-9),
                ]
            )
    peak = r["gemm_peak_flops"]
    of = peak["of"].split("/")[0]
    of = f"NumPy {r['gemm_peak_numpy']['numpy']}'s BLAS" if of == NUMPY else f"{of}'s jnp.matmul"
    caption = (
        "train-step's jaxformer step (d_model 256, 2+2 layers, vocabulary 1000, batch "
        f"{r['batch']['B']} x 64/64 tokens, Adam; {r['analytic_flops_per_step'] / 1e9:.1f} "
        "GFLOP per step) on each JAX line, each in its own process, in the same "
        f"{r['rounds']} interleaved rounds. One GEMM peak for all lines: {_ci(peak, 1e-9)} "
        f"GFLOP/s, {of} [2048, 2048] float32 product (the fastest of the lines' and "
        "NumPy's, measured in the same rounds). Medians with 95% intervals; speed against "
        f"{r['first']} and share of the peak round by round:"
    )
    columns = ["line", "compute", "ms / step [95%]", f"speed vs {r['first']} [95%]"]
    columns += ["share of the one GEMM peak [95%]", "the line's own GEMM GFLOP/s [95%]"]
    w = r["load"]
    note = (
        f"While timing, other processes kept {w['others_cores']:.2f} of {w['cores']} cores "
        f"busy (mean; most in one second {w['others_cores_max']:.2f}; load average "
        f"{w['load_average']:.1f} at the end)."
    )
    return Table(columns, rows, "llrrrr", caption=caption, notes=[note])


def profile_tables(r: dict) -> list[Table]:
    """Where the time went: by kind per line and dtype; the top operations matched by label;
    what differs from the first line beyond the intervals."""
    if not r["profiles"]:
        return []
    return [kinds_table(r), top_ops_table(r), differences_table(r)]


def kinds_table(r: dict) -> Table:
    kinds = sorted({k for p in r["profiles"].values() for d in DTYPES for k in p[d]["kinds"]})
    rows = []
    for name, p in r["profiles"].items():
        for dtype in DTYPES:
            s = p[dtype]
            rows.append(
                [name, _compute(dtype), _ci(s["wall_ms"]), _ci(s["busy_ms"])]
                + [f"{s['kinds'].get(k, {'median': 0})['median']:.0f}" for k in kinds]
            )
    caption = (
        f"Where the time went: {r['profile_steps']} traced steps of each dtype per line, one "
        "line at a time (jax.profiler): ms per step, the step's wall time and its XLA "
        "operations' summed time (busy, over the runtime threads), then by kind (medians):"
    )
    columns = ["line", "compute", "wall ms [95%]", "busy ms [95%]", *kinds]
    return Table(columns, rows, "ll" + "r" * (len(columns) - 2), caption=caption)


def top_ops_table(r: dict, top: int = 6) -> Table:
    names = list(r["profiles"])
    rows = []
    for dtype in DTYPES:
        chosen = []
        for name in names:
            chosen += [k for k in list(r["profiles"][name][dtype]["ops"])[:top] if k not in chosen]
        for key in chosen:
            cells = [r["profiles"][n][dtype]["ops"].get(key) for n in names]
            rows.append(
                [dtype, f"`{key}`"] + ["" if c is None else _ci(c, digits=1) for c in cells]
            )
    caption = (
        f"The {top} operations that took longest on each line, matched across lines by label "
        "(the JAX code it came from, else its HLO name without the number; its shape): "
        "ms per step [95%]; empty where the line has no operation of that label:"
    )
    return Table(["compute", "operation", *names], rows, "ll" + "r" * len(names), caption=caption)


def differences_table(r: dict) -> Table:
    rows, notes = [], []
    for dtype, by_line in r["differences"].items():
        for name, d in by_line.items():
            labelled = [(f"kind: {k['key']}", k) for k in d["kinds"]]
            labelled += [(f"`{o['key']}`", o) for o in d["ops"]]
            for label, x in labelled:
                a, b = _ci(x["a"], digits=1), _ci(x["b"], digits=1)
                rows.append([dtype, name, label, a, b, f"{x['delta_ms']:+.1f}"])
            notes.append(
                f"{dtype}, {name} against {r['first']}: {d['ops_apart']} operation labels apart "
                f"beyond their intervals; their differences sum to {d['delta_of_ops_apart_ms']:+.1f} "
                f"ms per step, the busy time's difference is {d['delta_busy_ms']:+.1f} ms."
            )
    caption = (
        f"Where a line differs from {r['first']} beyond the intervals (the kinds, then the "
        "operations with the largest differences): ms per step [95%] on each, and the difference:"
    )
    columns = ["compute", "line", "kind or operation", r["first"], "the line", "difference ms"]
    return Table(columns, rows, "lllrrr", caption=caption, notes=notes)


def summary(r: dict) -> str:
    """The finding in one sentence: each later line's speed against the first per dtype
    (faster, slower, or level where the interval holds 1) and each line's float32 share of
    the one peak."""
    first, parts = r["first"], []
    for name, run in list(r["runs"].items())[1:]:
        for dtype in DTYPES:
            ci = run[dtype]["speed_vs_first"]
            word = "faster" if ci["low"] > 1 else "slower" if ci["high"] < 1 else "level"
            parts.append(f"{name} {_compute(dtype)} {_ci(ci, digits=2, unit='x')} ({word})")
    shares = ", ".join(
        f"{n} {_share(run['float32']['share_of_peak'])}" for n, run in r["runs"].items()
    )
    against = f"against {first}'s speed: " + "; ".join(parts) + ". " if parts else ""
    return (
        f"train-step's step on {len(r['runs'])} JAX line(s) in the same rounds, {against}"
        f"float32 share of the one GEMM peak ({r['gemm_peak_flops']['median'] / 1e9:.0f} "
        f"GFLOP/s): {shares}; other processes kept {r['load']['others_cores']:.1f} of "
        f"{r['load']['cores']} cores busy."
    )


def headline(r: dict) -> dict:
    """Per line and dtype its ms per step and its speed against the first line; the peak."""
    line = {"gemm_peak_gflops": round(r["gemm_peak_flops"]["median"] / 1e9, 1)}
    line["gemm_peak_of"] = r["gemm_peak_flops"]["of"]
    for name, run in r["runs"].items():
        for dtype in DTYPES:
            x = run[dtype]
            line[f"{name} {dtype} ms"] = round(1e3 * x["seconds"]["median"], 1)
            ci = x["speed_vs_first"]
            line[f"{name} {dtype} vs first"] = [round(ci[k], 3) for k in ("median", "low", "high")]
    return line
