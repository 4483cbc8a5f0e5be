"""What one training step of `make train`'s model looks like in a `jaxformer train --profile`
trace: where XLA spends the step, by kind of operation, and a timeline picture.

    python experiments/profile_step.py [--steps 12]

Trains the `dates` job (make train's model and batch) for --steps steps with
`profile=f"{steps - 1}:{steps}"` (the last step traced, after warm-up), reads the trace the
run folder holds (perfetto_trace.json.gz: the XLA operations on each runtime thread) and
sorts every operation (the executor's own spans left out) into: matrix products (dot
fusions), layout copies and transposes, random bits (dropout's threefry), reductions,
other fusions (elementwise work fused by XLA). Writes
results/profile_step.{json,md,png}; prints a JSON line with the shares.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jaxformer as jf  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = jf.RunConfig(
            task="dates", steps=args.steps, profile=f"{args.steps - 1}:{args.steps}",
            eval_every=10**6, eval_examples=64, log_every=10**6, out=f"{tmp}/run",
        )  # fmt: skip
        loop.train(jf.TransformerConfig.tiny(259), run, progress=False)
        trace = next(pathlib.Path(tmp, "run", "profile").rglob("perfetto_trace.json.gz"))
        events = xla_events(trace)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(events)
    plot(events, out / "profile_step.png")
    (out / "profile_step.json").write_text(json.dumps(summary, indent=2))
    lines = ["| kind | share of the step's XLA time |", "|---|---:|"]
    lines += [f"| {k} | {v:.0%} |" for k, v in summary["shares"].items()]
    (out / "profile_step.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "top_operations"}))


if __name__ == "__main__":
    main()
