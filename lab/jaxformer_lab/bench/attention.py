"""`jaxformer bench attention`: attention implementations side by side: time and memory
of forward + backward, and their agreement with the plain one, for sequence lengths 256
to 16384 (32768 on a GPU).

Causal self-attention, batch 1, 8 heads, head dim 64, float32 (on an NVIDIA GPU also
bfloat16; tokamax's kernels skipped, with the reason, where they cannot run). For each
length and implementation the jitted gradient of sum(out * cotangent) with respect to q,
k and v is compiled; the temporaries of XLA's `memory_analysis()` are its memory. A
program over --max-gib is compiled, not run. The programs of one length are timed in
interleaved rounds (stats), each also over xla's of the same dtype, round by round. On a
GPU whose peak is known (shared.PEAK_TFLOPS) a row also gives the forward pass's % of it;
on a Linux CPU the full run measures the largest chunked program's resident memory in a
fresh process. The method in full: docs/performance.md, "How the benchmarks measure".
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys
import time

from jaxformer.checks import check_int, check_number
from jaxformer_lab.bench import shared, stats
from jaxformer_lab.bench.registry import BENCHMARKS, Options, say, setting
from jaxformer_lab.results import Record, Table, capture

B, H, D = 1, 8, 64
GIB = 2**30
REFUSED = (NotImplementedError, ValueError, TypeError, ImportError)  # a kernel refuses the call


@dataclasses.dataclass(frozen=True)
class AttentionOptions(Options):
    quick: bool = setting(False, "lengths 256 to 2048 run, 16384 compiled only (a CPU in minutes)")
    max_gib: float | None = setting(
        None, "run only programs with fewer temporaries (CPU 4, GPU 24)"
    )
    lengths: tuple[int, ...] = setting((), "these sequence lengths only")
    rounds: int | None = setting(None, "timed rounds (default: GPU 10; CPU 5, 2 above T=2048)")

    def __post_init__(self):
        super().__post_init__()
        for T in self.lengths:
            check_int("--lengths", T)
        if self.rounds is not None:
            check_int("--rounds", self.rounds)
        if self.max_gib is not None:
            check_number("--max-gib", self.max_gib, "[0, inf)")


@BENCHMARKS.register("attention", AttentionOptions)
def run(options: AttentionOptions) -> Record:
    """Attention kernels: time and memory of forward + backward, and agreement with xla."""
    import jax

    gpu = jax.default_backend() == "gpu"
    lengths = options.lengths or default_lengths(options.quick, gpu)
    max_bytes = int(
        (options.max_gib if options.max_gib is not None else 24.0 if gpu else 4.0) * GIB
    )
    rows = []
    for T in lengths:
        limit = max_bytes if T < 16384 or not options.quick else 0  # quick: compile only
        rounds = options.rounds or (10 if gpu else 5 if T <= 2048 else 2)
        rows += measure_length(T, implementations(gpu), limit, rounds)
    on_linux_cpu = not gpu and sys.platform == "linux"
    rss = (
        [peak_rss_subprocess("chunked", max(lengths))] if on_linux_cpu and not options.quick else []
    )
    result = dict(shape=dict(B=B, H=H, D=D, causal=True), rows=rows, peak_rss=rss)
    return capture([table(rows)], data=result | {"headline": headline(rows, rss)})


def default_lengths(quick: bool, gpu: bool) -> tuple[int, ...]:
    if quick:
        return (256, 1024, 2048, 16384)
    return (256, 512, 1024, 2048, 4096, 8192, 16384) + ((32768,) if gpu else ())


def implementations(gpu: bool) -> list[tuple[str, str]]:
    """(implementation, dtype) pairs: xla first (the reference of its dtype)."""
    impls = [("xla", "float32"), ("chunked", "float32")]
    if gpu:
        impls += [("xla", "bfloat16"), ("chunked", "bfloat16"), ("cudnn", "bfloat16")]
    # tokamax's kernels (the kernels extra); where a device cannot run one, its row says why.
    return impls + [("tokamax_mosaic", "bfloat16"), ("tokamax_triton", "bfloat16")]


def causal_flops(T: int, backward: bool) -> float:
    """Matrix-product FLOPs of causal attention [B, T, H, D]: q k^T and p v, half the
    square; the backward pass has 2.5 times the forward's products."""
    forward = 2 * 2 * B * H * T * T * D / 2
    return forward * (3.5 if backward else 1.0)


def grad_fn(implementation: str):
    """(q, k, v, cotangent) -> (out, dq, dk, dv) of causal self-attention, jitted."""
    import jax
    import jax.numpy as jnp

    from jaxformer.functional import scaled_dot_product_attention

    def loss(q, k, v, ct):
        out = scaled_dot_product_attention(q, k, v, causal=True, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    def fn(q, k, v, ct):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, ct)
        return (out, *grads)

    return jax.jit(fn)


def forward_fn(implementation: str):
    """(q, k, v) -> out of causal self-attention, jitted."""
    import jax

    from jaxformer.functional import scaled_dot_product_attention

    return jax.jit(
        lambda q, k, v: scaled_dot_product_attention(
            q, k, v, causal=True, implementation=implementation
        )
    )


def inputs(T: int, dtype, seed: int = 0) -> list:
    """q, k, v and the cotangent, [B, T, H, D] standard normals."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal((B, T, H, D)), dtype) for _ in range(4)]


def compile_row(implementation: str, T: int, dtype: str):
    """(the row so far: compile time and memory, or why there is no program; the
    compiled forward + backward, or None)."""
    import jax

    spec = jax.ShapeDtypeStruct((B, T, H, D), dtype)
    row = {"implementation": implementation, "T": T, "dtype": dtype, "ran": False}
    t0 = time.perf_counter()
    try:
        compiled = grad_fn(implementation).lower(spec, spec, spec, spec).compile()
    except jax.errors.JaxRuntimeError as e:  # a GPU compiler refuses programs beyond its memory
        return row | {"compile_error": str(e).splitlines()[0][:200]}, None
    except REFUSED as e:  # a kernel that cannot run here (tokamax's on a CPU, say)
        return row | {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}, None
    mem = compiled.memory_analysis()
    row |= {
        "compile_s": time.perf_counter() - t0,
        "temp_bytes": int(mem.temp_size_in_bytes),
        "io_bytes": int(mem.argument_size_in_bytes + mem.output_size_in_bytes),
    }
    return row, compiled


def measure_length(T: int, impls: list, max_bytes: int, rounds: int) -> list[dict]:
    """The rows of one length: every implementation compiled, those within max_bytes
    timed together in interleaved rounds, compared with xla of the same dtype."""
    import jax

    rows, calls, outputs = [], {}, {}
    peak = (
        shared.peak_tflops(jax.devices()[0].device_kind) if jax.default_backend() == "gpu" else None
    )
    for impl, dtype in impls:
        row, compiled = compile_row(impl, T, dtype)
        rows.append(row)
        if compiled is None or row["temp_bytes"] > max_bytes:
            continue
        args, key = inputs(T, dtype), (impl, dtype)
        outputs[key] = jax.block_until_ready(compiled(*args))
        calls[key] = lambda c=compiled, a=args: jax.block_until_ready(c(*a))
        if peak is not None:
            forward = forward_fn(impl)
            calls[(impl, dtype, "forward")] = lambda f=forward, a=args: jax.block_until_ready(
                f(*a[:3])
            )
    times = stats.time_interleaved(calls, rounds, warmup=1) if calls else {}
    for row in rows:
        finish_row(row, times, outputs, peak)
        say(_line(row))
    return rows


def finish_row(row: dict, times: dict, outputs: dict, peak: float | None) -> None:
    """Add the timing (ms, its interval), the agreement with xla and, on a GPU with a
    known peak, the forward pass's share of it."""
    import jax.numpy as jnp

    key, ref = (row["implementation"], row["dtype"]), ("xla", row["dtype"])
    if key not in times:
        return
    ms = [1e3 * t for t in times[key]]
    row |= {"ran": True, "ms": stats.best_median_ci(ms)}
    if key != ref and ref in times:
        row["over_xla"] = stats.best_paired_ratio(times[key], times[ref])
        row["max_abs_diff_vs_xla"] = max(
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
            for a, b in zip(outputs[key], outputs[ref], strict=True)
        )
    if peak is not None:
        forward_s = stats.best_median_ci(times[(*key, "forward")])["median"]
        row["forward_ms"] = 1e3 * forward_s
        row["forward_pct_of_peak"] = 100 * causal_flops(row["T"], False) / forward_s / (peak * 1e12)
        row["fwd_bwd_pct_of_peak"] = (
            100 * causal_flops(row["T"], True) / (row["ms"]["median"] / 1e3) / (peak * 1e12)
        )


def peak_rss_subprocess(implementation: str, T: int) -> dict:
    """Run one compiled forward + backward in a fresh process (Linux) and report how far its
    resident memory rose during the run: the peak (VmHWM, reset just before the call by
    writing 5 to /proc/self/clear_refs) above the resident memory before it. The rise
    includes the four outputs (out, dq, dk, dv)."""
    code = (
        "import jax; from jaxformer_lab.bench import attention as ab;"
        f"args = ab.inputs({T}, 'float32');"
        f"fn = ab.grad_fn('{implementation}').lower(*args).compile();"
        "kib = lambda key: int(next(l for l in open('/proc/self/status')"
        " if l.startswith(key)).split()[1]);"
        "base = kib('VmRSS:');"
        "open('/proc/self/clear_refs', 'w').write('5');"
        "jax.block_until_ready(fn(*args));"
        "print(base, kib('VmHWM:'))"
    )
    root = pathlib.Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    base_kib, peak_kib = (int(x) for x in out.stdout.split()[-2:])
    return {
        "implementation": implementation,
        "T": T,
        "rss_growth_bytes": 1024 * (peak_kib - base_kib),
        "output_bytes": 4 * B * T * H * D * 4,
    }


def _temp(row: dict) -> str:
    """The temporaries, or why the compiler gave no program."""
    if "compile_error" in row:
        return "compile refused"
    if "skipped" in row:
        return "skipped: " + row["skipped"]
    mib = row["temp_bytes"] / 2**20
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _line(row: dict) -> str:
    ms = row.get("ms")
    timed = f"{ms['median']:9.2f} ms" if ms else "  (not run)"
    return (
        f"T={row['T']:6d} {row['implementation']:14s} {row['dtype']:8s} {timed}  temp {_temp(row)}"
    )


def table(rows: list[dict]) -> Table:
    """A row per length and kernel: its time with the 95% interval, temporaries and agreement."""
    gpu = any("forward_pct_of_peak" in r for r in rows)
    cells = []
    for r in rows:
        ms, ratio = r.get("ms"), r.get("over_xla")
        cell = [r["T"], r["implementation"], r["dtype"]]
        cell += [f"{ms['median']:.2f} [{ms['low']:.2f}, {ms['high']:.2f}]" if ms else "not run"]
        cell += [
            ""
            if ratio is None
            else f"{ratio['median']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
        ]
        cell += [_temp(r), f"{r['max_abs_diff_vs_xla']:.1e}" if "max_abs_diff_vs_xla" in r else ""]
        cells.append(
            cell
            + (
                [f"{r['forward_pct_of_peak']:.1f}%" if "forward_pct_of_peak" in r else ""]
                if gpu
                else []
            )
        )
    caption = (
        f"Causal self-attention forward + backward, batch {B}, {H} heads, head dim {D}; "
        "medians over interleaved rounds with their intervals; time over xla's of the same "
        "dtype, round by round; temporaries from XLA's `memory_analysis()` of the compiled "
        'program ("not run": compiled only).'
    )
    columns = ["T", "implementation", "dtype", "ms [95%]", "over xla [95%]", "temporaries"]
    columns += ["max abs diff vs xla"] + (["forward % of peak"] if gpu else [])
    return Table(columns, cells, "rll" + "r" * (len(columns) - 3), caption=caption)


def headline(rows: list[dict], rss: list[dict]) -> dict:
    """The headline: the largest float32 difference against xla, each kernel's time over
    xla's (and share of the peak on a GPU), the chunked kernel's memory growth."""
    diffs = [
        r["max_abs_diff_vs_xla"]
        for r in rows
        if "max_abs_diff_vs_xla" in r and r["dtype"] == "float32"
    ]
    line = {"max_abs_diff_float32": max(diffs) if diffs else None}
    for r in rows:
        if "over_xla" in r:
            key = f"{r['implementation']}_{r['T']}_{r['dtype']}_over_xla"
            line[key] = [round(r["over_xla"][k], 3) for k in ("median", "low", "high")]
        if "forward_pct_of_peak" in r:
            line[f"{r['implementation']}_{r['T']}_{r['dtype']}_forward_pct_of_peak"] = round(
                r["forward_pct_of_peak"], 1
            )
    if rss:
        line["chunked_rss_growth_mib"] = round(rss[0]["rss_growth_bytes"] / 2**20, 1)
    return line
