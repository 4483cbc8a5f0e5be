"""`jaxformer bench lm-throughput`: training throughput and MFU of a decoder-only LM of
GPT-2-small's shape (TransformerConfig.gpt2_small: 12 layers, d_model 768, 12 heads,
d_ff 3072, context 1024, vocabulary 50304, 124M parameters), bfloat16 compute with
float32 parameters and AdamW state, one jitted step with donated state (shared.lm_step);
--quick is its shape at the tiny preset's size, a CPU in seconds.

The step is compiled ahead (its compile time and XLA's `memory_analysis()`: temp_bytes,
the step's temporaries), then timed over --steps calls after one of warm-up (stats): the
median with its interval. FLOPs and MFU: jaxformer_lab.bench.shared (MFU null where the
device's peak is unknown, as on a CPU). --xla-flags sets XLA_FLAGS before JAX starts its
backend (in a fresh process: the command); --memory-only compiles and reports memory
without running a step.
"""

from __future__ import annotations

import dataclasses
import os
import time

from jaxformer.checks import check_int
from jaxformer_lab.bench import shared
from jaxformer_lab.bench.registry import BENCHMARKS, say, setting
from jaxformer_lab.results import Record, Table, capture


@dataclasses.dataclass(frozen=True)
class LMThroughputOptions(shared.LMOptions):
    steps: int = setting(20, "timed steps")
    xla_flags: str | None = setting(None, "XLA_FLAGS for this run (before JAX starts)")
    memory_only: bool = setting(False, "compile and report memory, run no step")

    def __post_init__(self):
        super().__post_init__()
        check_int("--steps", self.steps)


@BENCHMARKS.register("lm-throughput", LMThroughputOptions)
def run(options: LMThroughputOptions) -> Record:
    """Training throughput and MFU of a GPT-2-small-shaped language model."""
    if options.xla_flags is not None:
        os.environ["XLA_FLAGS"] = options.xla_flags
    import jax

    step, state, batch, n_params = shared.lm_step(options)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    memory = compiled.memory_analysis()
    result = dict(
        options.sizes(),
        params=n_params,
        remat=options.remat,
        scan=options.scan,
        attention=options.attention,
        lm_head=options.lm_head,
        resolved=shared.resolved(options),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        compile_seconds=round(time.perf_counter() - t0, 2),
        temp_bytes=None if memory is None else int(memory.temp_size_in_bytes),
    )
    say(f"compiled in {result['compile_seconds']} s; {n_params:,} parameters")
    if not options.memory_only:
        device = jax.devices()[0].device_kind
        result |= timed(compiled, state, batch, options, n_params, device)
    return capture([table(result)], data=result | {"headline": headline(result)})


def timed(compiled, state, batch, options: LMThroughputOptions, n_params: int, device: str) -> dict:
    """The step's median time over --steps calls after one of warm-up, with its interval,
    and what follows from it."""
    import jax

    box = {"state": state}

    def call():
        box["state"], metrics = compiled(box["state"], batch)
        box["loss"] = jax.block_until_ready(metrics)["loss"]

    seconds = shared.time_one(call, options.steps)
    s = options.sizes()
    tokens = s["batch"] * s["context"]
    flops = tokens * shared.flops_per_token(n_params, s["layers"], s["context"], s["d_model"])
    step_s, peak = seconds["median"], shared.peak_tflops(device)
    return dict(
        step_ms=round(step_s * 1e3, 2),
        step_ms_ci={k: seconds[k] * 1e3 for k in ("median", "low", "high")}
        | {"n": seconds["n"], "confidence": seconds["confidence"]},
        tokens_per_second=round(tokens / step_s, 1),
        tflops=round(flops / step_s / 1e12, 3),
        peak_tflops=peak,
        mfu=None if peak is None else round(flops / step_s / 1e12 / peak, 4),
        loss=float(box["loss"]),
    )


def table(r: dict) -> Table:
    """One row: the resolved kernels, the step's time with its interval, tokens/s, MFU, memory."""
    ci = r.get("step_ms_ci")
    interval = "" if ci is None else f"{ci['median']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"
    mfu = "" if r.get("mfu") is None else f"{r['mfu']:.1%}"
    temp = "" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2**30:.2f}"
    row = [r["resolved"]["attention"], r["resolved"]["lm_head"], r["batch"], r["remat"]]
    row += [interval, f"{r.get('tokens_per_second', 0):,.0f}" if ci else "", mfu]
    row += [f"{r['compile_seconds']:.1f}", temp]
    columns = ["attention", "LM head", "batch", "remat", "ms / step [95%]", "tokens / s"]
    caption = (
        f"GPT-2-shaped LM training step, {r['params']:,} parameters, {r['layers']} layers, "
        f"d_model {r['d_model']}, batch {r['batch']} x {r['context']} tokens, bfloat16 "
        "compute; attention and LM head as resolved:"
    )
    columns += ["MFU", "compile (s)", "temporaries (GiB)"]
    return Table(columns, [row], "llrlrrrrr", caption=caption)


def headline(r: dict) -> dict:
    keys = ("params", "step_ms", "tokens_per_second", "tflops", "mfu", "temp_bytes")
    return {k: r[k] for k in keys if k in r}
