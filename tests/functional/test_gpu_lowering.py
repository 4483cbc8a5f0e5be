"""tokamax's Triton and Mosaic GPU attention, forward and backward, lowered for an abstract
H100 on this CPU: the module holds each kernel's custom call. Where the installed tokamax
is older than the installed JAX allows, the same check must report the failure instead."""

import functools
import importlib.metadata
import re

import jax
import jax.extend.backend
import jax.numpy as jnp
import pytest

from jaxformer import functional as F
from jaxformer.accelerators import gpu_target, kernel_failure, lower_for_gpu
from jaxformer.functional import choose_implementation

tokamax = pytest.importorskip(
    "tokamax", reason="the kernels extra: pip install 'jaxformer[kernels]'"
)

CUSTOM_CALLS = {"triton": "__gpu$xla.gpu.triton", "mosaic": "mosaic_gpu_v2"}
# tokamax before 0.0.13 calls Pallas APIs that JAX removed: Mosaic GPU's kernel(out_shape=)
# from jax 0.11 (a TypeError), Triton's pl.dot from jax 0.12 (an AttributeError)
BREAKS_FROM_JAX = {"mosaic": (0, 11), "triton": (0, 12)}
BREAKS_WITH = {"mosaic": TypeError, "triton": AttributeError}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def outgrown(name: str) -> bool:
    """Whether this tokamax release cannot build kernel `name` under this JAX release."""
    old_tokamax = _version(importlib.metadata.version("tokamax")) < (0, 0, 13)
    return old_tokamax and _version(jax.__version__) >= BREAKS_FROM_JAX[name]


def _attention_sum(name: str, padded: bool):
    """q, k, v [1, 128, 2, 64] bfloat16 (and key lengths [1]) -> the attention's sum:
    causal, or padded (not causal, with key_value_seq_lengths)."""

    def total(q, k, v, lengths):
        out = tokamax.dot_product_attention(
            q,
            k,
            v,
            is_causal=not padded,
            key_value_seq_lengths=lengths if padded else None,
            implementation=name,
        )
        return out.astype(jnp.float32).sum()

    return total


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
@pytest.mark.parametrize("name", ["triton", "mosaic"])
def test_kernel_lowers_forward_and_backward_for_an_abstract_h100(name, padded):
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((1,), jnp.int32)
    total = _attention_sum(name, padded)
    if outgrown(name):
        with pytest.raises(BREAKS_WITH[name]):
            lower_for_gpu(total, x, x, x, lengths, capability="9.0")
        return
    call = f"custom_call @{CUSTOM_CALLS[name]}("
    forward = lower_for_gpu(total, x, x, x, lengths, capability="9.0").count(call)
    grad = jax.grad(total, argnums=(0, 1, 2))
    both = lower_for_gpu(grad, x, x, x, lengths, capability="9.0").count(call)
    assert forward >= 1, f"no {CUSTOM_CALLS[name]} custom call in the forward"
    assert both > forward, f"no {CUSTOM_CALLS[name]} custom call in the backward"


@pytest.mark.parametrize("name", ["triton", "mosaic"])
def test_the_build_check_reports_a_failure_exactly_where_the_pairing_breaks(name):
    failure = kernel_failure(name, "9.0")
    if outgrown(name):
        assert failure is not None and "\n" not in failure
        assert failure.startswith(f"{BREAKS_WITH[name].__name__}: "), failure
    else:
        assert failure is None


def test_gpu_target_refuses_an_unknown_capability_and_restores_the_default_device():
    before = jax.extend.backend.get_default_device()
    with pytest.raises(ValueError, match=r"capability must be one of .*got '7.5'"):
        with gpu_target("7.5"):
            pass
    with gpu_target("9.0"):
        assert jax.extend.backend.get_default_device().compute_capability == "9.0"
    assert jax.extend.backend.get_default_device() is before


def test_auto_chooses_for_the_gpu_lowered_for_through_the_same_build_check():
    """On a CPU, "auto" told its target is an H100 picks tokamax's Mosaic kernel where
    that kernel lowers for an H100, and cuDNN where it does not."""
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    with gpu_target("9.0"):
        choice = choose_implementation(x, x, x, masked=True, dropout_rate=0.0)
    assert choice == ("cudnn" if outgrown("mosaic") else "tokamax_mosaic")


def test_packed_rows_lowered_for_an_h100_run_xla_code_and_say_why(caplog):
    """Neither tokamax's nor cuDNN's attention takes segment ids: lowered for an abstract
    H100, a causal bfloat16 call runs Mosaic's kernel and the same call on packed rows runs
    XLA's code, with the reasons logged (never a silent fallback)."""
    caplog.set_level("INFO", logger="jaxformer.attention")
    x = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)

    def attend(q, k, v, ids, packed):
        segments = dict(q_segments=ids, k_segments=ids) if packed else {}
        return F.scaled_dot_product_attention(q, k, v, causal=True, **segments)

    packed = lower_for_gpu(functools.partial(attend, packed=True), x, x, x, ids)
    assert "mosaic_gpu" not in packed and "cudnn" not in packed
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "no tokamax_mosaic: takes no segment ids" in said
    assert "no cudnn: takes no segment ids" in said
    if not outgrown("mosaic"):
        plain = lower_for_gpu(functools.partial(attend, packed=False), x, x, x, ids)
        assert f"custom_call @{CUSTOM_CALLS['mosaic']}(" in plain
