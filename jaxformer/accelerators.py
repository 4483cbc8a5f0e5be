"""Accelerators this host may not have: stand-in devices to build programs for, lowering
for an NVIDIA GPU on any host, and the checks "auto" runs before trusting a kernel.

"auto" chooses attention for JAX's default device (`functional.kernels.attention_device`);
`jax.default_device(StandInDevice(...))` makes that a device compiled for, not present
(compile-check's TPU chips; `gpu_target`'s GPU). Importing this module (the package does)
registers in `functional.DEVICE_CHECKS`: tokamax's Mosaic kernel must build on the device
(`kernel_failure`: compiled once per process, or lowered for a GPU this host lacks), and
cuDNN is passed over where XLA_FLAGS asks for deterministic ops."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import os

import jax
import jax.numpy as jnp

from jaxformer.checks import BadValue, MissingPackage
from jaxformer.functional.kernels import INSTALL_HINT, tokamax_or_none
from jaxformer.functional.registry import DEVICE_CHECKS

# compute capability -> (device kind, streaming multiprocessors) of the GPU lowered for
GPUS = {
    "8.0": ("NVIDIA A100-SXM4-80GB", 108),
    "9.0": ("NVIDIA H100 80GB HBM3", 132),
    "10.0": ("NVIDIA B200", 148),
}


@dataclasses.dataclass(frozen=True)
class StandInDevice:
    """What JAX, tokamax and "auto" read of a device that is compiled for but not present,
    set as JAX's default device (`jax.default_device` takes a type named ...Device)."""

    platform: str  # "gpu", "tpu"
    device_kind: str  # "NVIDIA H100 80GB HBM3", "TPU v5e"
    compute_capability: str | None = None  # an NVIDIA GPU's, "9.0"
    core_count: int | None = None  # an NVIDIA GPU's streaming multiprocessors


@dataclasses.dataclass(frozen=True, slots=True)
class AbstractGpu(jax.sharding.AbstractDevice):
    """The abstract mesh's device, with the capability that JAX's Mosaic GPU lowering reads
    from it when the default device has none (lowering, below; JAX before 0.11 always)."""

    compute_capability: str = "9.0"


@contextlib.contextmanager
def gpu_target(capability: str = "9.0"):
    """Within: traced code sees the NVIDIA GPU of compute `capability` (a key of GPUS) as
    JAX's default device, and as the abstract mesh's device, whatever this host has;
    tokamax's `cross_compile` skips its hardware checks. Trace here, lower for "cuda" with
    the default device unset (`lower_for_gpu`): a stand-in cannot be assigned a program."""
    if capability not in GPUS:
        raise BadValue(f"capability must be one of {sorted(GPUS)}, got {capability!r}")
    tokamax = tokamax_or_none()
    if tokamax is None:
        raise MissingPackage(f"lowering tokamax's GPU kernels needs tokamax: {INSTALL_HINT}")
    kind, cores = GPUS[capability]
    abstract = AbstractGpu(kind, cores, "cuda", compute_capability=capability)
    mesh = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=abstract)
    with (
        tokamax.config.cross_compile(True),
        jax.default_device(StandInDevice("gpu", kind, capability, cores)),
        jax.sharding.use_abstract_mesh(mesh),
        jax.numpy_rank_promotion("allow"),  # tokamax's kernels broadcast implicitly
    ):
        yield


def lower_for_gpu(fn, *args, capability: str = "9.0") -> str:
    """The StableHLO text of `jax.jit(fn)` on `args` (arrays or jax.ShapeDtypeStruct)
    lowered for CUDA on the NVIDIA GPU of compute `capability`, on any host."""
    with gpu_target(capability):
        traced = jax.jit(fn).trace(*args)
        with jax.default_device(None):
            return traced.lower(lowering_platforms=("cuda",)).as_text()


@functools.cache
def kernel_failure(name: str, capability: str | None = None) -> str | None:
    """Why tokamax's `name` kernel fails to build, or None (once per process): its forward
    and backward on one small bfloat16 causal call ([1, 128, 2, 64]), compiled on the
    default device, or lowered for the NVIDIA GPU of `capability` ("9.0": Hopper) on any
    host. A tokamax release can lag JAX's; "auto" then runs the next row of its table."""
    tokamax = tokamax_or_none()
    if tokamax is None:
        return f"ImportError: tokamax is not installed ({INSTALL_HINT})"
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)

    def total(q, k, v):
        with jax.numpy_rank_promotion("allow"):  # tokamax's own code broadcasts implicitly
            out = tokamax.dot_product_attention(q, k, v, is_causal=True, implementation=name)
        return out.astype(jnp.float32).sum()

    program = jax.grad(total, argnums=(0, 1, 2))
    try:
        if capability is None:
            jax.jit(program).lower(x, x, x).compile()
        else:
            lower_for_gpu(program, x, x, x, capability=capability)
    except Exception as error:  # any failure to build means: do not run it here
        message = str(error).strip() or repr(error)
        return f"{type(error).__name__}: {message.splitlines()[0][:200]}"
    return None


@DEVICE_CHECKS.register("tokamax_mosaic")
def mosaic_builds(device) -> tuple[type, str] | None:
    """tokamax's Mosaic kernel builds on `device`: compiled there, or lowered for it when
    it is a GPU this host lacks."""
    capability = None
    if device.platform in ("gpu", "cuda") and jax.default_backend() != "gpu":
        capability = str(device.compute_capability)
    failure = kernel_failure("mosaic", capability)
    if failure is None:
        return None
    versions = f"tokamax {importlib.metadata.version('tokamax')} with jax {jax.__version__}"
    return RuntimeError, f"fails to build with {versions} on this device ({failure})"


@DEVICE_CHECKS.register("cudnn")
def cudnn_allowed(device) -> tuple[type, str] | None:
    """cuDNN's fused attention has no deterministic backward: XLA refuses it when asked."""
    del device
    if "--xla_gpu_deterministic_ops=true" in os.environ.get("XLA_FLAGS", ""):
        return BadValue, "has no deterministic backward, and XLA_FLAGS asks for deterministic ops"
    return None
