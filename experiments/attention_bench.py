"""Attention implementations side by side: time and memory of forward + backward, and their
agreement with the plain one, for sequence lengths 256 to 16384 (32768 on a GPU).

Causal self-attention, batch 1, 8 heads, head dim 64, float32; on an NVIDIA GPU also
bfloat16 for "xla", "chunked" and "cudnn" (which needs it), and everywhere tokamax's
"tokamax_mosaic" and "tokamax_triton" (skipped, with the reason, where they cannot run).
On a GPU whose tensor-core peak is known (TENSOR_PEAK) each row also gives the forward
pass alone and its % of that peak (causal FLOPs: half of 4 B H T^2 D), the figure the
40% target reads. For each length and implementation the jitted
gradient of sum(out * cotangent) with respect to q, k and v is compiled; XLA's
`memory_analysis()` of the compiled program gives its temporary buffers (the attention
memory: inputs and outputs are the same for every implementation and listed apart). A
program whose temporaries exceed --max-gib is compiled but not run, and its memory is
reported from the compiler alone. Times are medians after a warm-up call. The largest
chunked run is also repeated in a fresh process that reports how far its resident memory
rises during the call (Linux, CPU).

    python experiments/attention_bench.py [--quick]

Writes results/attention_bench.json and .md; prints a final JSON line with the headline
figures.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from jaxformer import functional as F  # noqa: E402
from jaxformer.markdown import table  # noqa: E402

B, H, D = 1, 8, 64
GIB = 2**30
# Dense bfloat16 tensor-core peak (FLOP/s) by device kind, from NVIDIA's data sheets (SXM).
TENSOR_PEAK = {"H100": 989e12, "H200": 989e12, "B200": 2250e12}
REFUSED = (NotImplementedError, ValueError, TypeError, ImportError)  # a kernel refuses the call


def causal_flops(T: int, backward: bool) -> float:
    """Matrix-product FLOPs of causal attention [B, T, H, D]: q k^T and p v, half the
    square; the backward pass has 2.5 times the forward's products."""
    forward = 2 * 2 * B * H * T * T * D / 2
    return forward * (3.5 if backward else 1.0)


def tensor_peak() -> float | None:
    kind = jax.devices()[0].device_kind
    return next((peak for name, peak in TENSOR_PEAK.items() if name in kind), None)


def grad_fn(implementation: str):
    """(q, k, v, cotangent) -> (out, dq, dk, dv) of causal self-attention."""

    def loss(q, k, v, ct):
        out = F.scaled_dot_product_attention(q, k, v, causal=True, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) * ct), out

    def fn(q, k, v, ct):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, ct)
        return (out, *grads)

    return jax.jit(fn)


def forward_fn(implementation: str):
    """(q, k, v) -> out of causal self-attention."""
    return jax.jit(
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, causal=True, implementation=implementation
        )
    )


def _median_ms(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def inputs(T: int, dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal((B, T, H, D)), dtype) for _ in range(4)]


def measure(implementation: str, T: int, dtype, repeats: int, max_bytes: int) -> dict:
    spec = jax.ShapeDtypeStruct((B, T, H, D), dtype)
    row = {"implementation": implementation, "T": T, "dtype": jnp.dtype(dtype).name, "ran": False}
    t0 = time.perf_counter()
    try:
        compiled = grad_fn(implementation).lower(spec, spec, spec, spec).compile()
    except jax.errors.JaxRuntimeError as e:  # a GPU compiler refuses programs beyond its memory
        return row | {"compile_error": str(e).splitlines()[0][:200]}
    except REFUSED as e:  # a kernel that cannot run here (tokamax's on a CPU, say)
        return row | {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    mem = compiled.memory_analysis()
    row |= {
        "compile_s": time.perf_counter() - t0,
        "temp_bytes": int(mem.temp_size_in_bytes),
        "io_bytes": int(mem.argument_size_in_bytes + mem.output_size_in_bytes),
    }
    if mem.temp_size_in_bytes > max_bytes:
        return row
    args = inputs(T, dtype)
    outs = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    row |= {"ran": True, "ms": 1e3 * statistics.median(times), "outputs": outs}
    peak = tensor_peak() if jax.default_backend() == "gpu" else None
    if peak is not None:  # % of the tensor-core peak, forward alone and forward + backward
        row["forward_ms"] = _median_ms(forward_fn(implementation), args[:3], repeats)
        row["forward_pct_of_peak"] = 100 * causal_flops(T, False) / (row["forward_ms"] / 1e3) / peak
        row["fwd_bwd_pct_of_peak"] = 100 * causal_flops(T, True) / (row["ms"] / 1e3) / peak
    return row


def peak_rss_subprocess(implementation: str, T: int) -> dict:
    """Run one compiled forward + backward in a fresh process (Linux) and report how far its
    resident memory rose during the run: the peak (VmHWM, reset just before the call by
    writing 5 to /proc/self/clear_refs) above the resident memory before it. The rise
    includes the four outputs (out, dq, dk, dv)."""
    code = (
        "import sys, jax; sys.path.insert(0, '.');"
        "import experiments.attention_bench as ab;"
        f"args = ab.inputs({T}, jax.numpy.float32);"
        f"fn = ab.grad_fn('{implementation}').lower(*args).compile();"
        "kib = lambda key: int(next(l for l in open('/proc/self/status')"
        " if l.startswith(key)).split()[1]);"
        "base = kib('VmRSS:');"
        "open('/proc/self/clear_refs', 'w').write('5');"
        "jax.block_until_ready(fn(*args));"
        "print(base, kib('VmHWM:'))"
    )
    root = pathlib.Path(__file__).resolve().parent.parent
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer lengths, no 16384 run")
    parser.add_argument(
        "--max-gib", type=float, default=None, help="run only below this (CPU 4, GPU 24)"
    )
    parser.add_argument("--lengths", type=int, nargs="+", help="these sequence lengths only")
    parser.add_argument("--out", default="results/attention_bench")
    args = parser.parse_args(argv)
    gpu = jax.default_backend() == "gpu"
    lengths = [256, 1024, 2048, 16384] if args.quick else [256, 512, 1024, 2048, 4096, 8192, 16384]
    impls = [("xla", jnp.float32), ("chunked", jnp.float32)]
    if gpu:
        lengths += [] if args.quick else [32768]
        impls += [("xla", jnp.bfloat16), ("chunked", jnp.bfloat16), ("cudnn", jnp.bfloat16)]
    # tokamax's kernels (the kernels extra); where a device cannot run one, its row says why.
    impls += [("tokamax_mosaic", jnp.bfloat16), ("tokamax_triton", jnp.bfloat16)]
    lengths = args.lengths or lengths
    max_bytes = int((args.max_gib or (24.0 if gpu else 4.0)) * GIB)

    rows = []
    for T in lengths:
        plain = {}
        for impl, dtype in impls:
            run_limit = max_bytes if (T < 16384 or not args.quick) else 0  # quick: compile only
            repeats = 10 if gpu else 5 if T <= 2048 else 2
            row = measure(impl, T, dtype, repeats, run_limit)
            outs = row.pop("outputs", None)
            if impl == "xla" and outs is not None:
                plain[jnp.dtype(dtype).name] = outs
            ref = plain.get(row["dtype"])
            if impl != "xla" and outs is not None and ref is not None:
                row["max_abs_diff_vs_xla"] = max(
                    float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                    for a, b in zip(outs, ref, strict=True)
                )
            rows.append(row)
            if "skipped" in row:
                print(f"T={T:6d} {impl:14s} skipped: {row['skipped']}", flush=True)
                continue
            ms = f"{row['ms']:9.2f} ms" if row["ran"] else "  (not run)"
            diff = row.get("max_abs_diff_vs_xla")
            print(
                f"T={T:6d} {impl:14s} {row['dtype']:8s} {ms}  temp {_temp(row):>16s}"
                + (f"  max|diff| {diff:.2e}" if diff is not None else "")
                + (
                    f"  fwd {row['forward_pct_of_peak']:.1f}% of peak"
                    if "forward_ms" in row
                    else ""
                ),
                flush=True,
            )
        del plain

    measure_rss = not args.quick and not gpu and sys.platform == "linux"
    rss = [peak_rss_subprocess("chunked", max(lengths))] if measure_rss else []
    for r in rss:
        print(
            f"resident memory rise during one run, chunked at T={r['T']}: "
            f"{r['rss_growth_bytes'] / 2**20:.0f} MiB ({r['output_bytes'] / 2**20:.0f} MiB of it outputs)"
        )

    def find(impl, T, dtype="float32"):
        return next(
            (
                r
                for r in rows
                if r["implementation"] == impl and r["T"] == T and r["dtype"] == dtype
            ),
            None,
        )

    c16, x16 = find("chunked", 16384), find("xla", 16384)
    c2k, x2k = find("chunked", 2048), find("xla", 2048)
    diffs = [
        r["max_abs_diff_vs_xla"]
        for r in rows
        if "max_abs_diff_vs_xla" in r and r["dtype"] == "float32"
    ]
    headline = {"max_abs_diff_float32": max(diffs) if diffs else None}
    if c16 and x16 and "temp_bytes" in c16 and "temp_bytes" in x16:
        headline |= {
            "chunked_16384_temp_mib": round(c16["temp_bytes"] / 2**20, 1),
            "xla_16384_temp_gib": round(x16["temp_bytes"] / GIB, 2),
            "chunked_16384_ran": c16["ran"],
            "chunked_16384_ms": round(c16["ms"], 1) if c16["ran"] else None,
        }
    if c2k and x2k and c2k["ran"] and x2k["ran"]:
        headline["chunked_over_xla_time_2048"] = round(c2k["ms"] / x2k["ms"], 3)
    for T in (16384, 32768) if gpu else ():
        cudnn, xla16, chunked16 = (find(i, T, "bfloat16") for i in ("cudnn", "xla", "chunked"))
        if cudnn and cudnn["ran"]:
            headline[f"cudnn_{T}_ms"] = round(cudnn["ms"], 2)
            for name, other in (("xla", xla16), ("chunked", chunked16)):
                if other and other["ran"]:
                    headline[f"{name}_over_cudnn_time_{T}_bf16"] = round(
                        other["ms"] / cudnn["ms"], 2
                    )
    for r in rows:
        if "forward_pct_of_peak" in r:
            key = f"{r['implementation']}_{r['T']}_{r['dtype']}_forward_pct_of_peak"
            headline[key] = round(r["forward_pct_of_peak"], 1)
    if rss:
        headline["chunked_16384_rss_growth_mib"] = round(rss[0]["rss_growth_bytes"] / 2**20, 1)

    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from experiments.throughput import machine_info  # one description of the machine

    results = {"shape": dict(B=B, H=H, D=D, causal=True), "rows": rows, "peak_rss": rss}
    results |= {"headline": headline, "machine": machine_info()}
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    out.with_suffix(".md").write_text(markdown(rows))
    print(json.dumps(headline))
    return headline


def _temp(row) -> str:
    """The temporaries in MiB, or why the compiler gave no program."""
    if "compile_error" in row:
        return "compile refused"
    if "skipped" in row:
        return "skipped: " + row["skipped"]
    return f"{row['temp_bytes'] / 2**20:.1f} MiB"


def markdown(rows) -> str:
    lines = [
        f"Causal self-attention forward + backward, B={B}, H={H}, D={D}.",
        "",
    ]
    cells = []
    for r in rows:
        ms = f"{r['ms']:.2f}" if r["ran"] else "not run"
        diff = f"{r['max_abs_diff_vs_xla']:.1e}" if "max_abs_diff_vs_xla" in r else ""
        cells.append([r["T"], r["implementation"], r["dtype"], ms, _temp(r), diff])
    columns = ["T", "implementation", "dtype", "time (ms)", "temporaries", "max abs diff vs xla"]
    return "\n".join(lines + table(columns, cells, "rllrrr")) + "\n"


if __name__ == "__main__":
    main()
