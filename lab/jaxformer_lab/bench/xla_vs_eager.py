"""The XLA-vs-eager lab: when compiling pays off, why, what it costs, and how JAX compares
with PyTorch, for the same model, batch and data (`jaxformer bench xla-vs-eager`).

`run_lab(LabOptions(...))` checks that the machine is quiet enough (load.py), then
measures the parts of a plan (plan.py: CPU or GPU sizes, quick or full, each part with its
budget) through the resumable parts runner (`jaxformer_lab.parts`; measure.py measures a
part). Each finished part is saved at once to <out>/parts/<part>.json and report.json and
report.md are rewritten from every part there, so a stopped run (a signal, --time-limit)
keeps what it measured and the same command again measures only the rest. The record
(<out>/record.json) is what the docs render: the report, then its headline.

Modes: modes.py (torch's in another interpreter: torch_side.py). Timing: stats.py. Why:
programs.py (counts, launches), eager_model.py and validate.py (the fitted model, scored out
of sample). Compiling: compile_costs.py. First calls: fresh.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
import time
from dataclasses import dataclass

from jaxformer.checks import BadValue, check_int, check_number
from jaxformer.files import write_whole
from jaxformer.signals import Terminated, stop_signals_raise
from jaxformer_lab.bench import load, plan, pythons, report
from jaxformer_lab.bench.plan import TORCH_PAIRS
from jaxformer_lab.bench.registry import BENCHMARKS, Options, Stopped, command, say, setting
from jaxformer_lab.parts import Clock, alarm_at_deadline, run_parts
from jaxformer_lab.results import Record, Table, capture

NAME = "xla-vs-eager"


@dataclass(frozen=True)
class LabOptions(Options):
    """The lab's options; each field is a command-line option (--field-name)."""

    FOLDER = True
    out: str = setting(
        "results/xla_vs_eager", "the report's folder (and record.json); parts there are kept"
    )
    quick: bool = setting(False, "the quick plan: a small model and sweep (see --target)")
    rounds: int | None = setting(None, "interleaved timing rounds, >= 6 (default: the plan's)")
    repeats: int | None = setting(None, "fresh processes per first call (default: the plan's)")
    dtype: str = setting("float32", "compute dtype", choices=("float32", "bfloat16"))
    no_torch: bool = setting(False, "leave out torch's modes")
    torch_python: str = setting(
        "", "the Python that runs torch (default: this one if it has torch, else a .venv* one)"
    )
    no_scale: bool = setting(False, "leave out the scale sweep")
    target: str = setting(
        "auto", "the plan's sizes: this device's, or cpu's or gpu's", choices=("auto", "cpu", "gpu")
    )
    parts: tuple[str, ...] = setting((), "measure only these parts of the plan")
    time_limit: float | None = setting(
        None,
        "seconds this call may take: at the first part whose budget no longer fits, it and "
        "the rest are left for the next call; a part still running at the limit is stopped "
        "(what is done is written)",
    )
    max_load: float = setting(
        0.25,
        "cores other processes may keep busy before the run refuses (or, with "
        "--allow-load, marks the figures measured meanwhile)",
    )
    allow_load: bool = setting(False, "run on a busy machine, marking every figure so measured")
    dry_run: bool = setting(False, "the plan at tiny sizes: checks every part runs (no verdicts)")
    note: str = setting("", "a line the report carries (the conditions)")

    def __post_init__(self):
        """Refuse options no run can honour, naming the option."""
        super().__post_init__()
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 6):
            raise BadValue(
                f"--rounds must be >= 6 for a 95% interval of the median, got {self.rounds}"
            )
        if self.repeats is not None:
            check_int("--repeats", self.repeats)
        if self.time_limit is not None:
            check_number("--time-limit", self.time_limit, "(0, inf)")
        check_number("--max-load", self.max_load, "[0, inf)")
        pythons.check_python("--torch-python", self.torch_python)
        if pathlib.Path(self.out).exists() and not pathlib.Path(self.out).is_dir():
            raise BadValue(f"--out {self.out} is a file; the report needs a folder")


@BENCHMARKS.register(NAME, LabOptions)
def run(options: LabOptions) -> Record:
    """When jax.jit pays off against eager execution, why, and how torch compares."""
    result = run_lab(options)
    line = headline(result, pathlib.Path(options.out))
    tables, body = [headline_table(line)], report.tables(result)
    return capture(tables, data={"headline": line}, body=body, summary=summary(line))


def summary(line: dict) -> str | None:
    """The headline in one sentence: jit's speed-up over eager and torch eager's time over
    jit's per workload measured, with their intervals; None before any."""
    rows = {name: w for name, w in line.items() if isinstance(w, dict)}
    if not rows:
        return None
    jit = "; ".join(f"{name} {_ci_text(w['jit_speedup'])}" for name, w in rows.items())
    text = f"jit's speed-up over eager JAX: {jit}"
    if all("torch_over_jit" in w for w in rows.values()):
        torch = "; ".join(f"{name} {_ci_text(w['torch_over_jit'])}" for name, w in rows.items())
        text += f". torch eager's time over jit's (< 1: torch faster): {torch}"
    text += " (measured under load)" if line["loaded"] else ""
    return text + (
        f"; parts not measured: {', '.join(line['missing'])}." if line["missing"] else "."
    )


def headline_table(line: dict) -> Table:
    """The record's table: `headline`'s figures per workload, and what it lacks."""
    rows = [
        [
            name,
            _ci_text(w["jit_speedup"]),
            w.get("jit_break_even", ""),
            _ci_text(w.get("torch_over_jit")),
        ]
        for name, w in line.items()
        if isinstance(w, dict)
    ]
    caption = (
        "The XLA-vs-eager lab's headline: per workload jit's speed-up over eager and torch "
        "eager's time over jit's, medians of paired rounds with their 95% intervals, and "
        "when compiling pays for itself:"
    )
    notes = [f"Parts not measured yet: {', '.join(line['missing'])}."] if line["missing"] else []
    notes += ["Measured on a busy machine: see the report's marks."] if line["loaded"] else []
    columns = ["workload", "eager / jit [95%]", "jit pays off", "torch / jit [95%]"]
    return Table(columns, rows, "lrlr", caption=caption, notes=notes)


def _ci_text(ci: list[float] | None) -> str:
    return "" if ci is None else f"{ci[0]:.2f} [{ci[1]:.2f}, {ci[2]:.2f}]"


def profile_of(options: LabOptions) -> plan.Profile:
    """The plan's profile: the target's sizes (auto: this JAX backend's), quick or full,
    shrunk with --dry-run."""
    import jax

    target = options.target
    if target == "auto":
        target = "gpu" if jax.default_backend() == "gpu" else "cpu"
    profile = plan.PROFILES[(target, options.quick)]
    if options.no_scale:
        profile = dataclasses.replace(profile, scale_axes={})
    return plan.dry(profile) if options.dry_run else profile


def chosen_parts(profile: plan.Profile, options: LabOptions) -> list[str]:
    """The plan's parts, or those --parts names (refusing names not in the plan)."""
    names = profile.part_names()
    unknown = [p for p in options.parts if p not in names]
    if unknown:
        raise BadValue(f"--parts {' '.join(unknown)}: not in the {profile.name} plan: {names}")
    return [n for n in names if not options.parts or n in options.parts]


def fingerprint(options: LabOptions, profile: plan.Profile) -> dict:
    """What makes two calls' parts parts of one run: the plan and the measuring options."""
    keep = ("quick", "rounds", "repeats", "dtype", "no_torch", "torch_python", "dry_run")
    return {"plan": profile.name} | {k: getattr(options, k) for k in keep}


def run_lab(options: LabOptions) -> dict:
    """The lab (see the module doc): refuses a busy machine (unless --allow-load), then
    measures the plan's parts not yet in its folder, saving each and rewriting the
    report; returns the report's dict (report.json). Raises Stopped after writing what it
    has when a signal or --time-limit stops it."""
    start = time.perf_counter()
    profile = profile_of(options)
    names = chosen_parts(profile, options)  # a bad --parts before the load is measured
    say(f"jaxformer bench {NAME}: measuring the machine's load for 3 s (other processes, in cores)")
    guard = load.probe(3.0) | {"max_cores": options.max_load, "allowed": options.allow_load}
    guard["quiet"] = load.verdict(guard, options.max_load)
    if not guard["quiet"] and not (options.allow_load or options.dry_run):
        raise BadValue(
            f"the machine is busy: other processes kept {guard['others_cores']:.2f} of "
            f"{guard['cores']} cores busy over 3 s (load average {guard['load_average']:.1f}); "
            f"--max-load is {options.max_load:g}. Wait for a quiet machine, or pass "
            "--allow-load to run anyway with every figure marked as measured under load"
        )
    out = pathlib.Path(options.out)
    records = read_parts(out / "parts", fingerprint(options, profile))
    call = {"start": start, "guard": guard, "earlier": _earlier_calls(out, records)}
    _say_plan(profile, names, records, guard)
    clock = Clock(options.time_limit)
    at_limit = alarm_at_deadline(clock, lambda: Stopped("the time limit", 124))
    with _caches(), stop_signals_raise(), at_limit:
        try:
            _measure(options, profile, names, records, out, clock, call)
        except (KeyboardInterrupt, Stopped) as e:  # Terminated: SIGTERM, SIGHUP
            why, code = _stopped_by(e, clock)
            result = assemble(records, options, profile, call, stopped=why)
            write(result, out, final=True)
            raise Stopped(f"stopped by {why}; what was measured is in {out}", code) from None
    result = assemble(records, options, profile, call)
    write(result, out, final=True)
    return result


def _earlier_calls(out: pathlib.Path, records: dict) -> list[dict]:
    """The calls recorded in out/report.json by earlier calls of this run (none when no
    part of it is kept)."""
    path = out / "report.json"
    if not records or not path.is_file():
        return []
    try:
        return json.loads(path.read_text()).get("calls", [])
    except json.JSONDecodeError:
        return []


def _measure(options, profile, names, records, out, clock, call) -> None:
    from jaxformer_lab.bench import measure

    device, torch = torch_of(options)
    gpu = device == "cuda" or profile.name.startswith("gpu")
    tolerance = 5e-2 if options.dtype == "bfloat16" else (2e-2 if gpu else 1e-4)  # TF32
    ctx = measure.Context(
        profile=profile,
        rounds=options.rounds or profile.rounds,
        repeats=options.repeats or profile.repeats,
        dtype=options.dtype,
        device=device,
        tolerance=tolerance,
        say=say,
        torch_python=torch,
    )
    monitor = load.Monitor()

    def run_one(name: str, budget: float) -> None:
        mark, t0 = monitor.mark(), time.perf_counter()
        result = measure.part_function(name)(ctx)
        window = monitor.window(mark)
        records[name] = {
            "name": name,
            "fingerprint": fingerprint(options, profile),
            "wall_s": time.perf_counter() - t0,
            "budget_s": budget,
            "load": window,
            "quiet": load.verdict(window, options.max_load),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "result": result,
        }
        save_part(out / "parts", records[name])
        write(assemble(records, options, profile, call), out, final=False)
        say(_done_line(records[name], tolerance=options.max_load))

    try:
        run_parts(
            names,
            budgets=profile.budgets,
            finished=records.__contains__,
            run_one=run_one,
            clock=clock,
            say=say,
            budgets_on=_budget_machine(profile),
        )
    finally:
        monitor.close()


def torch_of(options: LabOptions) -> tuple[str | None, dict | None]:
    """(torch's device, None without torch; the interpreter that runs it in a worker,
    pythons.describe, or None where it runs in this process): --no-torch, --torch-python,
    else this interpreter's torch, else one found beside it (pythons.torch_python)."""
    import sys

    import jax

    from jaxformer_lab.bench import host

    if options.no_torch:
        return None, None
    torch = pythons.torch_python(options.torch_python)
    if torch is None:
        say(pythons.no_torch_found() + "; the lab runs without torch's modes")
        return None, None
    if torch["prefix"] == sys.prefix:
        return host.torch_device(), None
    say(f"torch {torch['torch']} runs in a worker of {torch['path']} (Python {torch['python']})")
    return ("cuda" if jax.default_backend() == "gpu" else "cpu"), torch


def _budget_machine(profile: plan.Profile) -> str:
    return "one H100" if profile.name.startswith("gpu") else "a quiet 2-core CPU"


def _done_line(record: dict, tolerance: float) -> str:
    w = record["load"]
    loaded = "" if record["quiet"] else f" LOADED (> {tolerance:g})"
    return (
        f"  done in {record['wall_s']:.0f} s (budget {record['budget_s']} s); other processes "
        f"kept {w['others_cores']:.2f} cores busy{loaded}"
    )


def _say_plan(profile, names, records, guard) -> None:
    total = sum(profile.budgets[n] for n in names) + plan.STARTUP_S
    quiet = "quiet" if guard["quiet"] else "BUSY: every figure will be marked"
    say(
        f"plan: {profile.name}, {len(names)} parts, {total:.0f} s budgeted on "
        f"{_budget_machine(profile)}; others kept {guard['others_cores']:.2f} cores busy ({quiet})"
    )
    for n in names:
        state = "done (kept)" if n in records else f"{profile.budgets[n]} s"
        say(f"  {n}: {state}")


def _stopped_by(stop: BaseException, clock: Clock) -> tuple[str, int]:
    """What stopped the lab, said with the part it stopped, and the exit status to give."""
    if isinstance(stop, Stopped):
        why, code = str(stop), stop.code
    elif isinstance(stop, Terminated):
        why, code = str(stop), 128 + stop.signum
    else:
        why, code = "SIGINT", 130
    return why + (f" during part {clock.part}" if clock.part else ""), code


class _caches:
    """An empty Inductor cache folder for this run (set before torch is imported) and an
    in-process JAX persistent cache, so the lab's repeated compiles of one program (its
    counts, its modes) read the first; both removed on exit. First calls are measured in
    fresh processes with every cache off (fresh.py)."""

    def __enter__(self):
        import jax

        self.folders = [tempfile.TemporaryDirectory() for _ in range(2)]
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", self.folders[0].name)
        jax.config.update("jax_compilation_cache_dir", self.folders[1].name)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        return self

    def __exit__(self, *exc) -> None:
        for folder in self.folders:
            folder.cleanup()


def read_parts(folder: pathlib.Path, expected: dict) -> dict:
    """The parts saved in `folder` by earlier calls of the same run; refuses parts of
    another run (other plan or measuring options), naming the option to change."""
    records = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError:  # a part cut short while being written: measure again
            say(f"{path} is damaged; its part is measured again")
            continue
        if record.get("fingerprint") != expected:
            raise BadValue(
                f"{folder.parent} holds parts of another run ({record.get('fingerprint')}, "
                f"this one is {expected}); choose another --out or empty it"
            )
        records[record["name"]] = record
    return records


def save_part(folder: pathlib.Path, record: dict) -> None:
    """Write a part's record whole."""
    folder.mkdir(parents=True, exist_ok=True)
    write_whole(folder / f"{record['name']}.json", json.dumps(record))


# (slower, compiled) pairs whose break-even the report gives: each from its first call.
BREAK_EVEN = (("eager", "jit"),) + tuple(
    (slow, fast) for slow, fast in TORCH_PAIRS if fast != "torch, fast path"
)


def assemble(records, options, profile, call: dict, stopped: str | None = None) -> dict:
    """report.json from the parts measured so far (every call's), this call's options and
    load guard, and the calls so far (`call`: this one's start and guard, and the earlier
    calls); `stopped` says what stopped the run."""
    from jaxformer_lab.bench import validate

    done = {n: r["result"] for n, r in records.items()}
    rows = [with_first_calls(done[w], done) for w in profile.workloads if w in done]
    scale = done.get("scale", {}).get("rows")
    host = done.get("host", {})
    why, missing_why = None, _why_missing(host, rows, scale)
    if missing_why is None:
        why = validate.validate(rows, scale, host["roofs"], host["dispatch_us"])
    p = profile.point
    return {
        "lab": 2,
        "command": command(NAME, options),
        "options": dataclasses.asdict(options),
        "plan": _plan_record(profile, records),
        "quick": options.quick,
        "dry_run": options.dry_run,
        "note": options.note,
        "dtype": options.dtype,
        "point": p,
        "model": model_text(p, options.dtype),
        "rounds": options.rounds or profile.rounds,
        "repeats": options.repeats or profile.repeats,
        "load": call["guard"]
        | {
            "loaded_parts": [
                n for n in profile.part_names() if not records.get(n, {}).get("quiet", True)
            ]
        },
        "calls": call["earlier"] + [_call_record(options, call)],
        "machine": host.get("machine"),
        "roofs": host.get("roofs"),
        "dispatch_us": host.get("dispatch_us"),
        "nnx_overheads": host.get("nnx_overheads"),
        "workloads": rows,
        "bf16": with_first_calls(done["bf16-train_step"], {})
        if "bf16-train_step" in done
        else None,
        "scale": scale,
        "scale_center": done.get("scale", {}).get("center"),
        "compile": done.get("compile"),
        "recompile": done.get("recompile"),
        "why": why,
        "why_missing": missing_why,
        "wall_s": time.perf_counter() - call["start"],
        "parts_wall_s": sum(r["wall_s"] for r in records.values()),
        "stopped": stopped,
    }


def _call_record(options: LabOptions, call: dict) -> dict:
    g = call["guard"]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command(NAME, options),
        "others_cores": g["others_cores"],
        "load_average": g["load_average"],
        "wall_s": time.perf_counter() - call["start"],
    }


def _why_missing(host: dict, rows: list[dict], scale) -> str | None:
    """Why the model cannot be fitted and scored yet (None: it can)."""
    from jaxformer_lab.bench.validate import point_key

    points = len(rows) + len({point_key(r) for r in scale or []})
    if not host:
        return "the host part (roofs, dispatch costs) is not measured yet"
    if points < 4:
        return f"{points} points measured; scoring 3 constants out of sample needs 4"
    return None


def _plan_record(profile, records) -> dict:
    parts = []
    for name in profile.part_names():
        r = records.get(name)
        entry = {"name": name, "budget_s": profile.budgets[name], "status": "not run"}
        if r is not None:
            entry |= {"status": "done", "wall_s": r["wall_s"], "quiet": r["quiet"]}
            entry |= {"others_cores": r["load"]["others_cores"], "date": r["date"]}
        parts.append(entry)
    total = sum(profile.budgets.values()) + plan.STARTUP_S
    return {"profile": profile.name, "budget_s": total, "parts": parts}


def with_first_calls(row: dict, done: dict) -> dict:
    """A workload's row with the first calls of its first-calls parts and, where both
    sides of a BREAK_EVEN pair were measured, its break-even."""
    from jaxformer_lab.bench import stats

    row = dict(row)
    for result in done.values():
        if (
            isinstance(result, dict)
            and result.get("workload") == row["workload"]
            and "fresh" in result
        ):
            row["fresh"] = row.get("fresh", {}) | result["fresh"]
    row["break_even"] = {}
    for slow, fast in BREAK_EVEN:
        firsts = [row.get("fresh", {}).get(m, {}).get("first_call_s") for m in (slow, fast)]
        if None in firsts or fast not in row["times"]:
            continue
        saving = stats.paired_saving(row["times"][slow], row["times"][fast])
        row["break_even"][fast] = stats.break_even(*firsts, saving) | {"saving_s": saving}
    return row


def model_text(p: dict, dtype: str) -> str:
    d, layers = p["d_model"], p["layers"]
    return (
        f"d_model {d}, {layers}+{layers} layers, d_ff {4 * d}, {d // 32} heads, vocabulary "
        f"512, batch {p['batch']} x {p['length']} tokens, {dtype} compute"
    )


def write(result: dict, out: pathlib.Path, final: bool) -> None:
    """report.json and report.md in `out`; when `final`, also the PNGs."""
    from jaxformer_lab.bench import plots

    out.mkdir(parents=True, exist_ok=True)
    write_whole(out / "report.json", json.dumps(result, indent=1))
    (out / "report.md").write_text(report.markdown(result))
    if final:
        plots.plots(result, out)


def headline(result: dict, out: pathlib.Path) -> dict:
    """The report's headline: per workload jit's speed-up over eager and its break-even
    verdict, torch eager over jit; whether any figure was measured under load; parts not
    yet measured."""
    line = {"report": str(out / "report.md"), "loaded": bool(result["load"]["loaded_parts"])}
    line["missing"] = [p["name"] for p in result["plan"]["parts"] if p["status"] != "done"]
    for r in result["workloads"]:
        entry = {"jit_speedup": _round(r["ratios"]["eager / jit"])}
        if "jit" in r["break_even"]:
            entry["jit_break_even"] = r["break_even"]["jit"]["verdict"]
        if "torch / jit" in r["ratios"]:
            entry["torch_over_jit"] = _round(r["ratios"]["torch / jit"])
        line[r["workload"]] = entry
    return line


def _round(ci: dict) -> list[float]:
    return [round(ci[k], 2) for k in ("median", "low", "high")]
