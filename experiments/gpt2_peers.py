"""jaxformer's GPT-2 training step against its peers, in alternating rounds of one run.

    python experiments/gpt2_peers.py [--quick] [--batch 32] [--layers 12] [--context 1024]
                                     [--rounds 30] [--steps 5] [--torch-mode auto]
                                     [--ready-timeout 150]
                                     [--out results/gpt2_peers]

Three programs train lm_throughput.py's model (its FULL or --quick sizes; bfloat16
compute, float32 parameters and AdamW state) on the same batch:

    jaxformer  lm_throughput.setup's step (attention and LM head "auto")
    jax        jaxformer.bench.gpt2_jax: a minimal pure-JAX GPT-2 step
    torch      jaxformer.bench.gpt2_torch: a nanoGPT-style PyTorch step, torch.compile'd
               (--torch-mode; "auto": "default" on CUDA, eager on a CPU, where compiling
               needs a C++ toolchain and minutes); skipped, with a note, without torch

The two peers start from the same weights (their losses at initialisation agree to
bfloat16's precision; jaxformer's own initialisation differs). Each program runs in its
own worker process (jaxformer.bench.rounds: no fight over GPU memory, JAX's preallocation
off; the workers start and compile one at a time, as compiling at once ran an H100 out of
memory); after two warm-up rounds each round asks every
worker in turn (order rotated by one each round) for --steps steps and times it
(`time_interleaved`: the steps are dispatched back to back and waited for once, plus a
pipe round trip of well under a millisecond). Per program: the median ms/step over
rounds with its 95% interval, tokens/s, MFU (lm_throughput's FLOP formula and peak
table), the most device memory it held (GPUs); per peer: the ratio of jaxformer's time
to the peer's, the median of the per-round ratios with its 95% interval (the rounds are
the pairs: what varied is the round). Compile seconds are each worker's first step less
its median step. A program not ready (started, built, first step taken) within
--ready-timeout seconds is stopped and reported as such, and the others run their rounds
without it: inside the GPU report's 4-minute part a slow torch.compile does not cost the
whole table. The three share one GPU's memory; one that does not fit fails its first
step, and its row says so.

Writes --out/gpt2_peers.json (device, versions, date, command, what jaxformer's "auto"
resolved to) and gpt2_peers.md; prints a final JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import os
import pathlib
import shlex
import sys
from importlib import metadata

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import lm_throughput  # noqa: E402

from jaxformer import results  # noqa: E402
from jaxformer.bench import rounds, stats  # noqa: E402

PROGRAMS = ("jaxformer", "jax", "torch")
TITLES = {"jaxformer": "jaxformer", "jax": "pure JAX", "torch": "PyTorch"}
SIZE_FLAGS = ("batch", "layers", "context")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="lm_throughput's small model (CPU)")
    for name in SIZE_FLAGS:
        p.add_argument(f"--{name}", type=int, help=f"lm_throughput's --{name}")
    p.add_argument("--rounds", type=int, help="timed rounds (default 30; quick 8)")
    p.add_argument("--steps", type=int, help="steps per program per round (default 5; quick 2)")
    # "auto" and gpt2_torch.MODES (not imported here: torch is optional)
    modes = ("auto", "eager", "default", "reduce-overhead", "max-autotune")
    modes += ("max-autotune-no-cudagraphs",)
    p.add_argument("--torch-mode", default="auto", choices=modes, help="torch.compile mode")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=150.0,
        help="seconds for a program to start and compile; a later one is left out (default 150)",
    )
    p.add_argument("--lm-head", default="auto", help="jaxformer's LM head (lm_throughput's)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/gpt2_peers"))
    p.add_argument("--worker", choices=PROGRAMS, help=argparse.SUPPRESS)  # a worker process
    args = p.parse_args(argv)
    for name in (*SIZE_FLAGS, "rounds", "steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.rounds is not None and args.rounds < 6:
        p.error(f"--rounds must be >= 6 for a 95% interval of the median, got {args.rounds}")
    args.rounds = args.rounds or (8 if args.quick else 30)
    args.steps = args.steps or (2 if args.quick else 5)
    return args


def size_flags(args) -> list[str]:
    """lm_throughput's options for these sizes (the workers' argv too)."""
    flags = ["--quick"] if args.quick else []
    flags += ["--lm-head", args.lm_head]
    for name in SIZE_FLAGS:
        if getattr(args, name) is not None:
            flags += [f"--{name}", str(getattr(args, name))]
    return flags


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        return rounds.serve(functools.partial(build, args.worker, args))
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in PROGRAMS if n != "torch" or importlib.util.find_spec("torch")]
    workers, ready = {}, {}
    try:
        for n in names:  # one at a time: a compile's (and autotuner's) peak needs the memory
            workers[n] = start_worker(n, args)  # the others' would hold (an H100 ran out)
            ready |= rounds.ready_all({n: workers[n]}, args.ready_timeout)
        running = {n: w for n, w in workers.items() if "error" not in ready[n]}
        calls = {n: functools.partial(w.run, args.steps) for n, w in running.items()}
        times = stats.time_interleaved(calls, args.rounds) if calls else {}
    finally:
        for w in workers.values():
            w.close()
    if "torch" not in names:
        ready["torch"] = {"error": "skipped: torch is not installed (the `torch` extra)"}
    command = [sys.executable, *sys.argv] if argv is None else [__file__, *argv]
    result = summarize(args, ready, times, shlex.join(command))
    (args.out / "gpt2_peers.json").write_text(json.dumps(result, indent=2))
    (args.out / "gpt2_peers.md").write_text(record(result).markdown())
    print(json.dumps(result))
    return result


def start_worker(name: str, args) -> rounds.Worker:
    """A worker process for program `name`, its stderr in --out/<name>.log."""
    # Several on one GPU: each JAX worker preallocates a third of its memory (a pool grown
    # on demand reserves regions well past its peak: two and torch ran an H100 out of memory).
    env = os.environ | {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    env |= {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.33"}
    if name == "torch":
        env["JAX_PLATFORMS"] = "cpu"  # its imports load JAX: keep it off the GPU
    command = [sys.executable, __file__, "--worker", name, *size_flags(args)]
    command += ["--torch-mode", args.torch_mode]
    return rounds.Worker(name, command, env, open(args.out / f"{name}.log", "w"))


def build(name: str, args) -> rounds.Program:
    """Program `name` (in a worker process)."""
    ns = lm_throughput.parse_args(size_flags(args))
    s = lm_throughput.sizes(ns)
    if name == "jax":
        from jaxformer.bench import gpt2_jax

        return gpt2_jax.program(s)
    if name == "torch":
        from jaxformer.bench import gpt2_torch

        return gpt2_torch.program(s, mode=torch_mode(args.torch_mode))
    return jaxformer_program(s, ns)


def torch_mode(mode: str) -> str:
    """--torch-mode, "auto" resolved: torch.compile's default mode on CUDA, else eager."""
    import torch

    return mode if mode != "auto" else "default" if torch.cuda.is_available() else "eager"


def jaxformer_program(s: dict, ns) -> rounds.Program:
    """lm_throughput's step, and what its "auto" attention and LM head resolve to."""
    import jax

    from jaxformer.bench.gpt2_jax import peak_bytes

    step, state, batch, n_params = lm_throughput.setup(s, ns)
    box = [state]

    def run(k: int) -> float:
        for _ in range(k):
            box[0], metrics = step(box[0], batch)
        return float(metrics["loss"])

    info = dict(device=jax.devices()[0].device_kind)
    info |= lm_throughput.resolved(s, ns.attention, ns.lm_head)
    return rounds.Program(run, n_params, info, peak_bytes)


def summarize(args, ready: dict, times: dict, command: str) -> dict:
    """The JSON record: each program's figures and the ratios jaxformer / peer."""
    s = lm_throughput.sizes(lm_throughput.parse_args(size_flags(args)))
    programs = {n: program_figures(ready[n], times.get(n), args.steps, s) for n in PROGRAMS}
    ratios = {
        f"jaxformer/{peer}": stats.paired_ratio(times["jaxformer"], times[peer])
        for peer in ("jax", "torch")
        if "jaxformer" in times and peer in times
    }
    versions = {p: _version(p) for p in ("jax", "jaxlib", "flax", "optax", "torch")}
    ok = [p for p in programs.values() if p["status"] == "ok"]
    return dict(
        benchmark="gpt2_peers",
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=command,
        device=next((p["device"] for p in ok), None),
        versions=versions,
        sizes=s,
        params=next((p["params"] for p in ok), None),  # the same in each (tested)
        rounds=args.rounds,
        steps_per_round=args.steps,
        warmup_rounds=2,
        jaxformer_asked=dict(attention="auto", lm_head=args.lm_head),
        jaxformer_auto={k: programs["jaxformer"].get(k) for k in ("attention", "lm_head")},
        programs=programs,
        ratios=ratios,
    )


def program_figures(ready: dict, seconds: list[float] | None, steps: int, s: dict) -> dict:
    """A program's record: status, what its worker said, and its timings' figures."""
    if "error" in ready:
        return {"status": "failed", **ready}
    step_ms = [1e3 * t / steps for t in seconds]
    median = stats.median_ci(step_ms)
    flops = lm_throughput.flops_per_token(ready["params"], s["layers"], s["context"], s["d_model"])
    flops *= s["batch"] * s["context"]
    peak = lm_throughput.peak_tflops(ready["device"])
    tflops = flops / median["median"] / 1e9
    return dict(
        status="ok",
        **{k: v for k, v in ready.items() if k != "ready"},
        compile_s=ready["first_step_s"] - median["median"] / 1e3,
        step_ms=median,
        round_step_ms=step_ms,
        tokens_per_second=s["batch"] * s["context"] / median["median"] * 1e3,
        tflops=tflops,
        mfu=None if peak is None else tflops / peak,
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def record(r: dict, source: str = "gpt2_peers.json") -> results.Record:
    """The table as a results record: each program's figures and jaxformer's time over
    the peer's (the docs render it; `source` names the JSON it was made from)."""
    rows, asked = [], r.get("jaxformer_asked", {})
    for name, p in r["programs"].items():
        if p["status"] != "ok":
            rows.append([TITLES[name], p["error"], "", "", "", "", "", ""])
            continue
        ms, ratio = p["step_ms"], r["ratios"].get(f"jaxformer/{name}")
        rows.append(
            [
                f"{TITLES[name]} ({_what(name, p, asked)})",
                f"{ms['median']:.2f} [{ms['low']:.2f}, {ms['high']:.2f}]",
                f"{p['tokens_per_second']:,.0f}",
                "" if p["mfu"] is None else f"{p['mfu']:.1%}",
                f"{p['compile_s']:.1f}",
                f"{p['initial_loss']:.4f}",
                "" if p["peak_bytes"] is None else f"{p['peak_bytes'] / 2**30:.1f}",
                "" if ratio is None else _interval(ratio),
            ]
        )
    s = r["sizes"]
    columns = ["program", "ms / step [95%]", "tokens / s", "MFU", "compile (s)"]
    columns += ["loss at init", "peak GiB", "jaxformer / program [95%]"]
    caption = (
        f"GPT-2 training step, {r['params'] or 0:,} parameters, "
        f"batch {s['batch']} x {s['context']} tokens, bfloat16 compute, float32 parameters "
        f"and AdamW state; {r['rounds']} paired rounds of {r['steps_per_round']} steps per "
        "program (each in its own process, order rotated each round):"
    )
    return results.Record(
        tables=[results.Table(columns, rows, "lrrrrrrr", caption)],
        command=r["command"],
        device=r["device"] or "none ready",
        date=r["date"],
        source=source,
        versions={k: v for k, v in r["versions"].items() if v},
    )


def _what(name: str, p: dict, asked: dict) -> str:
    if name == "jaxformer":
        att, head = (" (auto)" * (asked.get(k, "auto") == "auto") for k in ("attention", "lm_head"))
        return f"attention {p['attention']}{att}, head {p['lm_head']}{head}"
    if name == "torch":
        return "eager" if p["mode"] == "eager" else f"torch.compile {p['mode']}"
    return f"attention {p['attention']}"


def _interval(ci: dict) -> str:
    return f"{ci['median']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]"


if __name__ == "__main__":
    main()
