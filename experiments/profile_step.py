"""What one training step of `make train`'s model looks like in a `jaxformer train --profile`
trace: where XLA spends the step, by kind of operation, and a timeline picture; and where
a GPU spends one step of lm_throughput.py's GPT-2-small model, kernel by kernel.

    python experiments/profile_step.py [--steps 12] [--repeats 3]
    python experiments/profile_step.py --gpt2 [lm_throughput.py's options: --batch 32 ...]
    python experiments/profile_step.py --trace TRACE --hlo HLO [lm_throughput.py's options]

Trains the `dates` job (make train's model and batch) for --steps steps with
`profile=f"{steps - 1}:{steps}"` (the last step traced, after warm-up), reads the trace the
run folder holds (perfetto_trace.json.gz: the XLA operations on each runtime thread) and
sorts every operation (the executor's own spans left out) into: matrix products (dot
fusions), layout copies and transposes, random bits (dropout's threefry), reductions,
other fusions (elementwise work fused by XLA); --repeats runs it again as fresh runs.
Writes results/profile_step.json (a docs results file, a row per run: copy it to
docs/results/, where docs/performance.md renders it) and profile_step.png (the last run's
timeline, docs/profile_step.png); prints a JSON line with the shares.

With --gpt2 it traces one training step of experiments/lm_throughput.py's GPT-2-small
model instead (any of that script's options; --quick for its small model) after three
warm-up steps, keeps the trace and the compiled step's optimized HLO text
(profile_gpt2.perfetto.json.gz, profile_gpt2.hlo.txt.gz), and reads them as --trace and
--hlo read a pair taken elsewhere (its model's sizes from lm_throughput's options). Each
device operation is sorted by the HLO instruction it runs: a kernel XLA generated is named
after its instruction; on a GPU the step runs as a command buffer (a CUDA graph), whose
cuBLAS kernels carry cuBLAS's names and run the entry computation's cuBLAS calls in
schedule order, and whose cuDNN kernels run its attention calls. An instruction's category
(`category_of`) comes from its shapes, op_name (the train step's "loss" and "optimizer"
scopes; transpose(...) for the backward pass), custom-call target and stack frame:
matrix products by layer (Q/K/V projection, attention output, feed-forward in and out,
LM head) and pass (forward, backward dX, backward dW), attention, loss, norms/elementwise,
optimizer, copies; a kernel matched to no instruction is "unmatched". The categories sum
to the kernels' time per step; the busy time counts overlapping kernels once. Writes
results/profile_gpt2.{json,md} (ms per step and share by category).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile
from typing import NamedTuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # noqa: E402

import jaxformer as jf  # noqa: E402
from jaxformer.markdown import table  # noqa: E402
from jaxformer.train import loop  # noqa: E402

KINDS = {  # first match wins, on the lower-cased operation name (ynn: XLA CPU's YNNPACK dots)
    "matrix products": ("ynn", "dot", "gemm", "matmul", "convolution"),
    "layout copies": ("copy", "transpose"),
    "random bits": ("rng", "threefry", "random"),
    "reductions": ("reduce",),
}


def kind_of(name: str) -> str:
    low = name.lower()
    return next(
        (k for k, keys in KINDS.items() if any(key in low for key in keys)), "other fusions"
    )


def xla_events(trace_file: pathlib.Path) -> list[dict]:
    """The complete events ("X") of the XLA runtime threads, with their thread's name."""
    events = json.load(gzip.open(trace_file))
    events = events["traceEvents"] if isinstance(events, dict) else events
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = []
    for e in events:
        thread = threads.get((e.get("pid"), e.get("tid")), "")
        name = e.get("name", "")
        container = "::" in name or name.startswith("end:")  # the executor's own spans
        if e.get("ph") == "X" and "python" not in thread.lower() and e.get("dur") and not container:
            out.append(dict(name=e["name"], thread=thread, ts=e["ts"], dur=e["dur"]))
    return out


def summarise(events: list[dict]) -> dict:
    by_kind = collections.Counter()
    by_name = collections.Counter()
    for e in events:
        by_kind[kind_of(e["name"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
    total = sum(by_kind.values())
    return dict(
        busy_ms=round(total / 1e3, 2),
        span_ms=round(
            (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e3, 2
        ),
        shares={k: round(v / total, 3) for k, v in by_kind.most_common()},
        top_operations=[(n, round(v / 1e3, 2)) for n, v in by_name.most_common(10)],
    )


# The GPT-2 profile: each device operation (a GPU kernel; an XLA operation on a CPU) sorted
# by the optimized HLO instruction it runs.

ROLES = (
    "Q/K/V projection",
    "attention output",
    "feed-forward in",
    "feed-forward out",
    "LM head",
    "other",
)
PASSES = ("forward", "backward dX", "backward dW")
MATMULS = tuple(f"matmul: {role}, {p}" for role in ROLES for p in PASSES)
CATEGORIES = (
    *MATMULS,
    "attention",
    "loss",
    "norms/elementwise",
    "optimizer",
    "copies",
    "unmatched",
)
ATTENTION = ("fmha", "attention", "flash", "mosaic", "splash", "sdpa")  # kernels, targets
COPIES = ("copy", "transpose", "dynamic-update-slice", "dynamic_update_slice")
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"[a-z]\w*\[([\d,]*)\]")
_TABLES = ("FileNames", "FileLocations", "StackFrames")


class Instruction(NamedTuple):
    """One instruction of an optimized HLO module: its result arrays' shapes, its operands'
    names, its op_name, custom-call target, fusion kind (the backend's, else HLO's), and the
    file of its innermost stack frame."""

    name: str
    opcode: str
    shapes: tuple[tuple[int, ...], ...]
    operands: tuple[str, ...]
    op_name: str
    target: str
    kind: str
    file: str


def parse_hlo(text: str) -> tuple[dict[str, Instruction], list[str]]:
    """Every instruction of an optimized HLO module's text by name, and the names of the
    entry computation's instructions in schedule order."""
    frames, hlo, entry, in_entry = _frames(text), {}, [], False
    for line in text.splitlines():
        in_entry = line.startswith("ENTRY") or (in_entry and not line.startswith("}"))
        m = _LINE.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        hlo[name] = Instruction(
            name,
            opcode,
            tuple(tuple(int(d) for d in dims.split(",") if d) for dims in _ARRAY.findall(shape)),
            tuple(re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])),
            _field(r'op_name="([^"]*)"', rest),
            _field(r'custom_call_target="([^"]*)"', rest),
            _field(r'"kind":"([^"]*)"', rest) or _field(r"kind=(\w+)", rest),
            frames.get(_field(r"stack_frame_id=(\d+)", rest), ""),
        )
        if in_entry:
            entry.append(name)
    return hlo, entry


def _field(pattern: str, text: str) -> str:
    """The first group of `pattern`'s first match in `text`, or ""."""
    m = re.search(pattern, text)
    return m.group(1) if m else ""


def _frames(text: str) -> dict[str, str]:
    """{stack frame id: its file} from the module's stack frame tables, if it has them."""
    tables, section = {t: {} for t in _TABLES}, None
    for line in text.splitlines():
        if line in _TABLES:
            section = line
        elif section and " " in line:
            key, value = line.split(" ", 1)
            tables[section][key] = value.strip('"')
        else:
            section = None
    out = {}
    for frame, value in tables["StackFrames"].items():
        location = tables["FileLocations"][re.search(r"file_location_id=(\d+)", value)[1]]
        out[frame] = tables["FileNames"][re.search(r"file_name_id=(\d+)", location)[1]]
    return out


def category_of(i: Instruction, hlo: dict[str, Instruction], s: dict) -> str:
    """The category of one instruction, given the model's sizes `s` (lm_throughput.sizes).
    Attention: an array of the [B, H, T, T] scores; matrix products by role and pass
    (`matmul_category`); attention again: an attention kernel's call or op_name; the
    optimizer: its named scope or optax's code (not optax's losses); the loss: its scope, code
    in a losses file, or an array of the [B, T, V] logits; copies and transposes; the
    rest is norms/elementwise."""
    arrays = [*i.shapes, *(hlo[o].shapes[0] for o in i.operands if o in hlo and hlo[o].shapes)]
    scores = s["batch"] * s["heads"] * s["context"] ** 2
    if any(a[-2:] == (s["context"],) * 2 and math.prod(a) == scores for a in arrays):
        return "attention"
    if _is_matmul(i):
        return matmul_category(i, hlo, s)
    if any(k in f"{i.name} {i.target} {i.op_name}".lower() for k in ATTENTION):
        return "attention"
    if _scope("optimizer").search(i.op_name) or ("optax" in i.file and "losses" not in i.file):
        return "optimizer"
    logits = s["batch"] * s["context"] * s["vocab"]
    if (
        _scope("loss").search(i.op_name)
        or "losses" in i.file
        or any(s["vocab"] in a and math.prod(a) == logits for a in arrays)
    ):
        return "loss"
    if i.opcode in COPIES or i.op_name.rsplit("/", 1)[-1] in COPIES:
        return "copies"
    return "norms/elementwise"


def _is_matmul(i: Instruction) -> bool:
    """A dot, a cuBLAS call, or a GEMM fusion (XLA GPU's Triton GEMMs, XLA CPU's YNNPACK
    fusions)."""
    return (
        i.opcode in ("dot", "convolution")
        or "cublas" in i.target
        or any(k in i.kind for k in ("gemm", "ynn"))
    )


def _scope(name: str) -> re.Pattern:
    """A named scope in op_name, also under transformations: "jvp(loss)", "transpose(...)"."""
    return re.compile(rf"(^|[/(]){name}($|[/)])")


def matmul_category(i: Instruction, hlo: dict[str, Instruction], s: dict) -> str:
    """ "matmul: ROLE, PASS" of a matrix product by its shapes. The pass: forward, or (op_name
    under transpose(...)) backward dX (it writes [tokens, features]) or dW (it sums over
    the tokens). The role: the layer's (input, output) features, E -> 3E Q/K/V, E -> E
    attention output (an unfused Q, K or V projection looks the same), E -> F and F -> E
    feed-forward, E -> V the LM head; for dW the input is the operand from the forward
    pass (X in X^T dY)."""
    tokens = s["batch"] * s["context"]
    out = i.shapes[0]
    operands = [hlo[o] for o in i.operands if o in hlo and len(hlo[o].shapes[0]) >= 2]
    if "transpose(" not in i.op_name:
        step = "forward"
    else:
        step = "backward dX" if _has_tokens(out, s) else "backward dW"
    if step == "backward dW":  # X^T dY: X, from the forward pass, has the input features
        xs = sorted(operands, key=lambda o: _in_backward(o, hlo))
        features = [math.prod(o.shapes[0]) / tokens for o in xs]
    else:  # X W = Y or dY W^T = dX: the activation operand's features and the output's
        acts = [o.shapes[0] for o in operands if _has_tokens(o.shapes[0], s)]
        both = acts and _has_tokens(out, s)
        features = [math.prod(a) / tokens for a in (acts[0], out)] if both else []
        features = features[::-1] if step == "backward dX" else features
    role = _role(*features[:2], s) if len(features) >= 2 else "other"
    return f"matmul: {role}, {step}"


def _role(a: float, b: float, s: dict) -> str:
    """The layer of a matrix product with `a` input and `b` output features."""
    E, F = s["d_model"], s["d_ff"]
    if (a, b) in ((E, F), (F, E)):
        return "feed-forward in" if a == E else "feed-forward out"
    roles = {(E, 3 * E): "Q/K/V projection", (E, E): "attention output", (E, s["vocab"]): "LM head"}
    return roles.get((a, b)) or roles.get((b, a)) or "other"


def _has_tokens(shape: tuple[int, ...], s: dict) -> bool:
    """Whether an array has a token axis: B * T, or B and T side by side."""
    B, T = s["batch"], s["context"]
    return B * T in shape or any(shape[k : k + 2] == (B, T) for k in range(len(shape) - 1))


def _in_backward(i: Instruction, hlo: dict[str, Instruction]) -> bool:
    """Whether `i`, seen through bitcasts, tuple elements and copies, is computed in the
    backward pass (its op_name is under transpose(...))."""
    while i.opcode in ("bitcast", "get-tuple-element", "copy") and i.operands[0] in hlo:
        i = hlo[i.operands[0]]
    return "transpose(" in i.op_name


def device_events(trace_file: pathlib.Path, module: str | None = None) -> list[dict]:
    """The device operations of a jax.profiler trace (Perfetto JSON): complete events ("X")
    with an HLO op (args hlo_op: the instruction, or the command buffer, a CUDA graph, that
    launched a GPU kernel) of the HLO module `module` (all, if None): name (the kernel's),
    op, launch (correlation or run id), start and duration (µs)."""
    events = json.load(gzip.open(trace_file))
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = []
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and module in (None, args.get("hlo_module")):
            launch = args.get("correlation_id", args.get("run_id"))
            out.append(
                dict(name=e["name"], op=args["hlo_op"], launch=launch, ts=e["ts"], dur=e["dur"])
            )
    return out


def categorise(events: list[dict], hlo_text: str, s: dict) -> list[str]:
    """The category of each of the device events of the module `hlo_text`: an event whose
    op is an instruction (XLA's CPU operations, GPU kernels launched one by one) has that
    instruction's; a kernel XLA generated is named after its instruction ("." and "-" as
    "_"); the other kernels of each command-buffer launch, of cuBLAS, cuDNN and the runtime,
    are read in time order (`_library`)."""
    hlo, entry = parse_hlo(hlo_text)
    names = {n: category_of(i, hlo, s) for n, i in hlo.items()}
    kernels = {re.sub(r"[.\-]", "_", n): c for n, c in names.items()}
    out = [names.get(e["op"]) or kernels.get(e["name"]) for e in events]
    launches = collections.defaultdict(list)
    for k, e in enumerate(events):
        if out[k] is None:
            launches[e["op"], e["launch"]].append(k)
    gemms = [names[n] for n in entry if "cublas" in hlo[n].target]
    cudnn = {names[n] for n in entry if "cudnn" in hlo[n].target}
    cudnn = cudnn.pop() if len(cudnn) == 1 else "unmatched"
    for launch in launches.values():
        launch.sort(key=lambda k: events[k]["ts"])
        kinds = _library([events[k]["name"] for k in launch], gemms, cudnn)
        for k, category in zip(launch, kinds, strict=True):
            out[k] = category
    return out


def _library(kernels: list[str], gemms: list[str], cudnn: str) -> list[str]:
    """The categories of one command-buffer launch's kernels that no instruction names, in
    time order: memsets and memcpys are copies; cuDNN's kernels have the category of the
    module's cuDNN calls (`cudnn`, if they share one); other attention kernels (by name) are
    attention; each other kernel runs the next cuBLAS call of the entry computation's
    schedule (their categories: `gemms`), and a split-K reduction finishes the GEMM before
    it. Kernels beyond the calls are unmatched."""
    calls, last, out = iter(gemms), "unmatched", []
    for name in kernels:
        low = name.lower()
        if low.startswith("memset") or "memcpy" in low:
            out.append("copies")
        elif "cudnn" in low:
            out.append(cudnn)
        elif any(k in low for k in ATTENTION):
            out.append("attention")
        elif "splitkreduce" in low:
            out.append(last)
        else:
            last = next(calls, "unmatched")
            out.append(last)
    return out


def steps_in(events: list[dict]) -> int:
    """How many times the module ran in the trace: the most common number of launches
    (correlation or run ids) of one op."""
    launches = collections.defaultdict(set)
    for e in events:
        launches[e["op"]].add(e["launch"])
    return collections.Counter(map(len, launches.values())).most_common(1)[0][0]


def busy_us(events: list[dict]) -> float:
    """The time in which at least one of `events` ran (overlaps counted once), in µs."""
    total, end = 0.0, -math.inf
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
        total += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return total


def profile_trace(trace_file: pathlib.Path, hlo_text: str, s: dict) -> dict:
    """ms per step and share by category (`categorise`) of a trace of the module `hlo_text`;
    kernel_ms: the events' durations per step, which the categories sum to; busy_ms: the
    time the device was busy per step (overlapping kernels counted once)."""
    module = re.match(r"HloModule ([\w.\-]+)", hlo_text)[1]
    events = device_events(trace_file, module)
    times, steps = collections.Counter(), steps_in(events)
    for e, category in zip(events, categorise(events, hlo_text, s), strict=True):
        times[category] += e["dur"]
    total = sum(times.values())
    shown = [c for c in CATEGORIES if times[c] or c not in MATMULS]
    return dict(
        steps=steps,
        kernel_ms=round(total / steps / 1e3, 3),
        busy_ms=round(busy_us(events) / steps / 1e3, 3),
        ms={c: round(times[c] / steps / 1e3, 3) for c in shown},
        shares={c: round(times[c] / total, 4) for c in shown},
    )


def profile_gpt2(argv: list[str], out: pathlib.Path) -> dict:
    """Trace one step of lm_throughput's model (argv: its options) after three of warm-up,
    keep the trace and the compiled step's HLO in `out` (profile_gpt2.perfetto.json.gz,
    profile_gpt2.hlo.txt.gz: --trace and --hlo read them again) and profile them."""
    import jax

    lm_throughput = _lm_throughput()
    args = lm_throughput.parse_args(argv)
    s = lm_throughput.sizes(args)
    step, state, batch, _ = lm_throughput.setup(s, args)
    compiled = step.lower(state, batch).compile()
    trace, hlo = out / "profile_gpt2.perfetto.json.gz", out / "profile_gpt2.hlo.txt.gz"
    hlo.write_bytes(gzip.compress(compiled.as_text().encode()))
    for _ in range(3):  # warm-up
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        jax.profiler.stop_trace()
        shutil.copy(next(pathlib.Path(tmp).rglob("perfetto_trace.json.gz")), trace)
    device = dict(device=jax.devices()[0].device_kind, jax=jax.__version__)
    return device | read_profile(trace, hlo, argv)


def read_profile(trace: pathlib.Path, hlo: pathlib.Path, argv: list[str]) -> dict:
    """The profile (`profile_trace`) of a trace and its step's optimized HLO text (gzipped
    or not), for lm_throughput's model of options `argv`."""
    lm_throughput = _lm_throughput()
    s = lm_throughput.sizes(lm_throughput.parse_args(argv))
    text = gzip.decompress(hlo.read_bytes()) if hlo.suffix == ".gz" else hlo.read_bytes()
    summary = dict(trace=str(trace), hlo=str(hlo), argv=argv, sizes=s)
    return summary | profile_trace(trace, text.decode(), s)


def write_profile(summary: dict, out: pathlib.Path) -> None:
    """profile_gpt2.json (the summary) and profile_gpt2.md (its table) in `out`."""
    (out / "profile_gpt2.json").write_text(json.dumps(summary, indent=2))
    rows = [[c, f"{ms:.2f}", f"{summary['shares'][c]:.1%}"] for c, ms in summary["ms"].items()]
    rows.append(["all kernels", f"{summary['kernel_ms']:.2f}", "100%"])
    lines = table(["category", "ms per step", "share"], rows, "lrr")
    lines.append(
        f"\nKernel time per step, the mean over {summary['steps']} traced step(s); the device "
        f"was busy {summary['busy_ms']:.2f} ms per step (overlapping kernels counted once)."
    )
    (out / "profile_gpt2.md").write_text("\n".join(lines) + "\n")


def _lm_throughput():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import lm_throughput

    return lm_throughput


def plot(events: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = sorted({e["thread"] for e in events})
    start = min(e["ts"] for e in events)
    colours = dict(zip([*KINDS, "other fusions"], plt.cm.tab10.colors, strict=False))
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.5 * len(threads)))
    for e in events:
        row = threads.index(e["thread"])
        ax.barh(
            row, e["dur"] / 1e3, left=(e["ts"] - start) / 1e3, color=colours[kind_of(e["name"])]
        )
    labels = [f"{t.split('/')[0].removeprefix('tf_')} #{i}" for i, t in enumerate(threads)]
    ax.set_yticks(range(len(threads)), labels)
    ax.set_xlabel("ms into the traced step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=5)
    fig.suptitle("One training step of make train's model on XLA's CPU runtime, by thread")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def profile_dates(steps: int, out: pathlib.Path, repeats: int = 1) -> dict:
    """Train the dates job for `steps` steps, the last traced, `repeats` times (fresh
    runs); the operations of each traced step by kind. Writes profile_step.json as a docs
    results file (a row per run), and the last run's timeline picture."""
    runs = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            run = jf.RunConfig.from_options(
                task="dates",
                steps=steps,
                profile=f"{steps - 1}:{steps}",
                eval_every=10**6,
                eval_examples=64,
                log_every=10**6,
                out=f"{tmp}/run",
            )
            loop.train(jf.TransformerConfig.tiny(259), run, progress=False)
            trace = next(pathlib.Path(tmp, "run", "profile").rglob("perfetto_trace.json.gz"))
            events = xla_events(trace)
        runs.append(summarise(events))
    plot(events, out / "profile_step.png")
    result = docs_result(runs, steps, repeats)
    (out / "profile_step.json").write_text(json.dumps(result, indent=2) + "\n")
    return {"shares": [r["shares"] for r in runs], "span_ms": [r["span_ms"] for r in runs]}


def docs_result(runs: list[dict], steps: int, repeats: int) -> dict:
    """The docs' results file of the dates profiles: each run's step time and its shares."""
    kinds = [*KINDS, "other fusions"]
    rows = [
        [str(i), f"{r['span_ms']:.0f}", f"{r['busy_ms']:.0f}"]
        + [f"{r['shares'].get(k, 0):.1%}" for k in kinds]
        for i, r in enumerate(runs, 1)
    ]
    cpu = ", ".join(f"{k} {v}" for k, v in _machine().items())
    return {
        "command": f"python experiments/profile_step.py --steps {steps} --repeats {repeats}",
        "device": cpu,
        "versions": {"jax": jax.__version__},
        "date": datetime.date.today().isoformat(),
        "source": "each run a fresh `make train` job (the dates task, the tiny preset, batch "
        f"64) traced at its step {steps} with `--profile {steps - 1}:{steps}`",
        "tables": [
            {
                "caption": "One training step of `make train`'s model in XLA's CPU trace: its "
                "wall time (first to last operation), the operations' summed time (busy, "
                "over the runtime threads), and each kind's share of the busy time:",
                "columns": ["run", "step ms", "busy ms", *kinds],
                "align": "r" * (3 + len(kinds)),
                "rows": rows,
            }
        ],
    }


def _machine() -> dict:
    """The CPU's model name and core count, and the load average when profiled."""
    name = next(
        (
            line.split(":", 1)[1].strip()
            for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "a CPU",
    )
    return {"cpu": name, "cores": os.cpu_count(), "load average": f"{os.getloadavg()[0]:.1f}"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1, help="fresh runs of the dates job")
    parser.add_argument("--out", default="results")
    parser.add_argument("--gpt2", action="store_true", help="lm_throughput's model; see above")
    parser.add_argument("--trace", type=pathlib.Path, help="read this GPT-2 trace (with --hlo)")
    parser.add_argument("--hlo", type=pathlib.Path, help="the traced step's optimized HLO text")
    args, rest = parser.parse_known_args(argv)
    if (args.trace is None) != (args.hlo is None):
        parser.error("--trace and --hlo go together")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.gpt2 or args.trace:
        summary = (
            read_profile(args.trace, args.hlo, rest) if args.trace else profile_gpt2(rest, out)
        )
        write_profile(summary, out)
        print(json.dumps({k: summary[k] for k in ("kernel_ms", "busy_ms", "ms")}))
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    print(json.dumps(profile_dates(args.steps, out, args.repeats)))


if __name__ == "__main__":
    main()
