import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import data, train

TOK = data.ByteTokenizer()


def _setup(dropout=0.0, accum=1, kind="transformer"):
    c = jf.TransformerConfig.tiny(
        TOK.vocab_size, d_model=32, num_heads=2, d_ff=64, dropout_rate=dropout, max_len=64
    )
    model = (jf.Transformer if kind == "transformer" else jf.DecoderLM)(c, rngs=nnx.Rngs(0))
    sched = optax.constant_schedule(3e-3)
    opt = train.make_optimizer(sched)
    graphdef, state = train.create_train_state(model, opt, seed=0)
    step = train.make_train_step(graphdef, opt, sched, label_smoothing=0.1, accum_steps=accum)
    return graphdef, state, jax.jit(step)


def test_accumulation_equals_the_large_batch():
    d = data.TaskData("copy", TOK, seed=0, dev_size=10)
    batch = d.train_batch(0, 16)
    _, s1, step1 = _setup()
    _, s4, step4 = _setup(accum=4)
    s1, m1 = step1(s1, batch)
    s4, m4 = step4(s4, batch)
    assert float(m1["loss"]) == pytest.approx(float(m4["loss"]), rel=1e-6)
    assert float(m1["grad_norm"]) == pytest.approx(float(m4["grad_norm"]), rel=1e-5)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_few_steps_lower_the_loss_on_copy():
    d = data.TaskData("copy", TOK, seed=0, dev_size=10)
    _, state, step = _setup(dropout=0.1)
    losses = []
    for i in range(60):
        state, m = step(state, d.train_batch(i, 32))
        losses.append(float(m["loss"]))
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    assert int(state.step) == 60


def test_dropout_key_comes_from_the_step():
    """Same state and batch give the same update; the step number changes the dropout."""
    d = data.TaskData("copy", TOK, seed=0, dev_size=10)
    batch = d.train_batch(0, 8)
    _, state, step = _setup(dropout=0.3)
    a = step(jax.tree.map(lambda x: x.copy(), state), batch)[1]["loss"]
    b = step(jax.tree.map(lambda x: x.copy(), state), batch)[1]["loss"]
    assert float(a) == float(b)
    later = state.replace(step=state.step + 1)
    assert float(step(later, batch)[1]["loss"]) != float(a)


def test_lm_step_runs_on_packed_text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"document number {i} says hello" for i in range(40)))
    d = data.TextData(path, TOK, seq_len=32)
    _, state, step = _setup(kind="lm")
    state, m = step(state, d.train_batch(0, 4))
    assert np.isfinite(float(m["loss"])) and float(m["tokens"]) > 0


def test_bfloat16_compute_trains_with_float32_params():
    c = jf.TransformerConfig.tiny(
        TOK.vocab_size, d_model=32, num_heads=2, d_ff=64, max_len=64, dtype="bfloat16"
    )
    model = jf.Transformer(c, rngs=nnx.Rngs(0))
    sched = optax.constant_schedule(3e-3)
    opt = train.make_optimizer(sched)
    graphdef, state = train.create_train_state(model, opt, seed=0)
    step = jax.jit(train.make_train_step(graphdef, opt, sched, label_smoothing=0.1))
    d = data.TaskData("copy", TOK, seed=0, dev_size=10)
    for i in range(3):
        state, m = step(state, d.train_batch(i, 8))
    assert np.isfinite(float(m["loss"]))
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}


def _gradients(dtype: str, lm_head: str) -> list[np.ndarray]:
    """The loss gradients of a small GPT-2-shaped model in `dtype` compute: the same
    parameters and batch whatever the dtype (parameters are float32)."""
    V = 1024
    config = jf.TransformerConfig(
        vocab_size=V,
        num_encoder_layers=0,
        num_decoder_layers=2,
        d_model=128,
        d_ff=512,
        num_heads=4,
        max_len=64,
        position_embedding="learned",
        norm_placement="pre",
        activation="gelu_tanh",
        embed_scale=False,
        attention_bias=True,
        dtype=dtype,
        attention_impl="xla",
        lm_head=lm_head,
    )
    graphdef, params = nnx.split(jf.DecoderLM(config, rngs=nnx.Rngs(0)))
    tokens = np.random.default_rng(0).integers(0, V, (8, 65), dtype=np.int32)
    batch = {"tgt_in": tokens[:, :-1], "tgt_out": tokens[:, 1:]}

    def loss(params):
        model = nnx.merge(graphdef, params)
        sums = train.model_loss_sums(model, batch, rng=None, label_smoothing=0.1)
        return sums.loss / sums.tokens

    return [np.asarray(g, np.float64) for g in jax.tree.leaves(jax.jit(jax.grad(loss))(params))]


@pytest.mark.parametrize("lm_head", ["dense", "chunked"])
def test_bfloat16_gradients_stay_within_the_float32_models_error(lm_head):
    """All products on bfloat16 operands, forward and backward: the gradient's error against
    the float32 model, |g_bf16 - g_f32| / |g_f32| over every parameter, is 1.08% here for
    both heads (on a CPU); it was 1.06% when the backward products of the LM head and the
    attention took the float32 cotangent of their float32 results."""
    low, full = _gradients("bfloat16", lm_head), _gradients("float32", lm_head)
    error = sum(((a - b) ** 2).sum() for a, b in zip(low, full, strict=True))
    relative = np.sqrt(error / sum((b**2).sum() for b in full))
    assert 0.005 < relative < 0.0115


def test_plain_arrays_train_bit_identically_to_nnx_variables():
    """The state crosses `jit` as plain arrays; the same step over a state of nnx Variables
    (as it was) gives the same losses and parameters to the bit."""
    d = data.TaskData("copy", TOK, seed=0, dev_size=10)
    graphdef, state, step = _setup(dropout=0.1)
    _, variables = nnx.split(nnx.merge(graphdef, state.params))
    opt = train.make_optimizer(optax.constant_schedule(3e-3))
    as_variables = state.replace(params=variables, opt_state=opt.init(variables))
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    assert all(map(is_variable, jax.tree.leaves(as_variables.params, is_leaf=is_variable)))
    for i in range(3):
        batch = d.train_batch(i, 8)
        state, plain_metrics = step(state, batch)
        as_variables, variable_metrics = step(as_variables, batch)
        assert float(plain_metrics["loss"]) == float(variable_metrics["loss"])
    for a, b in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(as_variables.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)
