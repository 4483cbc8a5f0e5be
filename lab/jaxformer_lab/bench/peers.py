"""`jaxformer bench gpt2-peers`: jaxformer's GPT-2 training step against its peers, in
alternating rounds of one run.

Three programs train lm-throughput's model (its options; bfloat16 compute, float32
parameters and AdamW state) on the same batch:

    jaxformer  shared.lm_step (attention and LM head as --attention, --lm-head: "auto")
    jax        jaxformer_lab.bench.gpt2_jax: a minimal pure-JAX GPT-2 step
    torch      jaxformer_lab.bench.gpt2_torch: a nanoGPT-style PyTorch step, torch.compile'd
               (--torch-mode); skipped, with a note, without torch

Each runs in its own worker process (`rounds`), started and compiled one at a time, and
rounds of --steps steps rotate through them (`stats`): each program's median ms/step,
tokens/s, MFU and peak memory, and jaxformer's time over each peer's as the median of
per-round ratios, with 95% intervals (docs/performance.md, "jaxformer against its peers")."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import sys

from jaxformer.checks import BadValue, check_int, check_number
from jaxformer_lab.bench import rounds, shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, beside, say, setting
from jaxformer_lab.results import Record, Table, capture

PROGRAMS = ("jaxformer", "jax", "torch")
TITLES = {"jaxformer": "jaxformer", "jax": "pure JAX", "torch": "PyTorch"}
# "auto" and gpt2_torch.MODES (not imported here: torch is optional)
TORCH_MODES = ("auto", "eager", "default", "reduce-overhead", "max-autotune")
TORCH_MODES += ("max-autotune-no-cudagraphs",)


@dataclasses.dataclass(frozen=True)
class PeersOptions(shared.LMOptions):
    rounds: int | None = setting(None, "timed rounds, >= 6 (default 30; quick 8)")
    steps: int | None = setting(None, "steps per program per round (default 5; quick 2)")
    torch_mode: str = setting("auto", "torch.compile's mode", choices=TORCH_MODES)
    ready_timeout: float = setting(150.0, "seconds for a program to start and compile")

    def __post_init__(self):
        super().__post_init__()
        if self.steps is not None:
            check_int("--steps", self.steps)
        if self.rounds is not None and (not isinstance(self.rounds, int) or self.rounds < 6):
            raise BadValue(f"--rounds must be >= 6 for a 95% interval, got {self.rounds}")
        check_number("--ready-timeout", self.ready_timeout, "(0, inf)")

    def timing(self) -> tuple[int, int]:
        """(rounds, steps per round), the defaults filled in."""
        return self.rounds or (8 if self.quick else 30), self.steps or (2 if self.quick else 5)


@BENCHMARKS.register("gpt2-peers", PeersOptions)
def run(options: PeersOptions) -> Record:
    """jaxformer's GPT-2 training step against a pure-JAX and a PyTorch step."""
    logs = beside(options, "")
    logs.mkdir(parents=True, exist_ok=True)
    names = [n for n in PROGRAMS if n != "torch" or importlib.util.find_spec("torch")]
    workers, ready = {}, {}
    n_rounds, steps = options.timing()
    try:
        for n in names:  # one at a time: a compile's (and autotuner's) peak needs the memory
            workers[n] = start_worker(n, options)  # the others' would hold
            ready |= rounds.ready_all({n: workers[n]}, options.ready_timeout)
        running = {n: w for n, w in workers.items() if "error" not in ready[n]}
        say(f"ready: {sorted(running)}; timing {n_rounds} rounds of {steps} steps")
        calls = {n: functools.partial(w.run, steps) for n, w in running.items()}
        times = stats.time_interleaved(calls, n_rounds) if calls else {}
    finally:
        for w in workers.values():
            w.close()
    if "torch" not in names:
        ready["torch"] = {"error": "skipped: torch is not installed (the `torch` extra)"}
    result = summarize(options, ready, times)
    return capture([table(result)], data=result | {"headline": headline(result)})


def start_worker(name: str, options: PeersOptions) -> rounds.Worker:
    """A worker process for program `name`, its stderr in the logs folder."""
    # Workers share one GPU: each JAX one preallocates a third (pools grown on demand overshoot).
    env = os.environ | {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    env |= {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.33"}
    if name == "torch":
        env["JAX_PLATFORMS"] = "cpu"  # its imports load JAX: keep it off the GPU
    given = json.dumps(dataclasses.asdict(options))
    code = "import sys; from jaxformer_lab.bench import peers; peers.worker(*sys.argv[1:])"
    command = [sys.executable, "-c", code, name, given]
    return rounds.Worker(name, command, env, open(beside(options, "") / f"{name}.log", "w"))


def build(name: str, options: PeersOptions) -> rounds.Program:
    """Program `name` (in a worker process)."""
    s = options.sizes()
    if name == "jax":
        from jaxformer_lab.bench import gpt2_jax

        return gpt2_jax.program(s)
    if name == "torch":
        from jaxformer_lab.bench import gpt2_torch

        return gpt2_torch.program(s, mode=torch_mode(options.torch_mode))
    return jaxformer_program(options)


def torch_mode(mode: str) -> str:
    """--torch-mode, "auto" resolved: torch.compile's default mode on CUDA, else eager."""
    import torch

    return mode if mode != "auto" else "default" if torch.cuda.is_available() else "eager"


def jaxformer_program(options: PeersOptions) -> rounds.Program:
    """lm-throughput's step, and what its "auto" attention and LM head resolve to."""
    import jax

    from jaxformer_lab.bench.gpt2_jax import peak_bytes

    step, state, batch, n_params = shared.lm_step(options)
    box = [state]

    def run(k: int) -> float:
        for _ in range(k):
            box[0], metrics = step(box[0], batch)
        return float(metrics["loss"])

    info = dict(device=jax.devices()[0].device_kind) | shared.resolved(options)
    return rounds.Program(run, n_params, info, peak_bytes)


def summarize(options: PeersOptions, ready: dict, times: dict) -> dict:
    """The raw figures: each program's, and the paired ratios jaxformer / peer."""
    s, (n_rounds, steps) = options.sizes(), options.timing()
    programs = {n: program_figures(ready[n], times.get(n), steps, s) for n in PROGRAMS}
    ratios = {
        f"jaxformer/{peer}": stats.paired_ratio(times["jaxformer"], times[peer])
        for peer in ("jax", "torch")
        if "jaxformer" in times and peer in times
    }
    ok = [p for p in programs.values() if p["status"] == "ok"]
    return dict(
        device=next((p["device"] for p in ok), None),
        sizes=s,
        params=next((p["params"] for p in ok), None),  # the same in each (tested)
        rounds=n_rounds,
        steps_per_round=steps,
        warmup_rounds=2,
        jaxformer_asked=dict(attention=options.attention, lm_head=options.lm_head),
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
    flops = shared.flops_per_token(ready["params"], s["layers"], s["context"], s["d_model"])
    flops *= s["batch"] * s["context"]
    peak = shared.peak_tflops(ready["device"])
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


def table(r: dict) -> Table:
    """Each program's figures and jaxformer's time over the peer's."""
    asked = r.get("jaxformer_asked", {})
    ratios = r["ratios"]
    rows = [_row(n, p, ratios.get(f"jaxformer/{n}"), asked) for n, p in r["programs"].items()]
    s = r["sizes"]
    caption = (
        f"GPT-2 training step, {r['params'] or 0:,} parameters, batch {s['batch']} x "
        f"{s['context']} tokens, bfloat16 compute, float32 parameters and AdamW state; "
        f"{r['rounds']} paired rounds of {r['steps_per_round']} steps per program (each in "
        "its own process, order rotated each round):"
    )
    columns = ["program", "ms / step [95%]", "tokens / s", "MFU", "compile (s)"]
    columns += ["loss at init", "peak GiB", "jaxformer / program [95%]"]
    return Table(columns, rows, "lrrrrrrr", caption=caption)


def _row(name: str, p: dict, ratio: dict | None, asked: dict) -> list[str]:
    if p["status"] != "ok":
        return [TITLES[name], p["error"], "", "", "", "", "", ""]
    ms = p["step_ms"]
    return [
        f"{TITLES[name]} ({_what(name, p, asked)})",
        _interval(ms, 2),
        f"{p['tokens_per_second']:,.0f}",
        "" if p["mfu"] is None else f"{p['mfu']:.1%}",
        f"{p['compile_s']:.1f}",
        f"{p['initial_loss']:.4f}",
        "" if p["peak_bytes"] is None else f"{p['peak_bytes'] / 2**30:.1f}",
        "" if ratio is None else _interval(ratio, 3),
    ]


def _what(name: str, p: dict, asked: dict) -> str:
    if name == "jaxformer":
        att, head = (" (auto)" * (asked.get(k, "auto") == "auto") for k in ("attention", "lm_head"))
        return f"attention {p['attention']}{att}, head {p['lm_head']}{head}"
    if name == "torch":
        return "eager" if p["mode"] == "eager" else f"torch.compile {p['mode']}"
    return f"attention {p['attention']}"


def _interval(ci: dict, digits: int) -> str:
    return f"{ci['median']:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"


def headline(r: dict) -> dict:
    ms = {n: p["step_ms"]["median"] for n, p in r["programs"].items() if p["status"] == "ok"}
    ratios = {
        k: [round(v[x], 3) for x in ("median", "low", "high")] for k, v in r["ratios"].items()
    }
    return {"step_ms": ms, "ratios": ratios}


def worker(name: str, given: str) -> None:
    """A worker process's side: serve program `name` of the options `given` (JSON)."""
    rounds.serve(functools.partial(build, name, PeersOptions(**json.loads(given))))
