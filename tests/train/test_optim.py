"""The optimizers beside Adam: Muon (optax.contrib.muon: its Newton-Schulz orthogonalisation
against NumPy's polar factor, which parameters it takes, its learning-rate scales),
schedule-free AdamW (evaluated and exported at its average), the registry that holds them
(a user's own from --variants and a sweep spec) and their bad input; a run stopped and
resumed equals one run, parameters and optimizer state bit for bit."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import train
from jaxformer.cli import main
from jaxformer.functional.registry import import_variants
from jaxformer.train import loop, run_folder
from jaxformer.train.optim import OPTIMIZERS, muon_dimensions

ROOT = pathlib.Path(__file__).resolve().parents[2]
LION = ROOT / "experiments" / "variants" / "lion.py"
NS = (3.4445, -4.7750, 2.0315)  # the quintic's coefficients (modded-nanogpt's, optax's)
BAND = (0.68, 1.21)  # where 5 steps of it take every x0 = s / |G|_F >= 0.002 (see below)


def _quintic(x, steps=5):
    for _ in range(steps):
        x = NS[0] * x + NS[1] * x**3 + NS[2] * x**5
    return x


def _polar(g):
    """U V^T of g = U S V^T (NumPy's SVD, float64)."""
    u, _, vt = np.linalg.svd(np.asarray(g, np.float64), full_matrices=False)
    return u @ vt


def _first_muon_update(params, **options):
    """Muon's first update of `params` at lr 1 (gradient = params), divided by its width
    scale sqrt(max(1, fan_out / fan_in)): the orthogonalised gradient. Jitted."""
    opt = train.make_optimizer(optax.constant_schedule(1.0), name="muon", muon_lr_scale=1.0)
    updates, _ = jax.jit(opt.update)(params, opt.init(params), params)
    return updates


def test_the_quintic_band_is_what_the_tests_assert():
    """The scalar map that 5 steps make of a singular value s / |G|_F (hand-computable):
    it is not the sign function but lands every x0 in [0.002, 1] in BAND."""
    x = np.logspace(np.log10(0.002), 0, 20001)
    y = _quintic(x)
    assert BAND[0] <= y.min() < 0.69 and 1.20 < y.max() <= BAND[1]
    assert _quintic(1e-4) < 0.05  # a direction far smaller than the norm is not reached


@pytest.mark.parametrize("shape", [(32, 128), (96, 24), (48, 48)])
def test_newton_schulz_keeps_the_polar_factors_vectors_and_bands_the_values(shape):
    """G = U diag(s) V^T with s / |G|_F spread over [0.002, 1]: Muon's update has G's singular
    vectors (U^T update V is diagonal) and singular values in BAND; on Gaussian G the
    update is within the band's distance of NumPy's polar factor U V^T."""
    rng = np.random.default_rng(sum(shape))
    m, n = shape
    k = min(m, n)
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    x0 = np.geomspace(0.01, 1.0, k) * rng.uniform(0.9, 1.0, k)
    x0 /= np.linalg.norm(x0)  # the singular values over |G|_F
    assert x0.min() >= 0.002
    g = (u * (7.0 * x0)) @ v.T
    update = np.asarray(
        _first_muon_update({"layers": {"w1": jnp.asarray(g, jnp.float32)}})["layers"]["w1"]
    )
    orth = -update / np.sqrt(max(1.0, n / m))
    inner = u.T @ orth @ v  # [k, k]: diagonal when the vectors are G's
    off = inner - np.diag(np.diag(inner))
    assert np.abs(off).max() < 1e-4
    d = np.diag(inner)
    assert BAND[0] <= d.min() and d.max() <= BAND[1], (d.min(), d.max())
    np.testing.assert_allclose(d, _quintic(x0), atol=1e-4)
    gauss = rng.standard_normal(shape)
    update = _first_muon_update({"layers": {"w1": jnp.asarray(gauss, jnp.float32)}})
    orth = -np.asarray(update["layers"]["w1"]) / np.sqrt(max(1.0, n / m))
    values = np.linalg.svd(orth, compute_uv=False)
    if m != n:  # a square Gaussian's smallest values are below 0.002 |G|_F: not banded
        assert BAND[0] <= values.min() and values.max() <= BAND[1]
    np.testing.assert_allclose(_polar(orth), _polar(gauss), atol=2e-3 if m != n else 5e-2)


def test_newton_schulz_of_a_diagonal_matrix_is_the_quintic_of_each_entry():
    """Hand-worked: diag(3, 4) has |G|_F = 5, so its update is diag(q(0.6), q(0.8)) with q
    the quintic's 5 steps; a 3-D query projection [E, H, D] is one [E, H * D] matrix."""
    g = jnp.array([[3.0, 0.0], [0.0, 4.0]])
    update = _first_muon_update({"layers": {"w2": g}})["layers"]["w2"]
    np.testing.assert_allclose(-update, np.diag(_quintic(np.array([0.6, 0.8]))), rtol=1e-5)
    rng = np.random.default_rng(1)
    wq = rng.standard_normal((16, 2, 24)).astype(np.float32)  # E=16, H=2, D=24
    wo = rng.standard_normal((2, 24, 16)).astype(np.float32)
    update = _first_muon_update({"layers": {"wq": jnp.asarray(wq), "wo": jnp.asarray(wo)}})
    joint = -np.asarray(update["layers"]["wq"]).reshape(16, 48) / np.sqrt(3.0)  # fan 48 / 16
    np.testing.assert_allclose(_polar(joint), _polar(wq.reshape(16, 48)), atol=2e-3)
    joint = -np.asarray(update["layers"]["wo"]).reshape(48, 16)
    np.testing.assert_allclose(_polar(joint), _polar(wo.reshape(48, 16)), atol=2e-3)


# Written out: the parameters Muon takes (the layer stacks' matrices); AdamW takes the rest.
MUON_NAMES = {"wq", "wk", "wv", "wo", "w1", "w2", "w_gate"}


def _paths(tree, keep):
    return {
        jax.tree_util.keystr(path)
        for path, x in jax.tree_util.tree_leaves_with_path(tree, is_leaf=keep)
        if not isinstance(x, optax.MaskedNode)
    }


@pytest.mark.parametrize(
    "kind,fields",
    [
        ("DecoderLM", dict(num_encoder_layers=0, activation="swiglu", attention_bias=True)),
        ("Transformer", dict(share_embeddings=False, logits_bias=True)),
        ("DecoderLM", dict(num_encoder_layers=0, scan_layers=True, position_embedding="learned")),
    ],
    ids=["lm-gated-biases", "transformer-untied", "lm-scanned"],
)
def test_muon_takes_the_layers_matrices_and_adamw_the_rest(kind, fields):
    config = jf.TransformerConfig.tiny(
        50, num_decoder_layers=2, d_model=16, num_heads=2, d_ff=32, **fields
    )
    model = getattr(jf, kind)(config, rngs=nnx.Rngs(0))
    opt = train.make_optimizer(optax.constant_schedule(1e-3), name="muon")
    _, state = train.create_train_state(model, opt, seed=0)
    params = _paths(state.params, None)
    expected = {p for p in params if "['layers']" in p and p.rsplit("'", 2)[-2] in MUON_NAMES}
    assert len(expected) >= 6 and len(params - expected) >= 5
    inner = state.opt_state.inner_states
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
    muon_mu = inner["muon"].inner_state[0].mu
    adam_mu = inner["adam"].inner_state[0].mu
    assert _paths(muon_mu, masked) == expected
    assert _paths(adam_mu, masked) == params - expected
    assert not any(
        "['table']" in p or "scale" in p or "bias" in p or "['bq']" in p for p in expected
    )


def test_each_groups_learning_rate_is_the_schedule_times_its_scale():
    """Muon's update scales with muon_lr_scale; AdamW's group is optax's AdamW with
    Nesterov momentum (optax.contrib.muon ties the two) at the schedule x adam_lr_scale."""
    rng = np.random.default_rng(0)
    params = {
        "layers": {"w1": jnp.asarray(rng.standard_normal((8, 12)), jnp.float32)},
        "embed": {"table": jnp.asarray(rng.standard_normal((10, 8)), jnp.float32)},
    }
    grads = jax.tree.map(lambda x: x * 0.5 + 0.1, params)
    schedule = lambda count: 1e-2 * (count + 1.0)  # noqa: E731
    kw = dict(name="muon", weight_decay=0.1, b2=0.95)

    def first(**scales):
        opt = train.make_optimizer(schedule, **kw, **scales)
        updates, state = opt.update(grads, opt.init(params), params)
        return opt.update(grads, state, params)[0]  # the second step: count 1

    base, scaled = first(), first(muon_lr_scale=20.0, adam_lr_scale=3.0)
    np.testing.assert_allclose(scaled["layers"]["w1"], 2 * base["layers"]["w1"], rtol=1e-5)
    adamw = optax.adamw(
        lambda c: 3.0 * schedule(c), b1=0.9, b2=0.95, eps=1e-9, weight_decay=0.1, nesterov=True
    )
    table = params["embed"]["table"]
    state = adamw.init(table)
    _, state = adamw.update(grads["embed"]["table"], state, table)
    want, _ = adamw.update(grads["embed"]["table"], state, table)
    np.testing.assert_allclose(scaled["embed"]["table"], want, rtol=1e-6)


def test_warmup_constant_schedule_by_hand():
    schedule = train.make_schedule("warmup_constant", lr=2.0, warmup_steps=4)
    got = [float(schedule(c)) for c in range(7)]
    assert got == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0])
    assert float(train.make_schedule("warmup_constant", lr=2.0, warmup_steps=0)(0)) == 2.0


class EvalParamsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_eval_params_is_schedule_frees_average_and_the_params_otherwise(self):
        config = jf.TransformerConfig.tiny(
            30, num_decoder_layers=1, d_model=8, num_heads=2, d_ff=16
        )
        batch = {"tgt_in": jnp.ones((2, 5), jnp.int32), "tgt_out": jnp.full((2, 5), 2)}
        for name in ("adamw", "muon", "schedule_free_adamw"):
            schedule = optax.constant_schedule(1e-2)
            opt = train.make_optimizer(schedule, name=name, clip_norm=1.0)
            graphdef, state = train.create_train_state(
                jf.DecoderLM(config, rngs=nnx.Rngs(0)), opt, seed=0
            )
            step = jax.jit(train.make_train_step(graphdef, opt, schedule, label_smoothing=0.0))
            for _ in range(3):
                state, _ = step(state, batch)
            got = self.variant(train.eval_params)(state)
            if name != "schedule_free_adamw":
                chex.assert_trees_all_equal(got, state.params)
                continue
            free = state.opt_state[1]  # after clipping's
            b1 = float(free.b1)
            want = jax.tree.map(
                lambda y, z, b1=b1: (np.asarray(y, np.float64) - (1 - b1) * np.asarray(z)) / b1,
                state.params,
                free.z,
            )
            chex.assert_trees_all_close(got, want, atol=1e-6)
            differ = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), state.params, want)
            assert max(jax.tree.leaves(differ)) > 1e-4  # the average is not the trained y


SMALL = dict(num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64)


def _run(out, **overrides):
    fields = dict(task="copy", steps=8, batch_size=8, eval_every=1000, log_every=1)
    fields |= dict(checkpoint_every=4, eval_examples=16, out=str(out))
    return jf.RunConfig.from_options(**(fields | overrides))


def _final_state(config, run, **kw):
    """Train; returns the summary and the last step's state (on the host)."""
    kept = {}
    hook = loop.Hook(10**6, lambda c: kept.update(state=jax.device_get(c.state)), "keep", True)
    summary = loop.train(config, run, progress=False, hooks=[hook], **kw)
    return summary, kept["state"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "optimizer,schedule",
    [("muon", "constant"), ("schedule_free_adamw", "warmup_constant")],
)
def test_a_stopped_and_resumed_run_equals_one_run_bit_for_bit(tmp_path, optimizer, schedule):
    """8 steps, and 4 steps resumed to 8: the same parameters and optimizer state, to the
    bit (dropout on: the keys resume too)."""
    config = jf.TransformerConfig.tiny(259, **SMALL)
    opts = dict(optimizer=optimizer, schedule=schedule, lr=3e-3, weight_decay=0.01)
    _, straight = _final_state(config, _run(tmp_path / "straight", **opts))
    _final_state(config, _run(tmp_path / "split", **opts, steps=4))
    summary, resumed = _final_state(config, _run(tmp_path / "split", **opts), resume=True)
    assert summary["steps_run"] == 4 and int(resumed.step) == 8
    chex.assert_trees_all_equal(resumed.params, straight.params)
    chex.assert_trees_all_equal(resumed.opt_state, straight.opt_state)


@pytest.mark.slow
def test_schedule_free_evaluates_saves_and_restores_its_average(tmp_path):
    """The final evaluation's loss is that of the average x, not of the trained y (which
    differ); restore_model (and so generate) reads x from <out>/averaged."""
    config = jf.TransformerConfig.tiny(259, **SMALL, dropout_rate=0.0)
    run = _run(
        tmp_path / "run", optimizer="schedule_free_adamw", schedule="warmup_constant", lr=1e-2
    )
    summary, state = _final_state(config, run)
    x = train.eval_params(state)
    setup = train.set_up(config, run)
    losses = {}
    for name, params in (("x", x), ("y", state.params)):
        sums = [setup.eval_step(params, b) for b in setup.data.eval_batches(run.optim.batch_size)]
        losses[name] = float(sum(s.loss for s in sums) / sum(s.tokens for s in sums))
    assert abs(losses["x"] - losses["y"]) > 1e-3
    assert summary["eval_loss"] == pytest.approx(losses["x"], rel=1e-5)
    model, _ = run_folder.restore_model(tmp_path / "run")
    chex.assert_trees_all_close(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(x))


@pytest.fixture
def lion():
    """experiments/variants/lion.py registered, as --variants does; forgotten after."""
    import_variants([str(LION)])
    yield "lion"
    OPTIMIZERS._variants.pop("lion")


def test_a_users_optimizer_is_one_file_for_the_command(tmp_path, lion):
    """A sweep takes the same file: tests/lab/sweep/test_sweep.py."""
    run = jf.RunConfig.from_options(task="copy", optimizer=lion, out=str(tmp_path))
    assert run.optim.optimizer == "lion"
    opt = train.make_optimizer(optax.constant_schedule(1e-3), name=lion)
    params = {"w": jnp.ones((3,))}
    updates, _ = opt.update({"w": jnp.array([1.0, -2.0, 0.0])}, opt.init(params), params)
    np.testing.assert_allclose(updates["w"], [-1e-3, 1e-3, 0.0])  # lr * sign


def test_bad_optimizer_input_is_one_clear_line(tmp_path, capsys):
    run = lambda **o: jf.RunConfig.from_options(task="copy", out=str(tmp_path), **o)  # noqa: E731
    with pytest.raises(
        ValueError, match=r"optimizer must be one of .*got 'mouns': did you mean 'muon'\?"
    ):
        run(optimizer="mouns")
    with pytest.raises(ValueError, match=r"got 'sgd' .*OPTIMIZERS.register\('sgd', fn\)"):
        run(optimizer="sgd")
    with pytest.raises(ValueError, match=r"muon_lr_scale is not an option of adamw \(muon's\)"):
        run(optimizer="adamw", muon_lr_scale=5.0)
    with pytest.raises(ValueError, match="adam_lr_scale must be > 0, got -1.0"):
        run(optimizer="muon", adam_lr_scale=-1.0)
    with pytest.raises(ValueError, match="give schedule='warmup_constant' .*got cosine"):
        run(optimizer="schedule_free_adamw")
    with pytest.raises(ValueError, match="schedule_free_adamw evaluates its own average"):
        run(optimizer="schedule_free_adamw", schedule="constant", average_checkpoints=2, steps=1000)
    with pytest.raises(ValueError, match=r"ns_steps is not an option of adam \(muon's\)"):
        train.make_optimizer(optax.constant_schedule(1.0), ns_steps=3)
    with pytest.raises(ValueError, match="weight_decay needs the 'adamw' optimizer"):
        train.make_optimizer(optax.constant_schedule(1.0), weight_decay=0.1)
    assert main(["train", "--optimizer", "mouns", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("got 'mouns': did you mean 'muon'?")
    assert err.startswith("jaxformer train: error: --optimizer must be one of (")


def test_muon_dimensions_read_stacked_layers_as_a_batch_axis():
    """scan_layers stacks a layer axis in front: Muon orthogonalises each layer apart."""
    params = {"decoder": {"layers": {"ffn": {"w1": jnp.zeros((3, 4, 8))}}}}
    dims = muon_dimensions(params)["decoder"]["layers"]["ffn"]["w1"]
    assert dims.reduction_axis == -2 and dims.output_axis == -1
    rng = np.random.default_rng(2)
    g = rng.standard_normal((3, 4, 8)).astype(np.float32)
    opt = train.make_optimizer(optax.constant_schedule(1.0), name="muon", muon_lr_scale=1.0)
    stacked = {"decoder": {"layers": {"ffn": {"w1": jnp.asarray(g)}}}}
    update = opt.update(stacked, opt.init(stacked), stacked)[0]["decoder"]["layers"]["ffn"]["w1"]
    for i in range(3):
        orth = -np.asarray(update[i]) / np.sqrt(2.0)
        np.testing.assert_allclose(_polar(orth), _polar(g[i]), atol=2e-3)
