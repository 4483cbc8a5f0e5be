"""The variant registries: built-ins and your own variants go through one lookup; a
variant in a file of its own trains, saves, restores and decodes by name; unknown names
list the registered ones."""

import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer import functional as F
from jaxformer.cli import main
from jaxformer.functional.registry import import_variants

VARIANTS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "variants"


def load(name):
    """Register experiments/variants/<name>.py through `--variants`' own loader."""
    import_variants([str(VARIANTS / f"{name}.py")])


def test_the_built_ins_are_registered_variants():
    assert F.ACTIVATIONS.names[:5] == ("relu", "gelu", "gelu_tanh", "silu", "swiglu")
    assert F.ACTIVATIONS["swiglu"].options == {"gated": True}
    assert {"layer", "rms"} <= set(F.NORMS.names) and not F.NORMS["rms"].options["bias"]
    assert {"xla", "chunked", "cudnn"} <= set(F.ATTENTION.names)
    assert {"sinusoidal", "sinusoidal_halves"} <= set(F.POSITIONS.names)


@pytest.fixture
def own_tables():
    yield
    for name in ("paper_copy", "too_short"):
        F.POSITIONS._variants.pop(name, None)


def test_a_registered_position_table_is_used_by_name(own_tables):
    """A table of your own replaces the sinusoids: the same model with the paper's table
    written out by hand under a new name gives the same logits; a wrong shape is refused."""
    F.POSITIONS.register("paper_copy", lambda n, d: F.sinusoidal_positions(n, d))
    F.POSITIONS.register("too_short", lambda n, d: jnp.zeros((n - 1, d)))
    tokens = jnp.asarray([[3, 4, 5, 6]])
    logits = {}
    for name in ("sinusoidal", "paper_copy"):
        config = jf.TransformerConfig.tiny(30, position_embedding=name)
        logits[name] = jf.DecoderLM(config, rngs=nnx.Rngs(0))(tokens)
    np.testing.assert_array_equal(logits["sinusoidal"], logits["paper_copy"])
    config = jf.TransformerConfig.tiny(30, position_embedding="too_short")
    assert config.position_table  # a table: sequences are at most max_len
    with pytest.raises(ValueError, match=r"'too_short' gave a float32 table of shape \(255, 128\)"):
        jf.DecoderLM(config, rngs=nnx.Rngs(0))(tokens)
    with pytest.raises(
        ValueError, match="position_embedding must be one of .*'paper_copy'.*got 'alibi'"
    ):
        jf.TransformerConfig.tiny(30, position_embedding="alibi")


def test_a_registered_activation_is_used_by_name():
    load("squared_relu")
    rng = np.random.default_rng(0)
    p = F.FeedForwardParams(*(rng.standard_normal(s).astype(np.float32) for s in [(4, 6), (6, 4)]))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    expected = np.square(np.maximum(x @ p.w1, 0)) @ p.w2
    np.testing.assert_allclose(
        F.feed_forward(x, p, activation="squared_relu"), expected, rtol=1e-5, atol=1e-5
    )


def test_a_registered_attention_kernel_is_used_by_name():
    load("qk_norm")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 5, 2, 8)).astype(np.float32) for _ in range(3))
    unit = lambda a: a / np.sqrt(np.mean(a**2, -1, keepdims=True) + 1e-6)  # noqa: E731
    expected = F.scaled_dot_product_attention(
        unit(q), unit(k), v, causal=True, implementation="xla"
    )
    got = F.scaled_dot_product_attention(q, k, v, causal=True, implementation="qk_norm")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    model = jf.DecoderLM(jf.TransformerConfig.tiny(30, attention_impl="qk_norm"), rngs=nnx.Rngs(0))
    assert model(jnp.ones((1, 4), jnp.int32)).shape == (1, 4, 30)


def test_bad_names_are_refused_listing_the_registered_ones():
    with pytest.raises(
        ValueError, match=r"activation must be one of \('relu', .*got 'cube' .*ACTIVATIONS.register"
    ):
        jf.TransformerConfig.tiny(10, activation="cube")
    with pytest.raises(ValueError, match="norm must be one of .*'layer', 'rms'.* got 'batch'"):
        F.normalize(jnp.ones((2, 4)), F.NormParams(jnp.ones(4)), kind="batch")
    with pytest.raises(ValueError, match="'relu' is already registered; choose another name"):
        F.ACTIVATIONS.register("relu", lambda h: h)
    with pytest.raises(ValueError, match="must be a Python identifier, got 'my act'"):
        F.ACTIVATIONS.register("my act", lambda h: h)
    with pytest.raises(ValueError, match="norm 'rms' has no bias, but NormParams.bias is given"):
        F.normalize(jnp.ones((2, 4)), F.NormParams(jnp.ones(4), jnp.zeros(4)), kind="rms")


@pytest.fixture(autouse=True)
def registries_as_before():
    """Each test's registrations end with it (other tests see the built-ins only)."""
    saved = {r: dict(r._variants) for r in (F.ACTIVATIONS, F.NORMS, F.ATTENTION)}
    yield
    for registry, variants in saved.items():
        registry._variants.clear()
        registry._variants.update(variants)


@pytest.fixture
def unregister():
    """Forget a variant, as a process that never imported it."""
    return lambda name: F.ACTIVATIONS._variants.pop(name)


@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_a_variant_trains_saves_restores_and_needs_its_registration(tmp_path, capsys, unregister):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--variants",
            str(VARIANTS / "squared_relu.py"),
            *"--activation squared_relu --task copy --steps 2 --batch-size 8".split(),
            *"--eval-examples 8 --num-encoder-layers 1 --num-decoder-layers 1".split(),
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    model, _ = checkpoints.restore_model(out)
    assert model.config.activation == "squared_relu"
    unregister("squared_relu")
    with pytest.raises(ValueError, match="activation must be one of .*got 'squared_relu'"):
        checkpoints.restore_model(out)
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(out), "--input", "abc"]) == 2
    assert "got 'squared_relu'" in capsys.readouterr().err
    args = ["generate", "--variants", str(VARIANTS / "squared_relu.py"), "--checkpoint", str(out)]
    assert main([*args, "--input", "abc", "--max-new-tokens", "3"]) == 0
