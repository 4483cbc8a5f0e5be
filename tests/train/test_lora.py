"""LoRA (`nn.add_lora`, `--lora-rank`): the adapters' parameter count, their math against
NumPy, merged against unmerged logits, frozen base weights absent from the optimizer's
state, exact resume, a LoRA run folder in `generate`, and the one-line refusals."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.cli import main
from jaxformer.nn import FeedForward, MultiHeadAttention, add_lora, lora_weight, merge_lora
from jaxformer.nn.parameters import plain
from jaxformer.train import loop, setup
from tests.train.test_loop import losses, run_config, small_config

GPT2_SMALL = dict(d_model=768, num_heads=12, d_ff=3072, num_decoder_layers=12, max_len=1024)
ALL = "q,k,v,o,ff"


def gpt2_like(**fields):
    """A decoder-only model of GPT-2's shape (learned positions, GELU, biases)."""
    config = jf.TransformerConfig.tiny(50257).replace(
        num_encoder_layers=0,
        position_embedding="learned",
        activation="gelu",
        attention_bias=True,
        **(GPT2_SMALL | fields),
    )
    return config


def analytic_count(config, rank: int, targets: str) -> int:
    """sum over adapted projections of r (d_in + d_out), by hand from the config."""
    E, F, L = config.d_model, config.d_ff, config.num_decoder_layers
    per = {"q": 2 * E, "k": 2 * E, "v": 2 * E, "o": 2 * E, "ff": 2 * (E + F)}
    return L * rank * sum(per[t] for t in targets.split(","))


def lora_trainable(model) -> dict:
    """Per parameter (TrainState.params' tree): whether it is an adapter's."""
    flags = {p: isinstance(v, nnx.LoRAParam) for p, v in nnx.to_flat_state(nnx.state(model))}
    return plain(nnx.from_flat_state(flags))


def lora_count(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


@pytest.mark.parametrize(("rank", "targets"), [(4, "q,v"), (8, "q,v"), (16, "q,v"), (4, ALL)])
def test_trainable_parameters_are_the_analytic_count_under_one_percent(rank, targets):
    config = gpt2_like()
    model = nnx.eval_shape(
        lambda: add_lora(jf.DecoderLM(config, rngs=nnx.Rngs(0)), rank, targets=targets)
    )
    assert lora_count(model) == analytic_count(config, rank, targets)
    total = jf.count_params(model) - lora_count(model)
    assert 120e6 < total < 130e6  # GPT-2 small's 124M
    assert lora_count(model) / total < 0.01
    # only adapters are LoRAParam: the base weights are plain Params
    assert all(
        not isinstance(v, nnx.LoRAParam)
        for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
        if "_lora" not in str(_)
    )


def _randomised(model, seed=1):
    """`model` with every B drawn at random (B starts at zero: the adapters add nothing)."""
    key = jax.random.key(seed)
    for path, v in nnx.iter_graph(model):
        if isinstance(v, nnx.LoRAParam) and path[-1] == "lora_b":
            key, sub = jax.random.split(key)
            v.set_value(0.05 * jax.random.normal(sub, v.shape))
    return model


@pytest.mark.parametrize("scan", [False, True])
def test_merged_and_unmerged_logits_agree(scan):
    config = gpt2_like(d_model=64, num_heads=4, d_ff=128, num_decoder_layers=2, max_len=32)
    config = config.replace(vocab_size=97, scan_layers=scan)
    base = jf.DecoderLM(config, rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(2), (2, 16), 0, 97)
    before = np.asarray(base(ids))
    model = add_lora(nnx.clone(base), 8, alpha=16.0, targets=ALL)
    np.testing.assert_array_equal(np.asarray(model(ids)), before)  # B = 0: unchanged
    _randomised(model)
    merged = merge_lora(model)
    assert lora_count(merged) == 0 and lora_count(model) > 0
    unmerged_logits = np.asarray(model(ids))
    assert np.abs(unmerged_logits - before).max() > 1e-2  # the adapters do change them
    np.testing.assert_allclose(np.asarray(merged(ids)), unmerged_logits, atol=1e-5, rtol=0)
    jitted = nnx.jit(lambda m, x: m(x))
    np.testing.assert_allclose(np.asarray(jitted(merged, ids)), unmerged_logits, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jitted(model, ids)), unmerged_logits, atol=1e-5)


def test_an_adapted_projection_is_w_plus_scaled_x_a_b_in_numpy():
    """Activation-side LoRA, y = x W + (alpha / r) (x A) B, by hand in NumPy, equals the
    weight `lora_weight` hands the functional math, in each projection's layout."""
    rng = np.random.default_rng(0)
    E, H, D, Fd, r, alpha = 12, 3, 5, 20, 2, 6.0
    attn = MultiHeadAttention(E, H, key_dim=D, value_dim=D, rngs=nnx.Rngs(0))
    ffn = FeedForward(E, Fd, rngs=nnx.Rngs(1))
    for module in (attn, ffn):
        add_lora(module, r, alpha=alpha, targets=ALL)
        _randomised(module)
    s = alpha / r
    x = rng.normal(size=(2, 7, E)).astype(np.float32)
    z = rng.normal(size=(2, 7, H, D)).astype(np.float32)

    def ab(module, name):
        lora = getattr(module, f"{name}_lora")
        return np.asarray(lora.lora_a[...]), np.asarray(lora.lora_b[...])

    for name in ("wq", "wk", "wv"):
        a, b = ab(attn, name)
        w = np.asarray(getattr(attn, name)[...])
        want = np.einsum("bte,ehd->bthd", x, w) + s * (x @ a @ b).reshape(2, 7, H, D)
        got = np.einsum("bte,ehd->bthd", x, np.asarray(lora_weight(attn, name)))
        np.testing.assert_allclose(got, want, atol=1e-5)
    a, b = ab(attn, "wo")
    want = np.einsum("bthd,hde->bte", z, np.asarray(attn.wo[...])) + s * (
        z.reshape(2, 7, H * D) @ a @ b
    )
    np.testing.assert_allclose(
        np.einsum("bthd,hde->bte", z, np.asarray(lora_weight(attn, "wo"))), want, atol=1e-5
    )
    # the feed-forward module's call, against relu(x W1' + b1) W2' + b2 with W' = W + s A B
    (a1, b1), (a2, b2) = ab(ffn, "w1"), ab(ffn, "w2")
    hidden = np.maximum(x @ np.asarray(ffn.w1[...]) + s * x @ a1 @ b1 + np.asarray(ffn.b1[...]), 0)
    want = hidden @ np.asarray(ffn.w2[...]) + s * hidden @ a2 @ b2 + np.asarray(ffn.b2[...])
    np.testing.assert_allclose(np.asarray(ffn(jnp.asarray(x))), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: ffn(x))(x)), want, atol=1e-5)


def _array_sizes(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree) if np.ndim(x) > 0)


def test_base_weights_stay_and_are_not_in_the_optimizer_state(tmp_path):
    lora = dict(lora_rank=4, lora_alpha=8.0, lora_targets=ALL, optimizer="adamw")
    job = setup.set_up(small_config(), run_config(tmp_path / "run", **lora))
    model = nnx.merge(job.graphdef, job.state.params)
    assert job.trained_count == lora_count(model) > 0
    # Adam's two moments per adapter entry, nothing for the base weights
    assert _array_sizes(job.state.opt_state) == 2 * job.trained_count
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    assert sum(map(masked, jax.tree.leaves(job.state.opt_state, is_leaf=masked))) >= len(
        [t for t in jax.tree.leaves(lora_trainable(model)) if not t]
    )  # each frozen parameter is a MaskedNode in the adapters' optimizer
    step = jax.jit(job.train_fn)
    state = job.state
    for i in range(3):
        state, metrics = step(state, job.data.train_batch(i, 8))
    assert np.isfinite(float(metrics["loss"]))
    before, after = job.state.params, state.params  # job.state stays (the step was not donated)
    trainable = lora_trainable(model)
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), before, after)
    for train, moved in zip(jax.tree.leaves(trainable), jax.tree.leaves(changed), strict=True):
        assert moved if train else not moved


@pytest.mark.slow  # three short runs and a generate, 24 s
def test_a_lora_run_resumes_exactly_and_saves_no_base_moments(tmp_path, capsys):
    """The pattern of test_loop.test_resume_is_bit_exact, with adapters."""
    paper = dict(schedule="paper", lr=0.5, lora_rank=4, lora_targets=ALL)
    straight, split = tmp_path / "straight", tmp_path / "split"
    loop.train(small_config(dropout_rate=0.1), run_config(straight, **paper), progress=False)
    loop.train(small_config(dropout_rate=0.1), run_config(split, steps=10, **paper), progress=False)
    loop.train(
        small_config(dropout_rate=0.1), run_config(split, **paper), resume=True, progress=False
    )
    a, b = losses(straight), losses(split)
    assert [a[s] for s in range(11, 21)] == [b[s] for s in range(11, 21)]
    # the checkpoint on disk: Adam's moments of the adapters only
    job = setup.set_up(small_config(dropout_rate=0.1), run_config(split, **paper))
    saved = checkpoints.Checkpointer(split)
    state, _ = saved.restore(checkpoints.abstract_train_state(job.state), job.meta)
    saved.close()
    assert _array_sizes(state.opt_state) == 2 * job.trained_count
    summary = json.loads((split / "summary.json").read_text())
    assert summary["trained_params"] == job.trained_count < summary["params"]
    # generate's model: the run's config recreates the adapters, then restores them
    model, _ = checkpoints.restore_model(split)
    restored = nnx.state(model, nnx.LoRAParam)
    trained = nnx.state(nnx.merge(job.graphdef, state.params), nnx.LoRAParam)
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(trained), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(restored))
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(split), "--input", "abc"]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--lora-alpha", "8"], "--lora-alpha needs --lora-rank (LoRA)"),
        (["--lora-targets", "q"], "--lora-targets needs --lora-rank (LoRA)"),
        (["--lora-rank", "0"], "--lora-rank"),
        (["--lora-rank", "2", "--lora-targets", "q,ffn"], "names 'ffn': did you mean 'ff'?"),
        (["--lora-rank", "2", "--lora-alpha", "0"], "--lora-alpha"),
        (
            ["--lora-rank", "2", "--optimizer", "schedule_free_adamw", "--schedule", "constant"],
            "--lora-rank trains adapters alone: schedule_free_adamw's average over frozen weights",
        ),
        (["--lora-rank", "33"], "--lora-rank=33 is more than wq's min(d_in, d_out) = min(32, 32)"),
    ],
)
def test_bad_lora_flags_are_one_line_exit_2_and_no_folder(tmp_path, capsys, flags, says):
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--steps", "2", "--d-model", "32", "--num-heads", "2"]
    assert main([*args, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not out.exists()
