"""One training step's device time by category, read from a jax.profiler trace and the
step's optimized HLO text (`jaxformer bench profile --model gpt2`; the GPU trace fixtures
in tests/fixtures/gpu_traces).

Each device operation is sorted by the HLO instruction it runs: a kernel XLA generated is
named after its instruction; in a GPU command buffer (a CUDA graph) the cuBLAS kernels run
the entry computation's cuBLAS calls in schedule order, and the cuDNN kernels its
attention calls. `category_of` names an instruction's category from its shapes, op_name,
custom-call target and stack frame: matrix products by layer and pass, attention, loss,
norms/elementwise, optimizer, copies; a kernel matched to no instruction is "unmatched".
The categories sum to the kernels' time per step; the busy time counts overlapping
kernels once. Sizes `s` are the language model's (shared.LMOptions.sizes).

The categories in full: docs/performance.md, "The profile by category".
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import pathlib
import re
from typing import NamedTuple

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
    """The category of one instruction, given the model's sizes `s`.
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


def read_profile(trace: pathlib.Path, hlo: pathlib.Path, s: dict) -> dict:
    """The profile (`profile_trace`) of a trace and its step's optimized HLO text (gzipped
    or not), for the language model of sizes `s`."""
    text = gzip.decompress(hlo.read_bytes()) if hlo.suffix == ".gz" else hlo.read_bytes()
    summary = dict(trace=str(trace), hlo=str(hlo), sizes=s)
    return summary | profile_trace(trace, text.decode(), s)
