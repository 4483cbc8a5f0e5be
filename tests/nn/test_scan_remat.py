"""`scan_layers` (stacked parameters, one scan per stack) and `remat` change how the
layer stacks are compiled, never the numbers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import jaxformer as jf
from jaxformer import checkpoints, data, parallel, train

TOK = data.ByteTokenizer()
SEQ2SEQ = [data.TaskData("copy", TOK, seed=0, dev_size=10).train_batch(i, 8) for i in range(2)]


def config(**overrides):
    fields = dict(
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_model=32,
        num_heads=2,
        d_ff=64,
        max_len=64,
        dropout_rate=0.1,
    )
    return jf.TransformerConfig.tiny(TOK.vocab_size, **(fields | overrides))


@functools.cache
def plain_losses() -> list[float]:
    return train_losses(config())[0]


def train_losses(cfg, kind=jf.Transformer, batches=SEQ2SEQ):
    schedule = optax.constant_schedule(3e-3)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(kind(cfg, rngs=nnx.Rngs(0)), optimizer, seed=0)
    step = jax.jit(train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1))
    losses = []
    for batch in batches:
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    return losses, state


def test_scan_layers_stacks_the_same_parameters():
    plain = jf.Transformer(config(), rngs=nnx.Rngs(0))
    scanned = jf.Transformer(config(scan_layers=True), rngs=nnx.Rngs(0))
    assert jf.count_params(plain) == jf.count_params(scanned)
    wq = scanned.decoder.layers.self_attn.wq
    assert wq.shape == (2, 32, 2, 16)
    assert wq.get_metadata()["out_sharding"] == ("layers", "embed", "heads", "kv")
    for i in range(2):
        np.testing.assert_array_equal(wq[...][i], plain.decoder.layers[i].self_attn.wq[...])
    src, tgt = jnp.asarray(SEQ2SEQ[0]["src"]), jnp.asarray(SEQ2SEQ[0]["tgt_in"])
    run = nnx.jit(lambda m, s, t: (m(s, t), m.cross_attention_weights(s, t)))
    logits, weights = run(scanned, src, tgt)
    expected, expected_w = run(plain, src, tgt)
    assert weights.shape == expected_w.shape == (2, 8, 2, tgt.shape[1], src.shape[1])
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(weights, expected_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [  # full remat with scan: the language model's test below, in make test
        pytest.param(dict(remat="full"), marks=pytest.mark.slow),
        dict(remat="dots", scan_layers=True),
    ],
    ids=["remat-full", "remat-dots+scan"],
)
def test_training_gives_the_plain_models_losses(overrides):
    """Two steps with dropout: the same losses (scan keeps each layer's dropout key)."""
    losses, _ = train_losses(config(**overrides))
    np.testing.assert_allclose(losses, plain_losses(), rtol=1e-6)


def test_decoder_lm_with_scan_and_remat(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"document {i} says hello to the world" for i in range(40)))
    text = data.TextData(path, TOK, seq_len=32)
    batches = [text.train_batch(i, 4) for i in range(2)]
    cfg = config(num_encoder_layers=0)
    expected, _ = train_losses(cfg, jf.DecoderLM, batches)
    losses, _ = train_losses(cfg.replace(scan_layers=True, remat="full"), jf.DecoderLM, batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_remat_keeps_less_for_the_backward_pass():
    """XLA's memory plan for the compiled step: full < dots < none (temporaries)."""
    temps = {}
    for remat in ("none", "dots", "full"):
        cfg = config(scan_layers=True, remat=remat, dropout_rate=0.0)
        schedule = optax.constant_schedule(3e-3)
        optimizer = train.make_optimizer(schedule)
        graphdef, state = train.create_train_state(
            jf.Transformer(cfg, rngs=nnx.Rngs(0)), optimizer, seed=0
        )
        step = jax.jit(train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1))
        analysis = step.lower(state, SEQ2SEQ[0]).compile().memory_analysis()
        temps[remat] = analysis.temp_size_in_bytes
    assert temps["full"] < temps["dots"] < temps["none"], temps


@pytest.mark.devices(8)
@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_scanned_model_on_a_mesh_and_in_a_checkpoint(tmp_path):
    """scan_layers on a 2x2x2 mesh trains like the plain model on one device."""
    cfg = config(scan_layers=True)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    schedule = optax.constant_schedule(3e-3)
    optimizer = train.make_optimizer(schedule)
    graphdef, state = train.create_train_state(
        jf.Transformer(cfg, rngs=nnx.Rngs(0)), optimizer, seed=0
    )
    placement = parallel.make_placement(mesh)
    layout = train.state_layout(graphdef, state)
    state = placement.put(state, like=layout)
    wq = state.params["decoder"]["layers"]["self_attn"]["wq"]
    assert wq.sharding.spec == P(None, "fsdp", "tensor", None)  # the layer axis stays whole
    step = placement.compile(
        train.make_train_step(graphdef, optimizer, schedule, label_smoothing=0.1),
        layout,
        donate_state=True,
    )
    losses = []
    for batch in SEQ2SEQ:
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(losses, plain_losses(), rtol=1e-5)
    meta = {"model_kind": "Transformer", "model_config": cfg.to_dict(), "run": {}}
    ckpt = checkpoints.Checkpointer(tmp_path)
    ckpt.save(state, meta)
    ckpt.close()
    TOK.save(tmp_path)
    model, _ = checkpoints.restore_model(tmp_path)
    saved = state.params["decoder"]["layers"]["self_attn"]["wq"]
    np.testing.assert_array_equal(model.decoder.layers.self_attn.wq[...], jax.device_get(saved))


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="remat must be one of \\('none', 'full', 'dots'\\)"):
        config(remat="everything")
    with pytest.raises(TypeError, match="scan_layers must be a bool"):
        config(scan_layers="yes")


def test_decoding_and_conversion_of_a_scanned_model():
    """Cached decoding runs stacked layers one by one and matches the plain model;
    to_torch asks for unstacked layers."""
    from jaxformer import decode

    plain = jf.Transformer(config(dropout_rate=0.0), rngs=nnx.Rngs(0))
    scanned = jf.Transformer(config(dropout_rate=0.0, scan_layers=True), rngs=nnx.Rngs(0))
    src, valid = jnp.asarray(SEQ2SEQ[0]["src"]), jnp.asarray(SEQ2SEQ[0]["src_valid"])
    expected = decode.greedy(plain, src, valid, max_new_tokens=6)
    np.testing.assert_array_equal(decode.greedy(scanned, src, valid, max_new_tokens=6), expected)
    torch_interop = pytest.importorskip("jaxformer.interop.torch")
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="scan_layers=False"):
        torch_interop.to_torch(scanned.decoder)
