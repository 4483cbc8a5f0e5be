"""First calls and memory, each mode in fresh processes: a mode's first call (compiling
included) with no compiled program from earlier (JAX's persistent cache off, Inductor's
FX graph and autograd caches off and its cache folder empty), then one call's rise of
memory (`probe`)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax

from jaxformer_lab.bench import pythons, stats
from jaxformer_lab.bench.workloads import bench_config, build

# Every fresh process: the JAX and Inductor caches off, as a first call on a new machine.
CACHES_OFF = {
    "JAX_ENABLE_COMPILATION_CACHE": "false",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
}


def first_calls(
    w_args: dict, modes: tuple[str, ...], repeats: int, say=print, torch_python: str | None = None
) -> dict:
    """Per mode, from `repeats` fresh processes: the first call's seconds (best_median_ci,
    with the samples) and one call's memory rise (best_median_ci of the processes'
    bytes); a mode whose processes all failed has {"error": the last line}. torch's modes
    run in `torch_python` where given (this interpreter has no torch)."""
    out = {}
    for mode in modes:
        runs = []
        python = torch_python if torch_python and mode.startswith("torch") else sys.executable
        for i in range(repeats):
            runs.append(fresh_run(mode, w_args, python))
            say(f"  fresh process {i + 1}/{repeats}: {mode} {_said(runs[-1])}")
        ok = [r for r in runs if "error" not in r]
        if not ok:
            out[mode] = {"error": runs[-1]["error"]}
            continue
        first = [r["first_call_s"] for r in ok]
        rise = [r["peak_rise_bytes"] for r in ok]
        out[mode] = {
            "first_call_s": stats.best_median_ci(first) | {"samples": first},
            "peak_rise_bytes": stats.best_median_ci(rise) | {"samples": rise},
        }
    return out


def _said(run: dict) -> str:
    return run["error"] if "error" in run else f"first call {run['first_call_s']:.2f} s"


def fresh_run(mode: str, w_args: dict, python: str | None = None) -> dict:
    """One fresh process's probe of `mode` (see `probe`) in `python` (default: this
    interpreter), or {"error": its last line}."""
    code = f"from jaxformer_lab.bench.fresh import probe; probe({mode!r}, {w_args!r})"
    python = python or sys.executable
    with tempfile.TemporaryDirectory() as inductor:
        env = os.environ if python == sys.executable else pythons.worker_env(JAX_PLATFORMS="cpu")
        env = env | CACHES_OFF | {"TORCHINDUCTOR_CACHE_DIR": inductor}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        result = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, env=env, check=False
        )
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"error": (result.stderr.strip().splitlines() or ["no output"])[-1]}


def probe(mode: str, w_args: dict) -> None:
    """In a fresh process, the same for every mode: build the call, time its first call
    (compiling included), call it once more (warm-up), reset the peak, and measure the rise
    of memory over one more call; the arguments are resident before the reset, so they
    are excluded on every side. Prints one JSON line."""
    from jaxformer_lab.bench.host import torch_device
    from jaxformer_lab.bench.modes import mode_call

    w_args = dict(w_args)
    config = bench_config(w_args.pop("d_model"), w_args.pop("layers"), dtype=w_args.pop("dtype"))
    w = build(config=config, **w_args)
    device = torch_device() if mode.startswith("torch") else None
    call = mode_call(w, device, mode)
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    call()
    before = _memory_now(device)
    call()
    print(json.dumps({"first_call_s": first, "peak_rise_bytes": max(0, _peak(device) - before)}))


def _memory_now(device: str | None) -> int:
    """Bytes in use now, resetting the peak: torch's allocator on CUDA (torch modes), JAX's
    device (its peak cannot be reset: the warm-up call's, the same program, is in it),
    else the process's resident memory (VmRSS, peak reset through clear_refs)."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    if jax.default_backend() == "gpu" and device is None:
        return jax.devices()[0].memory_stats()["bytes_in_use"]
    return _resident(reset=True)


def _peak(device: str | None) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.max_memory_allocated()
    if jax.default_backend() == "gpu" and device is None:
        return jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    return _resident("VmHWM")


def _resident(field: str = "VmRSS", reset: bool = False) -> int:
    """The process's resident bytes (VmRSS) or their peak (VmHWM) from /proc/self/status;
    reset=True first resets the peak to the current size (Linux >= 4.0)."""
    if reset:
        pathlib.Path("/proc/self/clear_refs").write_text("5")
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")
