"""JAX's own TPU flash kernel, splash attention (jax.experimental.pallas.ops.tpu.
splash_attention), registered in ATTENTION as "splash".

It computes `scaled_dot_product_attention`'s function from the structure alone (causality
as CausalMask; key lengths, validity and packed documents as SegmentIds): no dense mask,
bias or dropout, float32 or bfloat16, T and S multiples of 128 (`splash_problem` says why).

On a CPU it runs in Pallas interpret mode (`INTERPRET` overrides). Under a mesh it runs
inside `jax.shard_map`: batch rows over `data` and `fsdp`, heads over `tensor`."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa
from jax.sharding import PartitionSpec as P

from jaxformer.checks import BadType, BadValue, as_given
from jaxformer.functional.kernels import attention_device
from jaxformer.functional.masks import PAD_QUERY, segment_ids
from jaxformer.functional.registry import ATTENTION

# True: Pallas interpret mode; False: the compiled TPU kernel (what `jax.export` for a TPU
# needs on a CPU); None: interpret on a CPU only.
INTERPRET: bool | None = None
TILE = 128  # T and S must be multiples of this (splash's key tiles and backward query tiles)
BLOCKS = (512, 256, 128)  # block sizes tried, largest first
BATCH_AXES, HEAD_AXIS = ("data", "fsdp"), "tensor"  # the mesh axes of jaxformer.parallel


def interpret() -> bool:
    """Whether the kernel runs in Pallas interpret mode: `INTERPRET`, else when the device
    attention is traced for (`kernels.attention_device`) is a CPU."""
    return attention_device()[0] == "cpu" if INTERPRET is None else INTERPRET


def splash_problem(
    q, k, v, *, padded: bool = False, explicit: bool = False, dropout_rate=0.0, bias=False
) -> tuple[type, str] | None:
    """Why "splash" cannot take q [B, T, H, D], k [B, S, K, D], v [B, S, K, Dv]: (error
    type, reason), or None. explicit: a dense mask; bias: an additive bias; padded: key
    lengths or validity vectors (taken as segment ids, never a reason to refuse)."""
    del padded
    if dropout_rate > 0.0:
        return BadValue, "has no attention dropout"
    if bias:
        return BadValue, "takes no bias"
    if explicit:
        return BadValue, "takes no dense mask (causal=True, k_lengths, q_valid/k_valid only)"
    if attention_device()[0] == "gpu" and not interpret():
        return BadValue, "needs a TPU, or Pallas interpret mode (splash.INTERPRET = True)"
    dtypes = {jnp.dtype(x.dtype) for x in (q, k, v)}
    if len(dtypes) > 1 or q.dtype not in (jnp.float32, jnp.bfloat16):
        names = sorted(d.name for d in dtypes)
        return BadType, f"takes q, k, v all float32 or all bfloat16, got {names}"
    T, S = q.shape[1], k.shape[1]
    if T % TILE or S % TILE:
        return BadValue, f"takes lengths that are multiples of {TILE}, got T={T}, S={S}"
    return None


@functools.partial(ATTENTION.register, "splash", raw_masks=True)
def splash_attention(
    q, k, v, *, mask, q_valid, k_valid, k_lengths, q_segments, k_segments, causal, bias, scale,
    dropout_rate, dropout_rng,
):  # fmt: skip
    """softmax(q k^T * scale) v by splash attention: [B, T, H, Dv] in q's dtype."""
    del dropout_rng  # no dropout: refused
    explicit, has_bias = mask is not None, bias is not None
    problem = splash_problem(q, k, v, explicit=explicit, dropout_rate=dropout_rate, bias=has_bias)
    if problem is not None:
        error, reason = problem
        impl = as_given("implementation", "splash")
        raise error(f"{impl} {reason}; use {as_given('implementation', 'xla')} or 'chunked'")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q = (q.astype(jnp.float32) * jnp.float32(scale)).astype(q.dtype)  # splash does not scale
    run = functools.partial(_splash_local, causal=causal, interpret=interpret())
    padding = (q_valid, k_valid, k_lengths)
    if q_segments is not None and k_segments is None and all(x is None for x in padding):
        return _on_mesh(run, q, *_packed_self_attention(k, v, q_segments))
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    ids = segment_ids(B, T, S, q_valid, k_valid, k_lengths, q_segments, k_segments)
    out = _on_mesh(run, q, k, v, ids)
    if ids is None:
        return out
    keep = _rows_with_keys(*ids, causal)[:, :, None, None]
    return jnp.where(keep, out, jnp.zeros_like(out))


def _packed_self_attention(k, v, segments):
    """(k, v, ids) for self-attention over packed rows, whose output needs no zeroing
    after the kernel (a second [B, T, H, D] buffer kept for the backward): each document's
    query sees at least itself, and padding queries see padding keys only, whose values are
    zeroed here, so their output is exactly zero."""
    pad = segments == 0
    ids = jnp.where(pad, PAD_QUERY, segments).astype(jnp.int32)
    return k, jnp.where(pad[:, :, None, None], jnp.zeros_like(v), v), (ids, ids)


def _rows_with_keys(q_ids, kv_ids, causal: bool):
    """[B, T] bool: query t has a key to attend to (a key s of its id, s <= t when causal):
    each id's first key found in the keys' ids sorted (stable), with no [T, S] array."""
    S = kv_ids.shape[1]
    order = jnp.argsort(kv_ids, axis=1, stable=True)  # [B, S]
    sorted_ids = jnp.take_along_axis(kv_ids, order, axis=1)
    at = jnp.minimum(jax.vmap(jnp.searchsorted)(sorted_ids, q_ids), S - 1)  # [B, T]
    found = jnp.take_along_axis(sorted_ids, at, axis=1) == q_ids
    first = jnp.take_along_axis(order, at, axis=1)  # the first key of the query's id
    bound = jnp.arange(q_ids.shape[1])[None, :] if causal else S - 1
    return found & (first <= bound)


def _on_mesh(run, q, k, v, ids):
    """run(q, k, v, ids) directly, or inside shard_map over the abstract mesh when one is
    set: rows over the batch axes (as many as divide B), heads over `tensor` (where it
    divides K, and so H)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return run(q, k, v, ids)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    rows, n = [], 1
    for axis in BATCH_AXES:
        if axis in sizes and q.shape[0] % (n * sizes[axis]) == 0:
            rows, n = [*rows, axis], n * sizes[axis]
    heads = HEAD_AXIS if HEAD_AXIS in sizes and k.shape[2] % sizes[HEAD_AXIS] == 0 else None
    rows = tuple(rows) or None
    specs = (P(rows, None, heads, None),) * 3 + (None if ids is None else (P(rows, None),) * 2,)
    args = jax.tree.map(functools.partial(_reshard, mesh), (q, k, v, ids), specs)
    # check_vma=False: Pallas's TPU kernels carry no varying-axes types
    sharded = jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)
    return sharded(*args)


def _reshard(mesh, x, spec):
    """x laid out as `spec` over the mesh's Explicit axes: shard_map takes arrays on
    Explicit axes as they are typed and moves arrays on Auto axes itself."""
    if not mesh.explicit_axes:
        return x
    names = lambda entry: entry if isinstance(entry, tuple) else (entry,)  # noqa: E731
    kept = [tuple(a for a in names(e) if a in mesh.explicit_axes) or None for e in spec]
    return jax.sharding.reshard(x, P(*kept))


def _splash_local(q, k, v, ids, *, causal: bool, interpret: bool):
    """Splash attention on the arrays at hand: the multi-head kernel (it takes K key/value
    heads dividing H natively, query head h reading head h // (H / K), as jaxformer does)
    vmapped over the batch; splash's layout is [H, T, D] per example."""
    _, T, H, _ = q.shape
    S = k.shape[1]
    one = sa.CausalMask((T, S)) if causal else sa.FullMask((T, S))
    kernel = sa.make_splash_mha(
        sa.MultiHeadMask((one,) * H),
        block_sizes=block_sizes(T, S),
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
    )
    q_BHTD, k_BKSD, v_BKSD = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    if ids is None:
        out_BHTD = jax.vmap(kernel)(q_BHTD, k_BKSD, v_BKSD)
    else:
        one_row = lambda q, k, v, qi, ki: kernel(q, k, v, segment_ids=sa.SegmentIds(qi, ki))  # noqa: E731
        out_BHTD = jax.vmap(one_row)(q_BHTD, k_BKSD, v_BKSD, *ids)
    return jnp.swapaxes(out_BHTD, 1, 2)


def block_sizes(T: int, S: int) -> sa.BlockSizes:
    """Splash's tiles for lengths T and S (multiples of TILE): the largest of BLOCKS that
    divides each, the same tiles forward and backward."""
    bq = next(b for b in BLOCKS if T % b == 0)
    bkv = next(b for b in BLOCKS if S % b == 0)
    return sa.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        block_q_dq=bq,
        block_kv_dq=bkv,
    )
