"""Accelerator attention kernels from tokamax (Pallas kernels; the `kernels` extra:
pip install 'jaxformer[kernels]'), and the table "auto" reads.

Registered in ATTENTION, each computing `scaled_dot_product_attention`'s function (rows
with no key give zeros), no attention dropout:
  "tokamax_mosaic"  Mosaic flash kernel: Hopper/Blackwell GPUs (bfloat16/float16); TPU
                    v5+ (bfloat16/float32, causal flag only)
  "tokamax_triton"  Triton flash kernel (NVIDIA GPUs)
  "tokamax_xla"     tokamax's XLA reference (any device; what the tests run on a CPU)
tokamax is imported at first trace. "auto" chooses for JAX's default device
(`attention_device`) and asks `DEVICE_CHECKS` whether a kernel builds there
(`jaxformer.accelerators` fills it, and lowers for a GPU this host lacks)."""

from __future__ import annotations

import importlib
import re
from typing import NamedTuple

import jax
import jax.extend.backend
import jax.numpy as jnp

from jaxformer.checks import BadType, BadValue, MissingPackage, as_given
from jaxformer.functional.masks import causal_mask, combine_masks, fold_masks
from jaxformer.functional.registry import ATTENTION, DEVICE_CHECKS

INSTALL_HINT = "pip install 'jaxformer[kernels]'"
# Packed documents reach a kernel as segment ids or not at all (never as a dense mask).
NO_SEGMENTS = "{}.dot_product_attention has no argument for packed documents"


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


def attention_device() -> tuple[str, object]:
    """(backend, device) that "auto" and the kernels' checks choose for: JAX's default
    device (`jax.default_device` sets it; a stand-in there is a device compiled for, not
    present), the backend "gpu" for CUDA and ROCm."""
    device = jax.extend.backend.get_default_device()
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


def device_problem(implementation: str, device) -> tuple[type, str] | None:
    """Why `implementation` cannot run on `device` whatever its inputs (the check
    `DEVICE_CHECKS` holds for it: a kernel that does not build there), or None."""
    if implementation not in DEVICE_CHECKS.names:
        return None
    return DEVICE_CHECKS[implementation].fn(device)


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


def mosaic_problem(q, k, v, *, padded, explicit, dropout_rate, segmented=False):
    """Why "tokamax_mosaic" cannot take this call on the default device: (error type,
    reason), or None. explicit: a dense mask, bias or validity vectors; padded: key
    lengths; segmented: packed documents' segment ids."""
    if tokamax_or_none() is None:
        return MissingPackage, f"tokamax is not installed ({INSTALL_HINT})"
    if dropout_rate > 0.0:
        return BadValue, "has no attention dropout"
    if segmented:
        return BadValue, f"takes no segment ids: {NO_SEGMENTS.format('tokamax')}"
    backend, device = attention_device()
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
        return device_problem("tokamax_mosaic", device)
    if families[0] in ("gpu_sm90", "gpu_sm100"):
        if len(dtypes) > 1 or q.dtype not in (jnp.bfloat16, jnp.float16):
            return BadType, f"takes bfloat16 or float16 q, k, v (all one dtype); got {dtypes}"
        return device_problem("tokamax_mosaic", device)
    return BadValue, f"needs a Hopper or Blackwell GPU or a TPU, found {families[0]!r}"


def _tokamax_kernel(name: str):
    """The ATTENTION kernel running tokamax.dot_product_attention(implementation=name)."""

    def kernel(q, k, v, *, dropout_rng, **structure):
        del dropout_rng  # no dropout: refused
        return _tokamax_attention(name, q, k, v, **structure)

    return kernel


def _tokamax_attention(
    name, q, k, v, *, mask, q_valid, k_valid, k_lengths, q_segments, k_segments, causal, bias,
    scale, dropout_rate,
):  # fmt: skip
    """tokamax.dot_product_attention(implementation=name): causality as is_causal, key
    lengths as key_value_seq_lengths; rows with no key give 0. Packed documents: only the
    XLA reference takes them, as the mask it materialises anyway."""
    tokamax = tokamax_or_none()
    if tokamax is None:
        raise MissingPackage(f"{_impl(name)} needs tokamax: {INSTALL_HINT}")
    segmented = q_segments is not None
    if name == "mosaic":
        explicit = any(x is not None for x in (mask, q_valid, k_valid, bias))
        flags = dict(padded=k_lengths is not None, explicit=explicit, segmented=segmented)
        problem = mosaic_problem(q, k, v, dropout_rate=dropout_rate, **flags)
        if problem is not None:
            error, reason = problem
            raise error(f"{_impl(name)} {reason}; use 'xla' or 'chunked'")
    if segmented and name != "xla":
        reason = NO_SEGMENTS.format("tokamax")
        raise BadValue(f"{_impl(name)} takes no segment ids: {reason}; use 'xla' or 'chunked'")
    if dropout_rate > 0.0:
        raise BadValue(f"{_impl(name)} has no attention dropout")
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    segments = dict(q_segments=q_segments, k_segments=k_segments)
    with jax.named_scope(f"tokamax_{name}"), jax.numpy_rank_promotion("allow"):  # as tokamax
        mask = fold_masks(B, T, S, mask, q_valid=q_valid, k_valid=k_valid, **segments)
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


def _impl(name: str) -> str:
    """tokamax kernel `name`'s implementation, as the caller gives it."""
    return as_given("implementation", f"tokamax_{name}")
