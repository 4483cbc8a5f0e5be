import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxformer as jf
from jaxformer.cli import main
from jaxformer.functional import cross_entropy
from jaxformer.train import make_optimizer, make_schedule, paper_schedule


def _np_smoothed_ce(logits, targets, weights, eps):
    logits = logits.astype(np.float64)
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    V = logits.shape[-1]
    q = np.full(logits.shape, eps / V)
    q[np.arange(targets.shape[0])[:, None], np.arange(targets.shape[1])[None, :], targets] += (
        1 - eps
    )
    loss = -(q * logp).sum(-1)
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    w = weights.astype(np.float64)
    return (loss * w).sum() / w.sum(), (nll * w).sum() / w.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_loss_matches_numpy(eps):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, (3, 5))
    weights = rng.random((3, 5)) < 0.7
    sums = jax.jit(lambda *a: cross_entropy(*a, label_smoothing=eps))(logits, targets, weights)
    m = sums.means()
    want_loss, want_nll = _np_smoothed_ce(logits, targets, weights, eps)
    assert float(m["loss"]) == pytest.approx(want_loss, rel=1e-5)
    assert float(m["nll"]) == pytest.approx(want_nll, rel=1e-5)  # smoothing does not leak
    assert float(m["perplexity"]) == pytest.approx(np.exp(want_nll), rel=1e-5)
    acc = ((logits.argmax(-1) == targets) * weights).sum() / weights.sum()
    assert float(m["token_accuracy"]) == pytest.approx(acc)
    assert float(sums.tokens) == weights.sum()


def _autodiff_sums(logits, targets, weights, eps):
    """The loss and nll sums as plain jnp code whose gradient autodiff writes: the
    written-out gradient of `cross_entropy` must equal it."""
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    loss = (1 - eps) * nll + eps * (log_z - jnp.mean(logits, axis=-1))
    w = weights.astype(jnp.float32)
    return jnp.sum(loss * w), jnp.sum(nll * w)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("padded", [True, False])
def test_the_written_out_gradient_equals_autodiffs(eps, padded):
    """One elementwise backward pass (no scatter) for loss and nll, in float32: values and
    gradients equal the plain formula's to 1e-6 relative."""
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.standard_normal((4, 6, 50)).astype(np.float32) * 4)
    targets = jnp.asarray(rng.integers(0, 50, (4, 6)))
    weights = jnp.asarray(rng.random((4, 6)) < 0.7) if padded else jnp.ones((4, 6), bool)

    def mine(x):
        sums = cross_entropy(x, targets, weights if padded else None, label_smoothing=eps)
        return sums.loss + 0.3 * sums.nll, (sums.loss, sums.nll)

    def plain(x):
        loss, nll = _autodiff_sums(x, targets, weights, eps)
        return loss + 0.3 * nll, (loss, nll)

    (_, got), g_got = jax.jit(jax.value_and_grad(mine, has_aux=True))(logits)
    (_, want), g_want = jax.jit(jax.value_and_grad(plain, has_aux=True))(logits)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    scale = float(jnp.max(jnp.abs(g_want)))
    np.testing.assert_allclose(g_got, g_want, rtol=1e-6, atol=1e-6 * scale)


def test_a_target_tied_with_the_maximum_counts_as_correct():
    logits = jnp.array([[[2.0, 5.0, 5.0, 1.0], [0.0, 1.0, 3.0, 3.0]]])
    sums = cross_entropy(logits, jnp.array([[2, 1]]), None)
    assert float(sums.correct) == 1.0 and float(sums.tokens) == 2.0


def test_padding_is_ignored():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 4, 7)).astype(np.float32)
    targets = np.array([[1, 2, 3, 0]])
    w = np.array([[True, True, False, False]])
    a = cross_entropy(logits, targets, w, label_smoothing=0.1).means()
    logits2 = logits.copy()
    logits2[0, 2:] = 100.0  # garbage at padded positions
    b = cross_entropy(logits2, targets, w, label_smoothing=0.1).means()
    assert float(a["loss"]) == float(b["loss"])


def test_paper_schedule_formula():
    sched = paper_schedule(512, warmup_steps=4000)
    for step in [1, 100, 3999, 4000, 4001, 10000, 100000]:
        want = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert float(sched(step - 1)) == pytest.approx(want, rel=1e-6)
    # The peak is at the end of warm-up.
    assert float(sched(3999)) > float(sched(3000)) and float(sched(3999)) > float(sched(8000))


def test_cosine_and_constant_schedules():
    cos = make_schedule("cosine", lr=1e-3, warmup_steps=10, total_steps=100)
    assert float(cos(9)) == pytest.approx(1e-3, rel=1e-5)
    assert float(cos(99)) == pytest.approx(0.0, abs=1e-9)
    assert float(make_schedule("constant", lr=3e-4)(1234)) == pytest.approx(3e-4)
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_schedule("linear", lr=1.0)
    with pytest.raises(ValueError, match="needs a learning rate"):
        make_schedule("constant")


def test_optimizers():
    sched = optax.constant_schedule(0.1)
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.array([30.0, 40.0, 0.0])}  # global norm 50
    opt = make_optimizer(sched, clip_norm=1.0)
    state = opt.init(params)
    updates, _ = opt.update(grads, state, params)
    # Adam's first step is lr * sign(g) (up to eps), whatever the clipping scale.
    np.testing.assert_allclose(updates["w"], [-0.1, -0.1, 0.0], atol=1e-6)
    adamw = make_optimizer(sched, name="adamw", weight_decay=0.1)
    u, _ = adamw.update({"w": jnp.zeros(3)}, adamw.init(params), params)
    np.testing.assert_allclose(u["w"], -0.1 * 0.1 * np.ones(3), rtol=1e-5)
    with pytest.raises(ValueError, match="weight_decay needs the 'adamw'"):
        make_optimizer(sched, weight_decay=0.1)


@pytest.mark.slow  # a whole run with its evaluation: 15 s of CI's quick suite
def test_a_one_step_run_fits_the_default_warmup(tmp_path, capsys):
    """`jaxformer train --steps 1` (a smoke run) trains: the default warm-up is a tenth
    of the run and fewer steps than it; a warm-up the user sets is kept, so one that does
    not fit stays an error."""
    assert [jf.RunConfig.from_options(steps=n).optim.warmup for n in (1, 2, 10, 100)] == [
        0,
        1,
        1,
        10,
    ]
    assert jf.RunConfig.from_options(steps=1, schedule="paper").optim.warmup == 4000
    small = dict(num_encoder_layers=1, num_decoder_layers=1, d_model=16, num_heads=2, d_ff=32)
    (tmp_path / "small.json").write_text(json.dumps(small))
    config = ["--config", str(tmp_path / "small.json"), "--no-progress"]
    argv = ["train", "--task", "copy", "--steps", "1", "--batch-size", "2", *config]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1
    assert main([*argv, "--out", str(tmp_path / "run2"), "--warmup-steps", "1"]) == 2
    assert "needs --steps > --warmup-steps, got 1 and 1" in capsys.readouterr().err
