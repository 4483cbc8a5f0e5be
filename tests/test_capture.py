"""Capture and interventions at the named sites (functional/sites.py, jaxformer.capture)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import capture
from jaxformer import functional as F

V = 23


@pytest.fixture(scope="module")
def model():
    config = jf.TransformerConfig.tiny(
        V, num_encoder_layers=2, num_decoder_layers=2, d_model=32, d_ff=64
    )
    return jf.Transformer(config, rngs=nnx.Rngs(0))


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(3, V, (2, 7)), rng.integers(3, V, (2, 5))
    src_valid = np.arange(7) < np.array([[7], [4]])
    return jnp.asarray(src), jnp.asarray(tgt), jnp.asarray(src_valid)


def test_capturing_nothing_changes_nothing(model):
    src, tgt, valid = inputs()
    graphdef, state = nnx.split(model)
    plain = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))  # no sites involved
    logits, values = capture.run(model, src, tgt, valid)
    assert values == {}
    np.testing.assert_array_equal(logits, plain(state, src, tgt, valid))
    flagged, _ = capture.run(model, src, tgt, src_valid=valid, deterministic=True)
    np.testing.assert_array_equal(flagged, logits)

    def lowered():  # the forward pass's program
        return plain.lower(state, src, tgt, valid).as_text()

    with F.sites.recording():  # traced inside a recording that captures nothing
        inside = (
            jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))
            .lower(state, src, tgt, valid)
            .as_text()
        )
    assert inside == lowered()


def test_captured_cross_attention_weights_equal_the_models_own(model):
    src, tgt, valid = inputs()
    _, values = capture.run(model, src, tgt, valid, capture=["decoder/*/cross_attention/weights"])
    assert sorted(values) == [
        "decoder/0/cross_attention/weights",
        "decoder/1/cross_attention/weights",
    ]
    expected = model.cross_attention_weights(src, tgt, valid)
    for layer in range(2):
        np.testing.assert_allclose(
            values[f"decoder/{layer}/cross_attention/weights"], expected[layer], atol=1e-6
        )


def test_captured_self_attention_weights_equal_the_function_on_the_same_inputs(model):
    src, tgt, valid = inputs()
    _, values = capture.run(model, src, tgt, valid, capture=["encoder/1/self_attention/*"])
    layer = model.encoder.layers[1]
    h = values["encoder/1/self_attention/in"]  # post-LN: the sub-layer reads its input as is
    x = F.multi_head_attention(
        h, h, layer.self_attn.params(), F.padding_mask(None, valid), return_weights=True
    )
    np.testing.assert_allclose(values["encoder/1/self_attention/weights"], x.weights, atol=1e-6)
    np.testing.assert_allclose(values["encoder/1/self_attention/out"], x.out, atol=1e-5)


def test_ablating_every_head_zeroes_the_sublayer_and_self_patching_is_neutral(model):
    src, tgt, valid = inputs()
    site = "decoder/1/self_attention"
    every_head = capture.ablate_heads(range(model.config.num_heads))
    ablated, values = capture.run(
        model, src, tgt, valid, capture=[f"{site}/out"], interventions={f"{site}/heads": every_head}
    )
    assert not model.config.attention_bias  # so no head means an output of zeros
    np.testing.assert_array_equal(values[f"{site}/out"], 0.0)
    zeroed, _ = capture.run(model, src, tgt, valid, interventions={f"{site}/out": jnp.zeros_like})
    np.testing.assert_allclose(ablated, zeroed, atol=1e-6)
    logits, mid = capture.run(model, src, tgt, valid, capture=["encoder/0/out"])
    patch = capture.patch(mid["encoder/0/out"])
    patched, _ = capture.run(model, src, tgt, valid, interventions={"encoder/0/out": patch})
    # The same values; the patched program sees them as constants, so XLA may fuse the
    # rest differently: equal to float32 rounding.
    np.testing.assert_allclose(patched, logits, atol=1e-5)
    assert np.abs(np.asarray(zeroed) - np.asarray(logits)).max() > 1e-3


def test_patching_from_another_input_moves_the_output_towards_it(model):
    src, tgt, valid = inputs(0)
    src2, _, _ = inputs(1)
    clean, values = capture.run(model, src2, tgt, valid, capture=["encoder/1/out"])
    patched, _ = capture.run(
        model,
        src,
        tgt,
        valid,
        interventions={"encoder/1/out": capture.patch(values["encoder/1/out"])},
    )
    np.testing.assert_allclose(
        patched, clean, atol=1e-5
    )  # the decoder reads only the encoder's output


def test_unknown_sites_and_heads_are_named(model):
    src, tgt, valid = inputs()
    with pytest.raises(
        ValueError,
        match="no site 'decoder/7/ffn/hidden' in this forward pass; the sites are \\['encoder/0/self_attention/in'",
    ):
        capture.run(model, src, tgt, valid, capture=["decoder/7/ffn/hidden"])
    with pytest.raises(ValueError, match="no site 'decoder/0/attention/heads'"):
        capture.run(
            model,
            src,
            tgt,
            valid,
            interventions={"decoder/0/attention/heads": capture.ablate_heads([0])},
        )
    with pytest.raises(ValueError, match="head 9 is out of range: the layer has 4 heads"):
        capture.run(
            model,
            src,
            tgt,
            valid,
            interventions={"decoder/0/self_attention/heads": capture.ablate_heads([9])},
        )
    scanned = jf.DecoderLM(jf.TransformerConfig.tiny(V, scan_layers=True), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="capture and intervene with scan_layers=False"):
        capture.run(scanned, tgt, capture=["decoder/0/out"])


def _greedy_without_cache(model, src, valid, n, interventions):
    """Greedy decoding by full forward passes (capture.run), each with the interventions."""
    out = jnp.full((src.shape[0], 1), 1, jnp.int32)  # BOS
    for _ in range(n):
        logits, _ = capture.run(model, src, out, valid, interventions=interventions)
        out = jnp.concatenate([out, jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)], 1)
    return np.asarray(out[:, 1:])


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_interventions_hold_in_every_step_of_cached_decoding(model):
    from jaxformer import decode

    src, _, valid = inputs()
    site = {"decoder/0/self_attention/heads": capture.ablate_heads([1, 2])}
    plain = np.asarray(decode.greedy(model, src, valid, max_new_tokens=6, eos_id=None))
    ablated = np.asarray(
        decode.greedy(model, src, valid, max_new_tokens=6, eos_id=None, interventions=site)
    )
    np.testing.assert_array_equal(ablated, _greedy_without_cache(model, src, valid, 6, site))
    assert not np.array_equal(ablated, plain)  # the ablation changes what is decoded
    same = {"decoder/1/cross_attention/heads": lambda x: x}
    np.testing.assert_array_equal(
        decode.greedy(model, src, valid, max_new_tokens=6, eos_id=None, interventions=same), plain
    )
    # A later search without interventions is traced anew, not taken from the cache.
    np.testing.assert_array_equal(
        decode.greedy(model, src, valid, max_new_tokens=6, eos_id=None), plain
    )
    tokens, _ = decode.beam_search(
        model, src, valid, beam_size=1, max_new_tokens=6, eos_id=None, interventions=site
    )
    np.testing.assert_array_equal(tokens[:, 0], ablated)  # beam 1 is greedy
    with pytest.raises(ValueError, match="no site 'decoder/0/ffn/heads'"):
        decode.greedy(
            model,
            src,
            valid,
            max_new_tokens=2,
            interventions={"decoder/0/ffn/heads": jnp.zeros_like},
        )
