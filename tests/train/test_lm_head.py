"""The chunked output head + loss against the dense logits and `cross_entropy`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import data
from jaxformer.functional import chunked_cross_entropy, cross_entropy
from jaxformer.functional.layers import tied_logits
from jaxformer.train import lm_head_choice, model_loss_sums
from jaxformer.train.steps import AUTO_CHUNKED_LOGITS, auto_chunked_logits

TOK = data.ByteTokenizer()


def _problem(dtype, V=300, E=16, bias=True, seed=0):
    """hidden [3, 5, E], table [V, E], bias, targets (a third of them the argmax, so that
    accuracy is not zero) and weights with padding."""
    k = jax.random.split(jax.random.key(seed), 5)
    hidden = jax.random.normal(k[0], (3, 5, E)).astype(dtype)
    table = (jax.random.normal(k[1], (V, E)) * 0.5).astype(dtype)
    b = jax.random.normal(k[2], (V,)) if bias else None
    targets = jax.random.randint(k[3], (3, 5), 0, V)
    argmax = jnp.argmax(_dense_logits(hidden, table, b), axis=-1)
    targets = jnp.where(jnp.arange(5)[None, :] % 3 == 0, argmax, targets)
    weights = jax.random.bernoulli(k[4], 0.7, (3, 5))
    return hidden, table, b, targets, weights


def _dense_logits(hidden, table, bias):
    logits = tied_logits(hidden, table)
    return logits if bias is None else logits + bias[None, None, :]


def _losses(head, eps, targets, weights, chunk_size):
    """f(hidden, table, bias) -> LossSums through the dense or the chunked head."""

    def dense(hidden, table, bias):
        logits = _dense_logits(hidden, table, bias)
        return cross_entropy(logits, targets, weights, label_smoothing=eps)

    def chunked(hidden, table, bias):
        return chunked_cross_entropy(
            hidden, table, bias, targets, weights, label_smoothing=eps, chunk_size=chunk_size
        )

    return jax.jit(dense if head == "dense" else chunked)


def _grads(f, *args):
    """Gradients of loss + 0.3 nll (both outputs' backward paths) w.r.t. hidden, table,
    bias (None-safe)."""
    argnums = (0, 1, 2) if args[2] is not None else (0, 1)

    def objective(*a):
        sums = f(*a)
        return sums.loss + 0.3 * sums.nll

    return jax.jit(jax.grad(objective, argnums=argnums))(*args)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize(("chunk_size", "bias"), [(64, True), (300, False), (4096, True)])
def test_chunked_equals_dense_in_values_and_gradients(eps, chunk_size, bias):
    hidden, table, b, targets, weights = _problem(jnp.float32, bias=bias)
    dense = _losses("dense", eps, targets, weights, chunk_size)
    chunked = _losses("chunked", eps, targets, weights, chunk_size)
    want, got = dense(hidden, table, b), chunked(hidden, table, b)
    assert float(want.correct) > 0  # the argmax targets count
    for name in ("loss", "nll", "correct", "tokens"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-5, err_msg=name)
    for g_want, g_got in zip(
        _grads(dense, hidden, table, b), _grads(chunked, hidden, table, b), strict=True
    ):
        np.testing.assert_allclose(g_got, g_want, rtol=1e-5, atol=1e-5)


def test_chunked_equals_dense_in_bfloat16():
    """bfloat16 hidden states and table (the models' bfloat16 compute): the dense head's
    logits are written in bfloat16 (the product's dtype), the chunked head's stay float32
    within a chunk, so the losses agree to bfloat16's resolution of the logits, and the
    gradients to bfloat16's resolution (they are rounded to it)."""
    hidden, table, b, targets, weights = _problem(jnp.bfloat16)
    dense = _losses("dense", 0.1, targets, weights, 64)
    chunked = _losses("chunked", 0.1, targets, weights, 64)
    want, got = dense(hidden, table, b), chunked(hidden, table, b)
    np.testing.assert_allclose(got.loss, want.loss, rtol=2**-8)
    np.testing.assert_allclose(got.nll, want.nll, rtol=2**-8)
    for g_want, g_got in zip(
        _grads(dense, hidden, table, b), _grads(chunked, hidden, table, b), strict=True
    ):
        assert g_got.dtype == g_want.dtype
        scale = float(jnp.max(jnp.abs(g_want.astype(jnp.float32))))
        np.testing.assert_allclose(
            g_got.astype(jnp.float32), g_want.astype(jnp.float32), atol=2**-7 * scale
        )


def test_padding_does_not_reach_the_chunked_gradients():
    hidden, table, b, targets, weights = _problem(jnp.float32)
    f = _losses("chunked", 0.1, targets, weights, 64)
    g_hidden = _grads(f, hidden, table, b)[0]
    assert np.all(np.asarray(g_hidden)[~np.asarray(weights)] == 0)
    assert np.any(np.asarray(g_hidden)[np.asarray(weights)] != 0)


def test_auto_is_dense_for_small_heads_and_chunked_for_large():
    assert lm_head_choice("auto", 512, 300) == "dense"
    # the threshold is this device's (a GPU's is larger than a CPU's AUTO_CHUNKED_LOGITS)
    assert lm_head_choice("auto", auto_chunked_logits() // 50304 + 1, 50304) == "chunked"
    assert lm_head_choice("dense", 10**6, 10**5) == "dense"
    assert lm_head_choice("chunked", 1, 2) == "chunked"
    with pytest.raises(ValueError, match="lm_head must be one of"):
        lm_head_choice("fused", 1, 2)
    with pytest.raises(ValueError, match="lm_head must be one of"):
        jf.TransformerConfig.tiny(100, lm_head="fused")


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_auto_keeps_the_dense_head_while_its_logits_fit_an_eighth_of_the_device():
    h100 = _Device({"bytes_limit": 80 * 10**9, "bytes_in_use": 0})
    assert auto_chunked_logits(h100) == 2_500_000_000 > 32 * 1024 * 50304  # GPT-2, batch 32
    assert auto_chunked_logits(_Device(None)) == AUTO_CHUNKED_LOGITS  # a CPU reports none
    assert auto_chunked_logits(_Device({"bytes_limit": 10**6})) == AUTO_CHUNKED_LOGITS


def test_bad_input_to_the_chunked_head():
    hidden, table, b, targets, weights = _problem(jnp.float32)
    with pytest.raises(ValueError, match=r"table float32\[300, 8\] must be \[V, E=16\]"):
        chunked_cross_entropy(hidden, table[:, :8], b, targets, weights)
    with pytest.raises(ValueError, match=r"must be \[V, E=16\] in hidden's dtype bfloat16"):
        chunked_cross_entropy(hidden.astype(jnp.bfloat16), table, b, targets, weights)
    with pytest.raises(ValueError, match=r"targets \(3, 4\) and weights \(3, 5\) must be"):
        chunked_cross_entropy(hidden, table, b, targets[:, :4], weights)
    with pytest.raises(ValueError, match=r"bias \(299,\) must be \[V\]"):
        chunked_cross_entropy(hidden, table, b[:299], targets, weights)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_cross_entropy(hidden, table, b, targets, weights, chunk_size=0)


def _model_and_batch(kind, lm_head, dtype="float32"):
    config = jf.TransformerConfig.tiny(
        TOK.vocab_size,
        d_model=32,
        num_heads=2,
        d_ff=64,
        max_len=64,
        dropout_rate=0.1,
        lm_head=lm_head,
        dtype=dtype,
        logits_bias=kind == "lm",
    )
    if kind == "transformer":
        batch = data.TaskData("copy", TOK, seed=0, dev_size=4).train_batch(0, 4)
        return jf.Transformer(config, rngs=nnx.Rngs(0)), batch
    tokens = jax.random.randint(jax.random.key(1), (4, 13), 0, TOK.vocab_size)
    valid = jnp.arange(12)[None, :] < jnp.array([[12], [7], [12], [3]])
    batch = dict(tgt_in=tokens[:, :-1], tgt_out=tokens[:, 1:], tgt_valid=valid)
    return jf.DecoderLM(config, rngs=nnx.Rngs(0)), batch


@pytest.mark.parametrize("kind", [pytest.param("transformer", marks=pytest.mark.slow), "lm"])
def test_a_models_chunked_loss_and_parameter_gradients_equal_the_dense(kind):
    """The training loss of either model kind (dropout on, padding, smoothing 0.1, a logits
    bias on the LM) and its gradients w.r.t. every parameter."""
    results = []
    for lm_head in ("dense", "chunked"):
        model, batch = _model_and_batch(kind, lm_head)
        graphdef, params = nnx.split(model)

        def loss(params, graphdef=graphdef, batch=batch):
            model = nnx.merge(graphdef, params)
            sums = model_loss_sums(model, batch, rng=jax.random.key(2), label_smoothing=0.1)
            return sums.loss, sums

        results.append(jax.jit(jax.grad(loss, has_aux=True))(params))
    (g_dense, dense), (g_chunked, chunked) = results
    assert float(dense.tokens) < batch["tgt_valid"].size  # padding is present
    for name in ("loss", "nll", "correct", "tokens"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(dense, name), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_dense), jax.tree.leaves(g_chunked), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_auto_keeps_the_dense_program_for_a_small_model():
    """A tiny model's "auto" step lowers to the same program as "dense"."""
    lowered = []
    for lm_head in ("auto", "dense"):
        model, batch = _model_and_batch("lm", lm_head)
        graphdef, params = nnx.split(model)

        def loss(params, graphdef=graphdef, batch=batch):
            model = nnx.merge(graphdef, params)
            return model_loss_sums(model, batch, rng=None, label_smoothing=0.1).loss

        lowered.append(jax.jit(jax.grad(loss)).lower(params).as_text())
    assert lowered[0] == lowered[1]
