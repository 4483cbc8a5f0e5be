"""The machine the XLA-vs-eager lab runs on, read and measured: its processor and the
instruction sets its flags list, versions, threads; its measured roofs (a float32 GEMM and
a streaming copy); what one trivial call costs in each way of calling; and NNX's per-call
overhead as the module's graph grows."""

from __future__ import annotations

import os
import pathlib
import platform

import jax
import jax.numpy as jnp
from flax import nnx

from jaxformer_lab.bench import stats

# The instruction-set flags the report names, as /proc/cpuinfo spells them.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
)


def cpu_info(cpuinfo: str | None = None) -> dict:
    """The processor's model name, its clock as the kernel reports it (MHz, first core)
    and which of ISA_FLAGS its flags list, read from /proc/cpuinfo (or `cpuinfo`, its
    text); {} where there is none."""
    path = pathlib.Path("/proc/cpuinfo")
    if cpuinfo is None:
        cpuinfo = path.read_text() if path.exists() else ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if not fields.get("flags"):
        return {}
    flags = set(fields["flags"].split())
    mhz = fields.get("cpu MHz")
    return {
        "model": fields.get("model name", ""),
        "mhz": float(mhz) if mhz else None,
        "flags": [f for f in ISA_FLAGS if f in flags],
        "widest_simd": simd_name(flags),
    }


def simd_name(flags: set[str]) -> str:
    """The widest vector instruction set the flags name."""
    if "avx512f" in flags:
        return "AVX-512" + (" with AMX" if "amx_tile" in flags else "")
    if "avx2" in flags:
        return "AVX2"
    return "AVX" if "avx" in flags else "SSE or none named"


def torch_device(backend: str | None = None) -> str | None:
    """Where torch runs beside JAX ("cuda" on an NVIDIA GPU, else "cpu"), JAX's `backend`
    given or this process's; None without torch. Sets torch's intra-op threads to XLA's
    (see `xla_threads`)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(xla_threads())
    if (backend or jax.default_backend()) == "gpu" and torch.cuda.is_available():
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default on a GPU
        return "cuda"
    torch.set_float32_matmul_precision("highest")
    return "cpu"


def xla_threads() -> int:
    """XLA's CPU intra-op threads: its pool has one per core this process may run on."""
    return len(os.sched_getaffinity(0))


def machine_info(device: str | None) -> dict:
    """The device, versions, threads and (on a CPU host) its processor and flags."""
    from importlib.metadata import version

    d = jax.devices()[0]
    info = {
        "device": f"{d.device_kind} ({jax.default_backend()})",
        "jax": jax.__version__,
        "flax": version("flax"),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "xla_intra_op_threads": xla_threads(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),  # torch's OpenMP threads
        "cpu": cpu_info(),
    }
    if device is not None:
        import torch

        info |= {
            "torch": torch.__version__,
            "torch_device": device,
            "torch_threads": torch.get_num_threads(),
        }
    return info


def machine_roofs(rounds: int, gemm_n: int, stream_mib: int) -> dict:
    """The machine's measured float32 GEMM rate ([N, N] @ [N, N], FLOP/s) and memory
    bandwidth (y = x * 2 over `stream_mib` MiB: bytes read + written per second), medians
    with 95% intervals over `rounds` calls, with their samples."""
    size = stream_mib * 2**20 // 4
    a = jnp.ones((gemm_n, gemm_n), jnp.float32)
    x = jnp.ones(size, jnp.float32)
    matmul, scale = jax.jit(jnp.matmul), jax.jit(lambda x: x * 2)
    times = stats.time_interleaved(
        {
            "gemm": lambda: matmul(a, a).block_until_ready(),
            "stream": lambda: scale(x).block_until_ready(),
        },
        rounds,
    )
    gemm = [2 * gemm_n**3 / t for t in times["gemm"]]
    stream = [2 * 4 * size / t for t in times["stream"]]
    return {
        "gemm_flops": stats.median_ci(gemm) | {"samples": gemm},
        "gemm_n": gemm_n,
        "bandwidth_bytes": stats.median_ci(stream) | {"samples": stream},
        "stream_bytes": 8 * size,
    }


def _loop(fn, calls: int):
    def run():
        for _ in range(calls):
            out = fn()
        jax.block_until_ready(out)

    return run


def _per_call_us(times: dict, calls: int) -> dict:
    """Each series' median_ci in microseconds per call, with the samples (us)."""
    out = {}
    for name, t in times.items():
        us = [v * 1e6 / calls for v in t]
        out[name] = stats.median_ci(us) | {"samples": us}
    return out


DISPATCH_CALLS = 200  # calls of each trivial program per round


def dispatch_costs(
    rounds: int,
    device: str | None,
    extra: dict | None = None,
    calls_per_round: int = DISPATCH_CALLS,
) -> dict:
    """Microseconds per call of a trivial program on 8 numbers in each way: one primitive
    op by op (x + y: both on the device, so no transfer), one host-to-device put (a Python
    float, as eager puts its scalar operands), one jitted call, one torch op (torch on
    `device`, in this process; or among `extra`: calls of calls_per_round calls each, a
    torch in a worker's)."""
    x = jnp.ones(8)
    jitted = jax.jit(lambda x: x + x)
    calls = {
        "eager primitive": _loop(lambda: x + x, calls_per_round),
        "host-to-device put": _loop(lambda: jax.device_put(1.0), calls_per_round),
        "jit call": _loop(lambda: jitted(x), calls_per_round),
    }
    if device is not None:
        import torch

        t = torch.ones(8, device=device)
        calls["torch primitive"] = _loop(lambda: t + t, calls_per_round)
    calls |= extra or {}
    return _per_call_us(stats.time_interleaved(calls, rounds, warmup=1), calls_per_round)


class _Stack(nnx.Module):
    """`layers` 8x8 nnx.Linear layers in sequence: a graph of 2 x layers Variables."""

    def __init__(self, layers: int):
        rngs = nnx.Rngs(0)
        self.layers = nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(layers)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def nnx_overheads(rounds: int, sizes: tuple[int, ...], calls_per_round: int = 50) -> dict:
    """Per module of `sizes` 8x8 Linear layers (2 Variables each): microseconds per call of
    the same tiny compiled program called five ways, interleaved, and each way's extra
    cost over the plain call (paired per-round differences, 95% intervals):

        plain jit          jax.jit over the parameters as nested dicts of arrays
        jit split/merge    jax.jit(f)(state, x), f merging the graph inside (the lab's jit)
        nnx.jit            nnx.jit over the module object
        nnx.jit(graph=False) the same in Flax's tree mode (the module as a pytree)
        nnx.cached_partial nnx.jit with the graph traversal cached
    """
    return {str(n): _overheads(n, rounds, calls_per_round) for n in sizes}


def _overheads(layers: int, rounds: int, calls_per_round: int) -> dict:
    x = jnp.ones((1, 8))
    module = _Stack(layers)
    graphdef, state = nnx.split(module)
    params = nnx.to_pure_dict(state)
    plain_jit = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
    split_merge = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    nnx_jit = nnx.jit(lambda m, x: m(x))
    tree_jit = nnx.jit(lambda m, x: m(x), graph=False)
    cached = nnx.cached_partial(nnx.jit(lambda m, x: m(x)), nnx.clone(module))
    calls = {
        "plain jit": lambda: plain_jit(params, x),
        "jit split/merge": lambda: split_merge(state, x),
        "nnx.jit": lambda: nnx_jit(module, x),
        "nnx.jit(graph=False)": lambda: tree_jit(module, x),
        "nnx.cached_partial": lambda: cached(x),
    }
    loops = {name: _loop(fn, calls_per_round) for name, fn in calls.items()}
    us = _per_call_us(stats.time_interleaved(loops, rounds, warmup=1), calls_per_round)
    extra = {
        name: stats.paired_saving(us[name]["samples"], us["plain jit"]["samples"])
        for name in calls
        if name != "plain jit"
    }
    return {"variables": 2 * layers, "us": us, "extra_us": extra}


def cpu_name() -> str:
    """The CPU and the vector extensions its matmul speed hangs on."""
    cpu = cpu_info()
    extensions = ", ".join(cpu.get("flags", [])) or "none of " + ", ".join(ISA_FLAGS)
    return f"{cpu.get('model', 'a CPU')} ({extensions})"
