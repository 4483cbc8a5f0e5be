"""The attention implementations ("chunked", "cudnn") against the plain materialised one
("xla", itself checked against NumPy in test_attention.py) and a float64 NumPy reference:
forward values and gradients within 1e-5 in float32, with every kind of mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import functional as F
from jaxformer.accelerators import StandInDevice
from jaxformer.functional.chunked_attention import chunked_attention
from jaxformer.functional.matmul import einsum_f32
from tests import reference as ref

# (B, T, S, H, K, D, Dv): multi-head, grouped-query, multi-query, T != S, Dv != D; with
# 4 x 4 tiles every shape needs several tiles and most need padding.
SHAPES = [
    (2, 9, 9, 4, 4, 8, 8),
    (1, 7, 13, 6, 2, 4, 4),
    (2, 12, 5, 8, 1, 8, 16),
]
TILES = dict(block_q=4, block_k=4)


def _inputs(shape, seed):
    B, T, S, H, K, D, Dv = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, D)).astype(np.float32)
    k = rng.standard_normal((B, S, K, D)).astype(np.float32)
    v = rng.standard_normal((B, S, K, Dv)).astype(np.float32)
    q_valid = rng.random((B, T)) < 0.8
    k_valid = rng.random((B, S)) < 0.7
    k_valid[0] = False  # batch row 0 has no key at all: every query's row is empty
    return rng, q, k, v, q_valid, k_valid


def _value_and_grads(attend, q, k, v, bias=None):
    """Output and the gradients of a non-trivial scalar of it w.r.t. q, k, v (and bias)."""

    def loss(q, k, v, bias):
        out = attend(q, k, v, bias)
        return jnp.sum(jnp.sin(out) * out), out

    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    fn = jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))
    (_, out), grads = fn(q, k, v, bias)
    return out, grads


def _assert_same(a, b, atol=1e-5):
    out_a, grads_a = a
    out_b, grads_b = b
    np.testing.assert_allclose(out_a, out_b, atol=atol, rtol=atol)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert np.isfinite(np.asarray(ga)).all()
        np.testing.assert_allclose(ga, gb, atol=atol, rtol=atol)


# Each shape with two of the maskings, so that every masking meets a grouped-head shape.
CASES = [
    (SHAPES[0], "none"),
    (SHAPES[0], "dense_mask+bias"),
    (SHAPES[1], "causal"),
    (SHAPES[1], "valid"),
    (SHAPES[2], "causal+valid"),
    (SHAPES[2], "dense_mask+bias"),
]


@pytest.mark.parametrize("shape,masking", CASES)
def test_chunked_matches_plain_values_and_gradients(shape, masking):
    rng, q, k, v, q_valid, k_valid = _inputs(shape, seed=len(masking))
    B, T, S, H = shape[:4]
    kw = dict(causal="causal" in masking)
    if "valid" in masking:
        kw |= dict(q_valid=q_valid, k_valid=k_valid)
    bias = None
    if masking == "dense_mask+bias":
        kw["mask"] = rng.random((B, H, T, S)) < 0.7
        bias = rng.standard_normal((1, H, T, S)).astype(np.float32)

    def plain(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, bias=bias, **kw)

    def chunked(q, k, v, bias):
        return chunked_attention(q, k, v, bias=bias, **kw, **TILES)

    _assert_same(_value_and_grads(chunked, q, k, v, bias), _value_and_grads(plain, q, k, v, bias))


def test_the_switch_selects_chunked():
    _, q, k, v, q_valid, k_valid = _inputs(SHAPES[1], seed=0)
    kw = dict(causal=True, q_valid=q_valid, k_valid=k_valid)

    def attend(implementation):
        return lambda q, k, v, b: F.scaled_dot_product_attention(
            q, k, v, implementation=implementation, **kw
        )

    _assert_same(
        _value_and_grads(attend("chunked"), q, k, v), _value_and_grads(attend("xla"), q, k, v)
    )


def test_chunked_matches_numpy_reference_eagerly():
    shape = (2, 10, 7, 4, 2, 8, 8)
    _, q, k, v, q_valid, k_valid = _inputs(shape, seed=1)
    out = chunked_attention(q, k, v, q_valid=q_valid, k_valid=k_valid, causal=True, **TILES)
    mask = F.combine_masks(F.padding_mask(q_valid, k_valid), F.causal_mask(10, 7))
    want, _ = ref.attention(q, k, v, np.asarray(mask))
    np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out[0], 0.0)  # batch row 0 has no valid key


def test_chunked_empty_rows_give_zeros_and_finite_gradients():
    shape = (2, 6, 8, 2, 2, 4, 4)
    _, q, k, v, _, _ = _inputs(shape, seed=2)
    mask = np.ones((2, 1, 6, 8), bool)
    mask[1, :, 3, :] = False  # one query of batch 1 sees nothing
    bias = np.full((1, 2, 6, 8), 0.5, np.float32)
    bias[..., 0] = -np.inf  # an infinite bias on a key that is also attended elsewhere

    def chunked(q, k, v, bias):
        return chunked_attention(q, k, v, mask=mask, bias=bias, **TILES)

    out, grads = _value_and_grads(chunked, q, k, v, bias)
    np.testing.assert_array_equal(out[1, 3], 0.0)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(grads[0][1, 3], 0.0)


def test_chunked_bfloat16_is_close_to_float32_with_float32_statistics():
    shape = (1, 16, 16, 4, 4, 16, 16)
    _, q, k, v, _, k_valid = _inputs(shape, seed=3)
    k_valid[:] = True
    q, k = q * 30, k * 30  # logits of order 1e3: would overflow a bf16 exp without care
    bf = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    out = chunked_attention(*bf, causal=True, **TILES)
    assert out.dtype == jnp.bfloat16
    plain = F.scaled_dot_product_attention(*bf, causal=True)
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(plain, np.float32), atol=3e-2
    )
    grads = jax.grad(
        lambda q, k, v: jnp.sum(
            chunked_attention(q, k, v, causal=True, **TILES).astype(jnp.float32)
        ),
        argnums=(0, 1, 2),
    )(*bf)
    for g in grads:
        assert g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all()


def _tile_keep_mask(key, rate, B, T, S, K, G, bq, bk):
    """The documented dropout draw: tile (i, j) keeps with bernoulli(fold_in(fold_in(key, i), j))."""
    rows = []
    for i in range(-(-T // bq)):
        cols = [
            jax.random.bernoulli(
                jax.random.fold_in(jax.random.fold_in(key, i), j), 1 - rate, (B, K, G, bq, bk)
            )
            for j in range(-(-S // bk))
        ]
        rows.append(jnp.concatenate(cols, axis=-1))
    keep = jnp.concatenate(rows, axis=-2)[..., :T, :S]
    return keep.reshape(B, K * G, T, S)


def test_chunked_dropout_is_exact_for_its_mask():
    """Value and gradients equal those of dense attention with the same per-tile keep-mask."""
    B, T, S, H, K, D = 2, 9, 7, 4, 2, 8
    _, q, k, v, _, k_valid = _inputs((B, T, S, H, K, D, D), seed=4)
    rate, key = 0.3, jax.random.key(5)
    keep = _tile_keep_mask(key, rate, B, T, S, K, H // K, 4, 4)
    mask = F.combine_masks(F.padding_mask(None, k_valid), F.causal_mask(T, S))

    def dense(q, k, v, bias):
        w = F.attention_weights(q, k, mask)
        w = jnp.where(keep, w / (1 - rate), 0.0)  # [B, H, T, S]
        vh = jnp.repeat(v, H // K, axis=2)
        return jnp.einsum("bhts,bshd->bthd", w, vh)

    def chunked(q, k, v, bias):
        return chunked_attention(
            q, k, v, k_valid=k_valid, causal=True, dropout_rate=rate, dropout_rng=key, **TILES
        )

    _assert_same(_value_and_grads(chunked, q, k, v), _value_and_grads(dense, q, k, v))
    other = chunked_attention(
        q, k, v, k_valid=k_valid, causal=True, dropout_rate=rate, dropout_rng=jax.random.key(6)
    )
    assert not np.allclose(other, chunked(q, k, v, None))


def test_chunked_memory_grows_linearly():
    """Compiled temporaries of forward + backward: x4 length -> about x4 memory, not x16."""

    def temp_bytes(T, implementation):
        x = jax.ShapeDtypeStruct((1, T, 2, 16), jnp.float32)

        def loss(q, k, v):
            out = F.scaled_dot_product_attention(
                q, k, v, causal=True, implementation=implementation
            )
            return jnp.sum(out)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(1024, "chunked"), temp_bytes(4096, "chunked")
    assert large < 6 * small, (small, large)
    assert large * 8 < temp_bytes(4096, "xla")


def test_chunked_under_vmap():
    _, q, k, v, _, k_valid = _inputs((2, 6, 6, 2, 2, 4, 4), seed=7)
    fn = jax.vmap(
        lambda q, k, v, m: chunked_attention(q[None], k[None], v[None], k_valid=m[None], **TILES)[0]
    )
    want = F.scaled_dot_product_attention(q, k, v, k_valid=k_valid)
    np.testing.assert_allclose(fn(q, k, v, k_valid), want, atol=1e-5)


def test_model_with_chunked_attention_matches_xla():
    c = jf.TransformerConfig.tiny(
        50,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_model=16,
        num_heads=4,
        num_kv_heads=2,
        d_ff=32,
    )
    rng = np.random.default_rng(8)
    src, tgt = rng.integers(3, 50, (2, 11)), rng.integers(3, 50, (2, 7))
    src_valid = np.arange(11)[None, :] < np.array([[11], [6]])
    tgt_valid = np.arange(7)[None, :] < np.array([[7], [4]])
    outs = []
    for impl in ("xla", "chunked"):
        model = jf.Transformer(c.replace(attention_impl=impl), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)

        def loss(params, graphdef=graphdef):
            logits = nnx.merge(graphdef, params)(src, tgt, src_valid, tgt_valid)
            return jnp.sum(logits * tgt_valid[..., None])

        outs.append(jax.jit(jax.value_and_grad(loss))(params))
    (l1, g1), (l2, g2) = outs
    assert float(l1) == pytest.approx(float(l2), rel=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_implementation_errors_are_named():
    q = np.zeros((1, 3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="implementation must be one of"):
        F.scaled_dot_product_attention(q, q, q, implementation="flash")
    p = F.AttentionParams(*(np.zeros(s, np.float32) for s in [(8, 2, 4)] * 3 + [(2, 4, 8)]))
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match="return_weights needs .*'xla'"):
        F.multi_head_attention(x, x, p, implementation="chunked", return_weights=True)
    with pytest.raises(ValueError, match=r"k_valid must have shape \[B, 3\]"):
        F.scaled_dot_product_attention(q, q, q, k_valid=np.ones((1, 4), bool))
    with pytest.raises(TypeError, match="q_valid must be a boolean array"):
        F.scaled_dot_product_attention(q, q, q, q_valid=np.ones((1, 3), np.int32))
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        jf.TransformerConfig.tiny(10, attention_impl="flash")
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="'cudnn' needs an NVIDIA GPU"):
            F.scaled_dot_product_attention(q, q, q, implementation="cudnn")


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
@pytest.mark.parametrize("masking", ["none", "causal+valid", "keys"])
def test_cudnn_matches_plain(masking):
    """cuDNN in bfloat16 is as close to the float32 result as XLA in bfloat16 is: relative
    L2 error below 1e-2 (XLA's is 2-4e-3) for the output and each gradient. Element-wise
    bounds do not suit bfloat16 kernels: one element in ten thousand may round differently."""
    shape = (2, 64, 48, 8, 2, 64, 64)
    _, q, k, v, q_valid, k_valid = _inputs(shape, seed=9)
    kw = {
        "none": {},
        "causal+valid": dict(causal=True, q_valid=q_valid, k_valid=k_valid),
        "keys": dict(k_valid=k_valid),  # a padding mask [B, 1, 1, S], as training makes
    }[masking]
    bf = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]

    def run(implementation, dtype):
        return _value_and_grads(
            lambda q, k, v, b: F.scaled_dot_product_attention(
                q, k, v, implementation=implementation, **kw
            ).astype(jnp.float32),
            *(a.astype(dtype) for a in bf),
        )

    exact = run("xla", jnp.float32)
    for implementation in ("cudnn", "xla"):
        out, grads = run(implementation, jnp.bfloat16)
        for got, want in zip((out, *grads), (exact[0], *exact[1]), strict=True):
            got = jnp.asarray(got, jnp.float32)
            assert bool(jnp.isfinite(got).all()), implementation
            error = jnp.linalg.norm((got - want).ravel()) / jnp.linalg.norm(want.ravel())
            assert float(error) < 1e-2, (implementation, float(error))


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
def test_cudnn_under_vmap_of_grad_gives_each_seeds_own_gradients():
    """k seeds as one vmapped train step take the vmap of cuDNN attention's gradient (a
    batching rule reported broken until a 2026 JAX): each seed's gradients from the
    vmapped program equal its own program's, to the bfloat16 kernel's rounding (relative
    L2 error below 1e-2)."""
    seeds = [_inputs((2, 64, 48, 4, 4, 32, 32), seed=20 + i) for i in range(3)]
    q, k, v = (jnp.asarray(np.stack([s[i] for s in seeds]), jnp.bfloat16) for i in (1, 2, 3))
    k_valid = jnp.asarray(np.stack([s[5] for s in seeds]))

    def grads(q, k, v, k_valid):
        def loss(q, k, v):
            out = F.scaled_dot_product_attention(q, k, v, implementation="cudnn", k_valid=k_valid)
            return jnp.sum(jnp.sin(out.astype(jnp.float32)) * out.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    together = jax.jit(jax.vmap(grads))(q, k, v, k_valid)
    for i in range(len(seeds)):
        alone = jax.jit(grads)(q[i], k[i], v[i], k_valid[i])
        for got, want in zip(together, alone, strict=True):
            got, want = (jnp.asarray(a, jnp.float32).ravel() for a in (got[i], want))
            assert bool(jnp.isfinite(got).all())
            assert float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want)) < 1e-2


@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_fused_projections_match_reference(self_attention):
    """d_k = d_v: Q, K, V (or K, V) are projected by one product; same values, GQA and biases."""
    rng = np.random.default_rng(10)
    B, T, S, E, H, K, D = 2, 5, 7, 16, 4, 2, 6
    p = F.AttentionParams(
        wq=rng.standard_normal((E, H, D)).astype(np.float32) * 0.3,
        wk=rng.standard_normal((E, K, D)).astype(np.float32) * 0.3,
        wv=rng.standard_normal((E, K, D)).astype(np.float32) * 0.3,
        wo=rng.standard_normal((H, D, E)).astype(np.float32) * 0.3,
        bq=rng.standard_normal((H, D)).astype(np.float32),
        bk=None,  # a missing bias among present ones counts as zero
        bv=rng.standard_normal((K, D)).astype(np.float32),
        bo=rng.standard_normal((E,)).astype(np.float32),
    )
    xq = jnp.asarray(rng.standard_normal((B, T, E)), jnp.float32)
    xkv = xq if self_attention else jnp.asarray(rng.standard_normal((B, S, E)), jnp.float32)
    out = F.multi_head_attention(xq, xkv, p).out
    want = ref.mha(np.asarray(xq), np.asarray(xkv), p)
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)


def test_einsum_f32_bfloat16_gradients_equal_autodiff():
    """The written-out bf16 gradient is autodiff's, computed with bf16 inputs."""
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.standard_normal((3, 5, 8)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((8, 2, 4)), jnp.bfloat16)
    ct = jnp.asarray(rng.standard_normal((3, 5, 2, 4)), jnp.bfloat16)

    def plain(x, w):
        out = jnp.einsum("bte,ehd->bthd", x, w, preferred_element_type=jnp.float32)
        return jnp.sum(out.astype(jnp.bfloat16).astype(jnp.float32) * ct)

    def mine(x, w):
        return jnp.sum(einsum_f32("bte,ehd->bthd", x, w).astype(jnp.float32) * ct)

    assert einsum_f32("bte,ehd->bthd", x, w).dtype == jnp.bfloat16
    for a, b in zip(jax.grad(mine, (0, 1))(x, w), jax.grad(plain, (0, 1))(x, w), strict=True):
        assert a.dtype == b.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2)


# --- "auto": which implementation, and the same numbers as the one it picks ---------------

from jaxformer.functional import attention as attention_module  # noqa: E402


def _spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _choose(q_shape, k_shape, dtype=jnp.float32, *, Dv=None, masked=True, dropout_rate=0.0):
    v_shape = (*k_shape[:3], Dv or k_shape[3])
    return F.choose_implementation(
        _spec(q_shape, dtype),
        _spec(k_shape, dtype),
        _spec(v_shape, dtype),
        masked=masked,
        dropout_rate=dropout_rate,
    )


def test_auto_on_cpu_picks_xla_then_chunked_by_the_size_of_the_logits():
    assert _choose((8, 128, 8, 64), (8, 128, 8, 64)) == "xla"  # 4 MiB of logits
    # 16384 x 16384 logits for 8 heads: 8 GiB, over the 1 GiB budget (no memory is used:
    # the choice reads shapes only).
    assert _choose((1, 16384, 8, 64), (1, 16384, 8, 64)) == "chunked"
    assert F.AUTO_CHUNKED_BYTES == 1 << 30


def test_auto_computes_what_the_implementation_it_picks_computes(monkeypatch):
    _, q, k, v, q_valid, k_valid = _inputs((2, 9, 9, 4, 4, 8, 8), seed=11)
    kw = dict(causal=True, q_valid=q_valid, k_valid=k_valid)

    def run(implementation):
        return _value_and_grads(
            lambda q, k, v, b: F.scaled_dot_product_attention(
                q, k, v, implementation=implementation, **kw
            ),
            q,
            k,
            v,
        )

    _assert_same(run("auto"), run("xla"), atol=0)
    monkeypatch.setattr(attention_module, "AUTO_CHUNKED_BYTES", 1000)  # 2 x 4 x 9 x 9 x 4 > 1000
    assert _choose(q.shape, k.shape) == "chunked"
    _assert_same(run("auto"), run("chunked"), atol=0)


def test_auto_picks_cudnn_only_where_cudnn_takes_the_call(monkeypatch):
    """The cuDNN branch through its support check, on any machine: a pretend NVIDIA GPU
    (no compute capability: not a family tokamax's Mosaic kernel comes first on)."""
    monkeypatch.setenv("XLA_FLAGS", "")
    bf16 = jnp.bfloat16
    with jax.default_device(StandInDevice("gpu", "NVIDIA A100-SXM4-80GB")):
        assert _choose((4, 256, 12, 64), (4, 256, 12, 64), bf16) == "cudnn"
        assert _choose((4, 256, 12, 64), (4, 256, 4, 64), bf16) == "cudnn"  # grouped-query
        assert _choose((4, 256, 12, 64), (4, 256, 12, 64)) == "xla"  # float32
        assert _choose((4, 256, 12, 64), (4, 256, 12, 64), bf16, dropout_rate=0.1) == "xla"
        assert _choose((4, 256, 12, 20), (4, 256, 12, 20), bf16) == "xla"  # head dim 20
        assert _choose((4, 256, 12, 64), (4, 256, 12, 64), bf16, Dv=32) == "xla"  # D != Dv
        assert _choose((4, 255, 12, 64), (4, 255, 12, 64), bf16) == "xla"  # odd T, masked
        assert _choose((4, 255, 12, 64), (4, 255, 12, 64), bf16, masked=False) == "cudnn"
        assert _choose((1, 16384, 8, 64), (1, 16384, 8, 64)) == "chunked"  # float32, long
        monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")  # XLA fails cuDNN
        assert _choose((4, 256, 12, 64), (4, 256, 12, 64), bf16) == "xla"


def test_auto_logs_its_choice_once_per_shape(caplog):
    caplog.set_level("INFO", logger="jaxformer.attention")
    q = jnp.zeros((1, 5, 2, 8))
    for _ in range(3):
        F.scaled_dot_product_attention(q, q, q, causal=True, implementation="auto")
    lines = [r.getMessage() for r in caplog.records if "(1, 5, 2, 8)" in r.getMessage()]
    assert len(lines) <= 1  # one per process: another test may have logged this shape
    F.scaled_dot_product_attention(q[:, :3], q[:, :3], q[:, :3], implementation="auto")
    assert any(
        "(1, 3, 2, 8)" in r.getMessage() and ": xla (" in r.getMessage() for r in caplog.records
    )


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs an NVIDIA GPU")
def test_auto_runs_cudnn_on_a_gpu(monkeypatch):
    """Without tokamax (whose Mosaic kernel "auto" prefers on a Hopper), any NVIDIA GPU."""
    monkeypatch.setenv("XLA_FLAGS", "")  # conftest's deterministic mode steers "auto" off cuDNN
    monkeypatch.setattr(F.kernels, "tokamax_or_none", lambda: None)
    _, q, k, v, q_valid, k_valid = _inputs((2, 64, 64, 8, 2, 64, 64), seed=12)
    bf = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
    assert F.choose_implementation(*bf, masked=True, dropout_rate=0.0) == "cudnn"
    kw = dict(causal=True, q_valid=q_valid, k_valid=k_valid)
    auto = F.scaled_dot_product_attention(*bf, implementation="auto", **kw)
    np.testing.assert_array_equal(
        auto, F.scaled_dot_product_attention(*bf, implementation="cudnn", **kw)
    )
