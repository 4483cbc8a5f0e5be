"""Packed rows: documents' segment ids travel as structure to every implementation that
takes them ("xla", "chunked", "splash", "tokamax_xla"), and each document comes out as if it
ran alone: attention against a NumPy run of each document on its own, the model's logits
and loss gradients against each document run alone, and no gradient across documents or
backwards in time. Kernels whose library takes no segment ids refuse them by name."""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxformer import functional as F
from jaxformer.accelerators import StandInDevice
from jaxformer.checks import BadValue
from jaxformer.config import TransformerConfig
from jaxformer.functional.chunked_attention import chunked_attention
from jaxformer.models import DecoderLM
from tests import reference as ref

TOKAMAX = importlib.util.find_spec("tokamax") is not None
IMPLEMENTATIONS = ["xla", "chunked_tiles3", "tokamax_xla"] if TOKAMAX else ["xla", "chunked_tiles3"]


@F.ATTENTION.register("chunked_tiles3", raw_masks=True)
def _chunked_tiles3(q, k, v, **kw):
    """ "chunked" with 3 x 3 tiles: documents and padding cross the tiles' edges."""
    return chunked_attention(q, k, v, block_q=3, block_k=3, **kw)


def _per_document(q, k, v, seg, causal):
    """NumPy (float64): each document's tokens (seg > 0) attend among themselves only, run
    as a sequence of their own; padding (seg == 0) gives zeros."""
    out = np.zeros(q.shape[:3] + v.shape[-1:])
    for b in range(q.shape[0]):
        for doc in set(seg[b].tolist()) - {0}:
            at = np.flatnonzero(seg[b] == doc)
            n = len(at)
            mask = np.tril(np.ones((n, n), bool)) if causal else None
            out[b, at] = ref.attention(q[b : b + 1, at], k[b : b + 1, at], v[b : b + 1, at], mask)[
                0
            ][0]
    return out


def _qkv(B, T, H=4, K=2, D=8, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, n, D)).astype(dtype) for n in (H, K, K)]


layouts = st.integers(1, 12).flatmap(
    lambda T: st.lists(st.lists(st.integers(0, 3), min_size=T, max_size=T), min_size=1, max_size=2)
)


@settings(max_examples=15, deadline=None)
@given(seg=layouts, causal=st.booleans(), shared=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_each_document_attends_as_if_alone(implementation, seg, causal, shared, seed):
    """Any ids, interleaved or not, with padding (0) anywhere, the keys' ids given or left
    to be the queries' (shared): equal to NumPy running each document on its own, jitted."""
    seg = np.array(seg, np.int32)
    q, k, v = _qkv(*seg.shape, seed=seed)
    attend = jax.jit(
        functools.partial(
            F.scaled_dot_product_attention, implementation=implementation, causal=causal
        )
    )
    out = attend(q, k, v, q_segments=seg, k_segments=None if shared else seg)
    np.testing.assert_allclose(out, _per_document(q, k, v, seg, causal), atol=1e-5, rtol=1e-5)


def _grads(implementation, q, k, v, **kw):
    def loss(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, implementation=implementation, **kw)
        return jnp.sum(jnp.sin(out) * out), out

    (_, out), grads = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
    return out, grads


PACKED = np.array([[1] * 5 + [2] * 9 + [3] * 2 + [0] * 4, [4] * 20], np.int32)  # [2, 20]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS[1:])
def test_gradients_equal_the_dense_segment_mask(implementation):
    """With padding, key lengths and validity vectors besides, eagerly: the same values and
    gradients as "xla" given the segment mask as a NumPy-built boolean array."""
    q, k, v = _qkv(2, 20, seed=1)
    lengths = np.array([18, 13], np.int32)
    q_valid = np.arange(20)[None, :] % np.array([[7], [5]]) != 3
    same = (PACKED[:, None, :, None] == PACKED[:, None, None, :]) & (PACKED[:, None, None, :] > 0)
    dense = same & (np.arange(20)[None, :] < lengths[:, None])[:, None, None, :]
    want = _grads("xla", q, k, v, mask=dense, causal=True, q_valid=q_valid)
    got = _grads(
        implementation, q, k, v, causal=True, k_lengths=lengths, q_valid=q_valid,
        q_segments=PACKED, k_segments=PACKED,
    )  # fmt: skip
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@settings(max_examples=10, deadline=None)
@given(t=st.integers(0, 19), causal=st.booleans())
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_no_gradient_across_documents_or_backwards_in_time(implementation, t, causal):
    """d out_t / d (k_s, v_s) is exactly zero for s in another document (or padding) and,
    when causal, for s > t; a padding query's output depends on nothing."""
    q, k, v = _qkv(2, 20, seed=2)
    kw = dict(causal=causal, q_segments=PACKED, k_segments=PACKED, implementation=implementation)
    _, pullback = jax.vjp(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    cotangent = np.zeros((2, 20, 4, 8), np.float32)
    cotangent[:, t] = 1.0
    _, dk, dv = pullback(cotangent)
    s = np.arange(20)
    reach = (PACKED == PACKED[:, t : t + 1]) & (PACKED[:, t : t + 1] > 0)  # [B, S]
    if causal:
        reach &= s[None, :] <= t
    for d in (dk, dv):
        assert np.all(np.asarray(d)[~reach] == 0.0)
    assert np.all(np.any(np.asarray(dv)[reach] != 0.0, axis=(1, 2)))  # each key it sees moves


# --- splash (Pallas interpret mode on a CPU) ---------------------------------------------

SPLASH_ROWS = np.stack(
    [
        np.repeat([1, 2, 3, 0], [40, 50, 30, 8]),  # three documents, padding at the end
        np.repeat([5, 6, 5, 0, 7], [30, 30, 20, 8, 40]),  # interleaved ids, padding inside
    ]
).astype(np.int32)  # [2, 128]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shared", [True, False], ids=["shared_ids", "own_key_ids"])
def test_splash_takes_segments_equal_to_each_document_alone_with_gradients(shared, causal):
    """Both of splash's paths: keys' ids left to be the queries' (padding queries then see
    zeroed padding values, no zeroing after the kernel) and given (rows zeroed after)."""
    q, k, v = _qkv(2, 128, H=2, K=1, D=64, seed=3)
    keys = None if shared else SPLASH_ROWS
    kw = dict(causal=causal, q_segments=SPLASH_ROWS, k_segments=keys)
    out, grads = _grads("splash", q, k, v, **kw)
    np.testing.assert_allclose(
        out, _per_document(q, k, v, SPLASH_ROWS, causal), atol=1e-5, rtol=1e-5
    )
    _, want = _grads("xla", q, k, v, **kw)
    for a, b in zip(grads, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


# --- the model: documents in a packed row as if run alone --------------------------------


def _model(implementation, length):
    config = TransformerConfig.tiny(
        61, num_encoder_layers=0, d_model=32, d_ff=64, num_heads=4, num_kv_heads=2,
        max_len=length, attention_impl=implementation, dropout_rate=0.0,
    )  # fmt: skip
    return DecoderLM(config, rngs=nnx.Rngs(0))


def _packed_row(lengths, T, seed=0):
    """One row of documents of `lengths` then padding to T: tokens, segment ids (1, 2, ...),
    positions restarting at 0 in each document."""
    rng = np.random.default_rng(seed)
    seg = np.concatenate(
        [np.full(n, d + 1) for d, n in enumerate(lengths)] + [np.zeros(T - sum(lengths))]
    )
    positions = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(T - sum(lengths))])
    return (
        rng.integers(1, 61, (1, T)).astype(np.int32),
        seg[None].astype(np.int32),
        positions[None].astype(np.int32),
    )


def _alone(lengths, tokens, T):
    """Each document of the row as a row of its own, right-padded to T: (start, tokens, valid)."""
    starts = np.cumsum([0, *lengths[:-1]])
    for start, n in zip(starts, lengths, strict=True):
        row = np.zeros((1, T), np.int32)
        row[0, :n] = tokens[0, start : start + n]
        yield start, row, np.arange(T)[None, :] < n


def _loss(model, tokens, weights, **kw):
    """Cross-entropy of each next token, summed over `weights` [B, T - 1] (True where a
    token and the next are of one document): documents add up."""
    logits = model(tokens, **kw)[:, :-1]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(nll * weights)


MODEL_CASES = [
    ("xla", 24, [7, 10, 4]),
    ("chunked_tiles3", 24, [7, 10, 4]),
    ("tokamax_xla", 24, [7, 10, 4]),
    ("splash", 128, [50, 41, 30]),
]


@pytest.mark.parametrize("implementation, T, lengths", MODEL_CASES)
def test_packed_logits_and_loss_gradients_equal_each_document_alone(implementation, T, lengths):
    """float32: each document's logits within 1e-5 of it run alone (same implementation),
    and the packed row's loss gradient equals the sum of the documents' own."""
    if implementation.startswith("tokamax") and not TOKAMAX:
        pytest.skip("the kernels extra: pip install 'jaxformer[kernels]'")
    model = _model(implementation, T)
    graphdef, params = nnx.split(model)
    tokens, seg, positions = _packed_row(lengths, T)
    packed = dict(segment_ids=seg, positions=positions)

    def loss(params, tokens, weights, **kw):
        return _loss(nnx.merge(graphdef, params), tokens, weights, **kw)

    grad = jax.jit(jax.value_and_grad(loss))
    logits = jax.jit(lambda p, t, **kw: nnx.merge(graphdef, p)(t, **kw))
    packed_logits = logits(params, tokens, **packed)
    _, want = grad(params, tokens, (seg[:, :-1] > 0) & (seg[:, :-1] == seg[:, 1:]), **packed)
    total = jax.tree.map(jnp.zeros_like, params)
    for start, row, valid in _alone(lengths, tokens, T):
        n = int(valid.sum())
        alone = logits(params, row, valid=valid)
        np.testing.assert_allclose(
            packed_logits[0, start : start + n], alone[0, :n], atol=1e-5, rtol=1e-5
        )
        total = jax.tree.map(jnp.add, total, grad(params, row, valid[:, 1:], valid=valid)[1])
    for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("implementation", ["xla", "chunked_tiles3"])
def test_the_decoder_stack_passes_no_gradient_across_documents(implementation):
    """Through every layer (attention, feed-forward, norms): the outputs at position t have
    zero gradient with respect to inputs of another document or of later positions."""
    model = _model(implementation, 24)
    _, seg, _ = _packed_row([7, 10, 4], 24)
    x = np.random.default_rng(4).standard_normal((1, 24, 32)).astype(np.float32)
    mask = F.AttentionMask(causal=True, q_segments=seg, k_segments=seg)
    _, pullback = jax.vjp(lambda x: model.decoder(x, mask).y, x)
    for t in (0, 6, 7, 15, 20, 22):
        cotangent = np.zeros_like(x)
        cotangent[0, t] = 1.0
        (dx,) = pullback(cotangent)
        moved = np.flatnonzero(np.any(np.asarray(dx)[0] != 0.0, axis=-1))
        if seg[0, t] == 0:
            assert moved.tolist() == [t]  # padding sees nothing; only its own residual path
        else:
            assert set(moved) <= set(np.flatnonzero((seg[0] == seg[0, t]) & (np.arange(24) <= t)))
            assert t in moved


# --- "auto" and the kernels that take no segment ids ------------------------------------


def _spec(T=256, dtype=jnp.bfloat16):
    return [jax.ShapeDtypeStruct((2, T, 8, 64), dtype)] * 3


def test_auto_gives_packed_rows_splash_on_a_tpu():
    with jax.default_device(StandInDevice("tpu", "TPU v5 lite")):
        choice = F.choose_implementation(*_spec(), masked=True, dropout_rate=0.0, segmented=True)
    assert choice == "splash"


def test_auto_on_a_gpu_says_why_packed_rows_get_no_fused_kernel(monkeypatch, caplog):
    """cuDNN (jax.nn) and tokamax's kernels take no segment ids: "auto" runs XLA's code and
    logs each refusal, once per shape."""
    monkeypatch.setenv("XLA_FLAGS", "")
    caplog.set_level("INFO", logger="jaxformer.attention")
    with jax.default_device(StandInDevice("gpu", "NVIDIA H100 80GB HBM3", "9.0")):
        choose = functools.partial(
            F.choose_implementation, *_spec(T=254), masked=True, dropout_rate=0.0
        )
        assert choose(segmented=True) == "xla"
        assert choose(segmented=True) == "xla"
    said = [r.getMessage() for r in caplog.records if "(2, 254, 8, 64)" in r.getMessage()]
    assert len(said) == 1, said
    assert "no cudnn: takes no segment ids: jax.nn.dot_product_attention has no argument" in said[0]
    if TOKAMAX:
        assert "no tokamax_mosaic: takes no segment ids: tokamax.dot_product_attention" in said[0]


@pytest.mark.parametrize("implementation", ["cudnn", "tokamax_mosaic", "tokamax_triton"])
def test_a_kernel_that_takes_no_segments_refuses_them_in_one_line(implementation):
    if implementation.startswith("tokamax") and not TOKAMAX:
        pytest.skip("the kernels extra: pip install 'jaxformer[kernels]'")
    q, k, v = _qkv(2, 20)
    library = "jax.nn" if implementation == "cudnn" else "tokamax"
    message = rf"^implementation='{implementation}' takes no segment ids: {library}\.dot_product_attention"
    with pytest.raises(BadValue, match=message):
        F.scaled_dot_product_attention(
            q,
            k,
            v,
            causal=True,
            q_segments=PACKED,
            k_segments=PACKED,
            implementation=implementation,
        )


def test_segment_ids_are_checked_at_the_boundary():
    q, k, v = _qkv(2, 20)
    cases = [
        (dict(k_segments=PACKED), "k_segments needs q_segments"),
        (dict(q_segments=PACKED, k_segments=PACKED[:, :5]), r"k_segments .*\[B, S\]"),
        (dict(q_segments=PACKED > 0, k_segments=PACKED), "q_segments must be an integer array"),
    ]
    for kw, message in cases:
        with pytest.raises((ValueError, TypeError), match=message):
            F.scaled_dot_product_attention(q, k, v, **kw)
