"""Accelerator attention kernels from tokamax (Pallas kernels; the `kernels` extra:
pip install 'jaxformer[kernels]'), and the table "auto" reads.

Registered in ATTENTION, each computing `scaled_dot_product_attention`'s function (rows
with no key give zeros), no attention dropout:
  "tokamax_mosaic"  Mosaic flash kernel: Hopper/Blackwell GPUs (bfloat16/float16); TPU
                    v5+ (bfloat16/float32, causal flag only)
  "tokamax_triton"  Triton flash kernel (NVIDIA GPUs)
  "tokamax_xla"     tokamax's XLA reference (any device; what the tests run on a CPU)
tokamax is imported at first trace. `target_device` tells "auto" which device it chooses
for; `gpu_target` lowers these kernels for a GPU this host lacks."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import importlib.metadata
import re
from typing import NamedTuple
from unittest import mock

import jax
import jax.extend.backend
import jax.numpy as jnp

from jaxformer.checks import BadType, BadValue, MissingPackage
from jaxformer.functional.masks import causal_mask, combine_masks, fold_masks
from jaxformer.functional.registry import ATTENTION

INSTALL_HINT = "pip install 'jaxformer[kernels]'"


class AutoRule(NamedTuple):
    """One row of "auto"'s table: on devices of `family`, prefer `implementation` (when
    it takes the call) for calls with at most `max_keys` keys (None: any)."""

    family: str  # "tpu", "gpu_sm90" (Hopper), "gpu_sm100" (Blackwell), "gpu" (any NVIDIA)
    implementation: str
    max_keys: int | None
    evidence: str  # why this row is here: a measurement (file, device, date) or a reason


# "auto" walks these rows in order; the first whose family is the device's and whose
# kernel takes the call wins; without one it runs "chunked" or "xla" (by memory). Reorder
# them on the evidence of the GPU report (`jaxformer bench attention`).
AUTO_RULES: tuple[AutoRule, ...] = (
    AutoRule(
        "tpu",
        "splash",
        None,
        "JAX's TPU flash kernel: causal flag, padding as segment ids, grouped heads; "
        "tokamax's TPU kernel takes the causal flag only. Compiled for TPUs, never run on one",
    ),
    AutoRule(
        "gpu_sm90",
        "tokamax_mosaic",
        None,
        "jax-ml/jax#35114: on Hopper, causal, Mosaic runs well ahead of cuDNN with a dense "
        "mask; cuDNN with is_causal not yet compared",
    ),
    AutoRule("gpu_sm100", "tokamax_mosaic", None, "as on sm90; not measured here"),
    AutoRule("gpu", "cudnn", None, "cuDNN's fused kernel wherever it takes the call"),
)


_TARGET: contextvars.ContextVar = contextvars.ContextVar("attention_target", default=None)


@contextlib.contextmanager
def target_device(device):
    """Within the block, "auto" and the kernels' checks choose for `device` (a jax Device,
    e.g. a chip of a TPU topology compiled for with no TPU present) instead of this
    process's first device."""
    token = _TARGET.set(device)
    try:
        yield
    finally:
        _TARGET.reset(token)


def current_target():
    """(backend, device) that attention is traced for: `target_device`'s, or the default."""
    device = _TARGET.get()
    if device is None:
        return jax.default_backend(), jax.devices()[0]
    return ("gpu" if device.platform in ("cuda", "rocm") else device.platform), device


def device_families(backend: str, device) -> tuple[str, ...]:
    """The families of `AUTO_RULES` a device belongs to, most specific first."""
    if backend == "tpu":
        return ("tpu",)
    if backend == "gpu" and "nvidia" in device.device_kind.lower():
        capability = getattr(device, "compute_capability", None)
        major = None if capability is None else int(float(capability))
        return (f"gpu_sm{major}0", "gpu") if major in (9, 10) else ("gpu",)
    return (backend,)


def tokamax_or_none():
    """The tokamax module, or None when it is not installed. tokamax parses sys.argv for
    its absl flags at first use, which fails on a program's own options (pytest's, the
    jaxformer command's): unparsed flags are marked parsed (defaults)."""
    try:
        tokamax = importlib.import_module("tokamax")
    except ImportError:
        return None
    from absl import flags  # installed with tokamax

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return tokamax


def mosaic_problem(q, k, v, *, padded: bool, explicit: bool, dropout_rate: float):
    """Why "tokamax_mosaic" cannot take this call on the default device: (error type,
    reason), or None. explicit: a dense mask, bias or validity vectors; padded: key
    lengths."""
    if tokamax_or_none() is None:
        return MissingPackage, f"tokamax is not installed ({INSTALL_HINT})"
    if dropout_rate > 0.0:
        return BadValue, "has no attention dropout"
    backend, device = current_target()
    families = device_families(backend, device)
    dtypes = {q.dtype, k.dtype, v.dtype}
    if families[0] == "tpu":
        generation = re.search(r"(\d+)", device.device_kind)
        if generation is None or int(generation.group(1)) < 5:
            return BadValue, f"needs TPU v5 or newer, found {device.device_kind!r}"
        if len(dtypes) > 1 or q.dtype not in (jnp.bfloat16, jnp.float32):
            return BadType, f"on a TPU takes bfloat16 or float32 q, k, v; got {dtypes}"
        if padded or explicit:
            return BadValue, "on a TPU takes the causal flag only: no key lengths, masks, bias"
        return _fails_here("mosaic")
    if families[0] in ("gpu_sm90", "gpu_sm100"):
        if len(dtypes) > 1 or q.dtype not in (jnp.bfloat16, jnp.float16):
            return BadType, f"takes bfloat16 or float16 q, k, v (all one dtype); got {dtypes}"
        return _fails_here("mosaic")
    return BadValue, f"needs a Hopper or Blackwell GPU or a TPU, found {families[0]!r}"


def _fails_here(name: str):
    """(RuntimeError, reason) when tokamax's `name` kernel does not build for the target,
    else None. A GPU target on a host without one is checked by lowering for it."""
    backend, device = current_target()
    capability = None
    if backend == "gpu" and jax.default_backend() != "gpu":
        capability = str(device.compute_capability)
    failure = kernel_failure(name, capability)
    if failure is None:
        return None
    versions = f"tokamax {importlib.metadata.version('tokamax')} with jax {jax.__version__}"
    return RuntimeError, f"fails to build with {versions} on this device ({failure})"


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


# --- lowering for a GPU this host does not have -----------------------------------------

# compute capability -> (device kind, streaming multiprocessors) of the GPU lowered for
GPUS = {
    "8.0": ("NVIDIA A100-SXM4-80GB", 108),
    "9.0": ("NVIDIA H100 80GB HBM3", 132),
    "10.0": ("NVIDIA B200", 148),
}


@dataclasses.dataclass(frozen=True)
class StandInGpu:
    """What tokamax and Mosaic GPU read from the default device, for a GPU not present."""

    device_kind: str
    compute_capability: str
    core_count: int
    platform: str = "gpu"


@dataclasses.dataclass(frozen=True, slots=True)
class AbstractGpu(jax.sharding.AbstractDevice):
    """The abstract mesh's device, with the capability that JAX before 0.11 reads from it
    (not from the default device) for Mosaic GPU; without it that JAX lowers for sm90."""

    compute_capability: str = "9.0"


@contextlib.contextmanager
def gpu_target(capability: str = "9.0"):
    """Within: tokamax's GPU kernels trace and lower for the NVIDIA GPU of compute
    `capability` (a key of GPUS), whatever this host's devices are. tokamax and Mosaic GPU
    read what they build for from `jax.extend.backend.get_default_device()`, JAX's Triton
    lowering from the abstract mesh's device: both answer with that GPU, and tokamax's
    `cross_compile` skips its hardware checks. The stand-in device is process-wide while
    entered: lower in one thread at a time."""
    if capability not in GPUS:
        raise BadValue(f"capability must be one of {sorted(GPUS)}, got {capability!r}")
    tokamax = tokamax_or_none()
    if tokamax is None:
        raise MissingPackage(f"lowering tokamax's GPU kernels needs tokamax: {INSTALL_HINT}")
    kind, cores = GPUS[capability]
    device = StandInGpu(kind, capability, cores)
    abstract = AbstractGpu(kind, cores, "cuda", compute_capability=capability)
    mesh = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=abstract)
    with (
        tokamax.config.cross_compile(True),
        mock.patch.object(jax.extend.backend, "get_default_device", lambda: device),
        jax.sharding.use_abstract_mesh(mesh),
        jax.numpy_rank_promotion("allow"),  # tokamax's kernels broadcast implicitly
    ):
        yield


def lower_for_gpu(fn, *args, capability: str = "9.0") -> str:
    """The StableHLO text of `jax.jit(fn)` on `args` (arrays or jax.ShapeDtypeStruct)
    lowered for CUDA on the NVIDIA GPU of compute `capability`, on any host."""
    with gpu_target(capability):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _tokamax_kernel(name: str):
    """The ATTENTION kernel running tokamax.dot_product_attention(implementation=name)."""

    def kernel(q, k, v, *, dropout_rng, **structure):
        del dropout_rng  # no dropout: refused
        return _tokamax_attention(name, q, k, v, **structure)

    return kernel


def _tokamax_attention(
    name, q, k, v, *, mask, q_valid, k_valid, k_lengths, causal, bias, scale, dropout_rate
):
    """tokamax.dot_product_attention(implementation=name): causality as is_causal, key
    lengths as key_value_seq_lengths; rows with no key give 0."""
    tokamax = tokamax_or_none()
    if tokamax is None:
        raise MissingPackage(f"implementation='tokamax_{name}' needs tokamax: {INSTALL_HINT}")
    if name == "mosaic":
        explicit = any(x is not None for x in (mask, q_valid, k_valid, bias))
        problem = mosaic_problem(
            q, k, v, padded=k_lengths is not None, explicit=explicit, dropout_rate=dropout_rate
        )
        if problem is not None:
            error, reason = problem
            raise error(f"implementation='tokamax_mosaic' {reason}; use 'xla' or 'chunked'")
    if dropout_rate > 0.0:
        raise BadValue(f"implementation='tokamax_{name}' has no attention dropout")
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    mask = fold_masks(B, T, S, mask, q_valid=q_valid, k_valid=k_valid)
    with jax.numpy_rank_promotion("allow"):  # tokamax's own code broadcasts implicitly
        out = tokamax.dot_product_attention(
            q,
            k,
            v,
            bias=None if bias is None else _rank4(bias),
            mask=None if mask is None else _rank4(mask),
            scale=scale,
            is_causal=causal,
            key_value_seq_lengths=k_lengths,
            implementation=name,
        )
    return zero_rows_without_keys(out, mask, causal, k_lengths)


for _name in ("mosaic", "triton", "xla"):
    ATTENTION.register(f"tokamax_{_name}", _tokamax_kernel(_name), raw_masks=True)


def zero_rows_without_keys(out, mask, causal: bool, k_lengths):
    """out [B, T, H, Dv] with zeros where a query has no key to attend to (kernels that
    give such rows the mean of the values, or anything else)."""
    keep = None
    if mask is not None:
        T, S = out.shape[1], mask.shape[-1]
        full = combine_masks(mask, causal_mask(T, S)) if causal else mask
        any_key = jnp.any(full, axis=-1, keepdims=True)  # [.., H | 1, T | 1, 1]
        keep = jnp.swapaxes(_rank4(any_key), 1, 2)  # [B | 1, T | 1, H | 1, 1]
    if k_lengths is not None:
        keep = combine_masks(keep, (k_lengths > 0)[:, None, None, None])
    return out if keep is None else jnp.where(keep, out, jnp.zeros_like(out))


def _rank4(x):
    """x broadcastable to [B, H, T, S] as rank 4 (leading axes of size 1)."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)
