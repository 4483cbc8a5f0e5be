"""What one training step of `make train`'s model looks like in a `jaxformer train --profile`
trace: where XLA spends the step, by kind of operation, and a timeline picture.

    python experiments/profile_step.py [--steps 12]
    python experiments/profile_step.py --gpt2 [lm_throughput.py's options: --batch 32 ...]

Trains the `dates` job (make train's model and batch) for --steps steps with
`profile=f"{steps - 1}:{steps}"` (the last step traced, after warm-up), reads the trace the
run folder holds (perfetto_trace.json.gz: the XLA operations on each runtime thread) and
sorts every operation (the executor's own spans left out) into: matrix products (dot
fusions), layout copies and transposes, random bits (dropout's threefry), reductions,
other fusions (elementwise work fused by XLA). Writes
results/profile_step.{json,md,png}; prints a JSON line with the shares.

With --gpt2 it profiles one training step of experiments/lm_throughput.py's GPT-2-small
model instead (any of that script's options; --quick for its small model), after warm-up
steps, with jax.profiler, and sorts each device operation by the optimized HLO
instruction it runs (`categories`: the instruction's opcode, custom-call target and
`op_name` metadata, in which the train step names the "loss" and "optimizer" scopes) into
attention, optimizer, matrix products, loss, copies, and norms/elementwise. Writes
results/profile_gpt2.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

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


CATEGORIES = ("attention", "optimizer", "matrix products", "loss", "copies", "norms/elementwise")
ATTENTION_KERNELS = ("fmha", "attention", "flash", "mosaic", "splash")  # custom calls, kernels
# ynn: XLA CPU's YNNPACK dot fusions; gemm/cublas: the GPU's; dot_general: in op_name
GEMMS = ("gemm", "cublas", "ynn", "dot(", "dot_general", "convolution", "matmul")
COPIES = ("copy", "transpose", "dynamic-update-slice")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def category_of(instruction: str, score_shape: str) -> str:
    """The category of one optimized-HLO instruction line. Attention: an attention kernel's
    custom call, a dot with batch dimensions (Q K^T and P V), or an operation on
    `score_shape` ("B,H,T,T", the scores); the scopes "optimizer" and "loss" in op_name;
    other dots and GEMM calls are matrix products; then copies; the rest is
    norms/elementwise."""
    low = instruction.lower()
    if (
        any(k in low for k in ATTENTION_KERNELS)
        or _BATCHED_DOT.search(low)
        or f"[{score_shape}]" in low
    ):
        return "attention"
    op_name = re.search(r'op_name="([^"]*)"', instruction)
    op_name = op_name.group(1) if op_name else ""
    if _scope("optimizer").search(op_name):
        return "optimizer"
    if any(k in low for k in GEMMS):
        return "matrix products"
    if _scope("loss").search(op_name):
        return "loss"
    if any(k in low for k in COPIES):
        return "copies"
    return "norms/elementwise"


_BATCHED_DOT = re.compile(r'lhs_batch_dim\w*"?\s*[:=]\s*[\[{]?\s*"?\d')  # HLO text, GPU config


def _scope(name: str) -> re.Pattern:
    """A named scope in op_name, also under transformations: "jvp(loss)", "transpose(...)"."""
    return re.compile(rf"(^|[/(]){name}($|[/)])")


def categories(hlo_text: str, score_shape: str) -> dict[str, str]:
    """{instruction name: category} of every instruction of an optimized HLO module."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            out[m.group(1)] = category_of(line, score_shape)
    return out


def device_events(trace_file: pathlib.Path) -> list[dict]:
    """Complete events ("X") with the HLO instruction they ran (args hlo_op, else the name)."""
    events = json.load(gzip.open(trace_file))
    events = events["traceEvents"] if isinstance(events, dict) else events
    out = []
    for e in events:
        args = e.get("args") or {}
        op = args.get("hlo_op") or e.get("name", "")
        if e.get("ph") == "X" and e.get("dur"):
            out.append(dict(op=op, dur=e["dur"]))
    return out


def profile_gpt2(argv: list[str], out: pathlib.Path) -> dict:
    """Trace one step of lm_throughput's model (argv: its options); shares by category."""
    import jax

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import lm_throughput

    args = lm_throughput.parse_args(argv)
    s = lm_throughput.sizes(args)
    step, state, batch, _ = lm_throughput.setup(s, args)
    compiled = step.lower(state, batch).compile()
    names = categories(
        compiled.as_text(), f"{s['batch']},{s['heads']},{s['context']},{s['context']}"
    )
    for _ in range(3):  # warm-up
        state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        jax.profiler.stop_trace()
        events = device_events(next(pathlib.Path(tmp).rglob("perfetto_trace.json.gz")))
    by_category = collections.Counter()
    for e in events:
        if e["op"] in names:
            by_category[names[e["op"]]] += e["dur"]
    total = sum(by_category.values()) or 1
    summary = dict(
        device=jax.devices()[0].device_kind,
        jax=jax.__version__,
        argv=argv,
        sizes=s,
        operations_ms=round(total / 1e3, 3),
        shares={k: round(by_category[k] / total, 4) for k in CATEGORIES},
    )
    (out / "profile_gpt2.json").write_text(json.dumps(summary, indent=2))
    rows = [[k, f"{v:.1%}"] for k, v in summary["shares"].items()]
    columns = ["category", "share of the step's device operation time"]
    (out / "profile_gpt2.md").write_text("\n".join(table(columns, rows, "lr")) + "\n")
    return summary


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default="results")
    parser.add_argument("--gpt2", action="store_true", help="lm_throughput's model; see above")
    args, rest = parser.parse_known_args(argv)
    if args.gpt2:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(profile_gpt2(rest, out)))
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    with tempfile.TemporaryDirectory() as tmp:
        run = jf.RunConfig.from_options(
            task="dates",
            steps=args.steps,
            profile=f"{args.steps - 1}:{args.steps}",
            eval_every=10**6,
            eval_examples=64,
            log_every=10**6,
            out=f"{tmp}/run",
        )
        loop.train(jf.TransformerConfig.tiny(259), run, progress=False)
        trace = next(pathlib.Path(tmp, "run", "profile").rglob("perfetto_trace.json.gz"))
        events = xla_events(trace)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(events)
    plot(events, out / "profile_step.png")
    (out / "profile_step.json").write_text(json.dumps(summary, indent=2))
    rows = [[k, f"{v:.0%}"] for k, v in summary["shares"].items()]
    lines = table(["kind", "share of the step's XLA time"], rows, "lr")
    (out / "profile_step.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "top_operations"}))


if __name__ == "__main__":
    main()
