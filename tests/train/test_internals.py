"""Training dynamics (--log-internals): the internals step's numbers against the same
quantities computed by hand, the plain step's program unchanged, and the CLI's records
and plot."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import capture, data, train
from jaxformer.cli import main
from jaxformer.train import setup as train_setup

TOK = data.ByteTokenizer()
SMALL = dict(
    num_encoder_layers=1,
    num_decoder_layers=2,
    d_model=32,
    num_heads=2,
    d_ff=64,
    max_len=64,
    dropout_rate=0.0,
)
SCHEDULE = optax.constant_schedule(1e-2)


def setup(**overrides):
    model = jf.Transformer(
        jf.TransformerConfig.tiny(TOK.vocab_size, **SMALL | overrides), rngs=nnx.Rngs(0)
    )
    optimizer = train.make_optimizer(SCHEDULE)
    graphdef, state = train.create_train_state(model, optimizer, 0)
    batch = data.TaskData("reverse", TOK, seed=0, dev_size=4).train_batch(0, 4)
    assert not batch["src_valid"].all() and not batch["tgt_valid"].all()  # padding counts
    return model, optimizer, graphdef, state, batch


def internals_of(graphdef, optimizer, state, batch):
    step = train.make_train_step(graphdef, optimizer, SCHEDULE, label_smoothing=0.1, internals=True)
    new_state, metrics = jax.jit(step)(state, batch)
    return new_state, {k: float(v) for k, v in metrics["internals"].items()}


def module_norm(tree, prefix):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    squares = [
        jnp.sum(jnp.square(x))
        for path, x in leaves
        if jax.tree_util.keystr(path, simple=True, separator="/").startswith(prefix)
    ]
    assert squares, prefix
    return float(jnp.sqrt(sum(squares)))


def test_values_match_norms_and_entropies_computed_by_hand():
    model, optimizer, graphdef, state, batch = setup()
    new_state, got = internals_of(graphdef, optimizer, state, batch)

    def loss(params):
        sums = train.steps._loss_sums(graphdef, params, batch, None, 0.1)
        return sums.loss / sums.tokens

    grads = jax.jit(jax.grad(loss))(state.params)
    update = jax.tree.map(jnp.subtract, new_state.params, state.params)
    modules = {
        "decoder/1/ffn": "decoder/layers/1/ffn/",
        "encoder/0/self_attention": "encoder/layers/0/self_attn/",
        "decoder/0/cross_attention": "decoder/layers/0/cross_attn/",
        "decoder/0/norm2": "decoder/layers/0/norm2/",
        "src_inputs/embed": "src_inputs/embed/",
    }
    for name, prefix in modules.items():
        np.testing.assert_allclose(got[f"grad_norm/{name}"], module_norm(grads, prefix), rtol=1e-4)
        np.testing.assert_allclose(
            got[f"update_norm/{name}"], module_norm(update, prefix), rtol=1e-4
        )
        np.testing.assert_allclose(
            got[f"param_norm/{name}"], module_norm(new_state.params, prefix), rtol=1e-5
        )
    np.testing.assert_allclose(got["grad_norm"], float(optax.tree.norm(grads)), rtol=1e-4)
    grad_modules = {k for k in got if k.startswith("grad_norm/")}
    assert len(grad_modules) == 1 * 4 + 2 * 6 + 1  # sub-layers and norms per layer, the embedding

    sites = ["decoder/*/*_attention/weights", "encoder/*/self_attention/weights", "*/*/out"]
    args = (batch["src"], batch["tgt_in"], batch["src_valid"], batch["tgt_valid"])
    _, values = capture.run(model, *args, capture=sites, deterministic=True)
    for attention in (
        "encoder/0/self_attention",
        "decoder/1/self_attention",
        "decoder/0/cross_attention",
    ):
        p = np.asarray(values[f"{attention}/weights"], np.float64)  # [B, H, T, S]
        entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
        valid = np.asarray(batch["src_valid" if attention.startswith("enc") else "tgt_valid"])
        expected = entropy.transpose(1, 0, 2)[:, valid].mean(-1)  # per head, over real queries
        for h in range(2):
            np.testing.assert_allclose(
                got[f"attention_entropy/{attention}/head{h}"], expected[h], rtol=1e-4
            )
    for layer, valid in (("encoder/0", batch["src_valid"]), ("decoder/1", batch["tgt_valid"])):
        x = np.asarray(values[f"{layer}/out"])[np.asarray(valid)]
        np.testing.assert_allclose(
            got[f"activation_rms/{layer}"], np.sqrt(np.mean(x**2)), rtol=1e-4
        )


@pytest.mark.slow  # 20 s of the quick suite; the unstacked model's values are checked there
def test_stacked_layers_give_the_same_norms_per_layer_and_no_sites():
    _, optimizer, graphdef, state, batch = setup()
    _, plain = internals_of(graphdef, optimizer, state, batch)
    _, optimizer, graphdef, state, _ = setup(scan_layers=True)
    _, scanned = internals_of(graphdef, optimizer, state, batch)
    norms = {k: v for k, v in plain.items() if "norm" in k.split("/")[0]}
    assert scanned.keys() == norms.keys()  # no entropy or RMS without per-layer sites
    np.testing.assert_allclose([scanned[k] for k in norms], list(norms.values()), rtol=1e-4)


def test_without_internals_the_step_program_is_unchanged(tmp_path):
    def lowered(log_internals, internals=False):
        run = jf.RunConfig.from_options(
            task="reverse",
            steps=4,
            batch_size=4,
            log_internals=log_internals,
            eval_examples=4,
            out=str(tmp_path),
        )
        model = jf.Transformer(jf.TransformerConfig.tiny(TOK.vocab_size, **SMALL), rngs=nnx.Rngs(0))
        _, state, train_fn, _, internals_fn = train_setup._steps(model, model.config, run)
        batch = data.TaskData("reverse", TOK, seed=0, dev_size=4).train_batch(0, 4)
        fn = internals_fn if internals else train_fn
        return jax.jit(fn).lower(state, batch).as_text()

    assert lowered(None) == lowered(3)  # the steady-state step of a run with --log-internals
    assert lowered(3, internals=True) != lowered(None)


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_cli_writes_internals_records_and_a_plot(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        *"train --task reverse --steps 4 --log-internals 2 --batch-size 4".split(),
        *"--eval-examples 4 --eval-every 100".split(),
        "--out",
        str(out),
        *"--num-encoder-layers 1 --num-decoder-layers 1 --d-model 32".split(),
        *"--d-ff 64 --num-heads 2".split(),
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    internals = [r for r in records if "internals/grad_norm" in r]
    assert [r["step"] for r in internals] == [1, 2, 4]
    assert {
        "internals/grad_norm/decoder/0/ffn",
        "internals/activation_rms/encoder/0",
        "internals/attention_entropy/decoder/0/cross_attention/head1",
    } <= internals[0].keys()
    assert all(isinstance(v, float) for r in internals for k, v in r.items() if k != "step")
    assert (out / "internals.png").stat().st_size > 10_000
    assert "internals.png" in capsys.readouterr().out
