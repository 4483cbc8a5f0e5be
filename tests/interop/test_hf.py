"""Parity with Hugging Face transformers: GPT-2, Marian and BART models built from small
random configs (no download) give the same logits (within 1e-5) and the same greedy
tokens after `from_hf`; `to_hf` writes folders that `from_pretrained` loads, and
jaxformer -> to_hf -> from_hf is bit-exact."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxformer import decode
from jaxformer.config import TransformerConfig
from jaxformer.models import DecoderLM, Transformer

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (make test installs it)"
)
torch = pytest.importorskip("torch")
from jaxformer.interop.hf import config_from_hf, from_hf, to_hf  # noqa: E402

V = 61
SEQ2SEQ = dict(
    vocab_size=V,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=48,
    decoder_ffn_dim=48,
    max_position_embeddings=40,
)
# Each case: a transformers class and its config; together they cover every option the
# conversion reads (activations, embedding scale, the two position schemes, untied output).
CASES = {
    "gpt2": lambda init: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=V,
            n_positions=40,
            n_embd=32,
            n_layer=2,
            n_head=4,
            initializer_range=init,
            bos_token_id=0,
            eos_token_id=0,
        )
    ),
    "gpt2_untied_relu": lambda init: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=V,
            n_positions=24,
            n_embd=24,
            n_layer=1,
            n_head=2,
            n_inner=40,
            activation_function="relu",
            tie_word_embeddings=False,
            initializer_range=init,
            bos_token_id=0,
            eos_token_id=0,
        )
    ),
    "marian_gelu": lambda init: transformers.MarianMTModel(
        transformers.MarianConfig(
            **SEQ2SEQ,
            init_std=init,
            pad_token_id=V - 1,
            decoder_start_token_id=V - 1,
            eos_token_id=0,
        )
    ),
    "marian_swish_scaled": lambda init: transformers.MarianMTModel(
        transformers.MarianConfig(
            **SEQ2SEQ,
            init_std=init,
            activation_function="swish",
            scale_embedding=True,
            pad_token_id=V - 1,
            decoder_start_token_id=V - 1,
            eos_token_id=0,
        )
    ),
    "bart": lambda init: transformers.BartForConditionalGeneration(
        transformers.BartConfig(**SEQ2SEQ, init_std=init)
    ),
}
INPUTS = {  # batch, source and target lengths, and the real lengths of each row
    "batch3_padded": dict(S=7, T=5, src_len=[7, 4, 1], tgt_len=[5, 2, 3]),
    "batch1": dict(S=3, T=6, src_len=[3], tgt_len=[6]),
}


# Weights drawn with std 0.2 give logits of a few units, where float32 agrees to 1e-5;
# decoding draws them with std 0.5, so that random models do not repeat one token.
INIT_STD = {"logits": 0.2, "decode": 0.5}


def _pair(name, init):
    """(transformers model with non-trivial biases, its jaxformer conversion)."""
    torch.manual_seed(0)
    hf = CASES[name](init).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:  # biases and norms start at 0 and 1: make them matter
                p.add_(0.05 * torch.randn_like(p))
        if hasattr(hf, "final_logits_bias"):
            hf.final_logits_bias.normal_(std=0.1)
    return hf, from_hf(hf)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):
    return (request.param, *_pair(request.param, INIT_STD["logits"]))


def _inputs(S, T, src_len, tgt_len):
    rng = np.random.default_rng(len(src_len) * 10 + S)
    B = len(src_len)
    src, tgt = rng.integers(3, V - 1, (B, S)), rng.integers(3, V - 1, (B, T))
    src_valid = np.arange(S) < np.array(src_len)[:, None]
    tgt_valid = np.arange(T) < np.array(tgt_len)[:, None]
    return src, tgt, src_valid, tgt_valid


def _hf_logits(hf, src, tgt, src_valid, tgt_valid):
    t = lambda a: torch.tensor(np.asarray(a)).long()  # noqa: E731
    with torch.no_grad():
        if hf.config.model_type == "gpt2":
            return hf(t(tgt), attention_mask=t(tgt_valid)).logits.numpy()
        return hf(
            input_ids=t(src),
            attention_mask=t(src_valid),
            decoder_input_ids=t(tgt),
            decoder_attention_mask=t(tgt_valid),
        ).logits.numpy()


def _jax_logits(model, src, tgt, src_valid, tgt_valid):
    if isinstance(model, DecoderLM):
        return np.asarray(model(jnp.asarray(tgt), jnp.asarray(tgt_valid)))
    return np.asarray(model(*map(jnp.asarray, (src, tgt, src_valid, tgt_valid))))


@pytest.mark.parametrize("inputs", list(INPUTS))
def test_logits_match_transformers(pair, inputs):
    name, hf, model = pair
    src, tgt, src_valid, tgt_valid = _inputs(**INPUTS[inputs])
    expected = _hf_logits(hf, src, tgt, src_valid, tgt_valid)
    got = _jax_logits(model, src, tgt, src_valid, tgt_valid)
    assert np.abs(expected).max() > 0.5, "the logits are too small to test anything"
    np.testing.assert_allclose(got[tgt_valid], expected[tgt_valid], rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_tokens_match_generate(name):
    """20 greedy steps (no early stop) from prompts (GPT-2) or padded sources."""
    hf, model = _pair(name, INIT_STD["decode"])
    src, tgt, src_valid, _ = _inputs(**INPUTS["batch3_padded"])
    settings = dict(max_new_tokens=20, do_sample=False, num_beams=1, eos_token_id=None)
    with torch.no_grad():
        if isinstance(model, DecoderLM):
            prompts = torch.tensor(tgt)
            ones = torch.ones_like(prompts)
            expected = hf.generate(prompts, attention_mask=ones, pad_token_id=0, **settings)
            got = decode.greedy(model, jnp.asarray(tgt), max_new_tokens=20, eos_id=None)
            expected = expected[:, tgt.shape[1] :]
        else:
            expected = hf.generate(
                torch.tensor(src),
                attention_mask=torch.tensor(src_valid).long(),
                forced_eos_token_id=None,
                **settings,
            )[:, 1:]
            start = hf.config.decoder_start_token_id
            got = decode.greedy(
                model,
                jnp.asarray(src),
                jnp.asarray(src_valid),
                max_new_tokens=20,
                bos_id=start,
                eos_id=None,
            )
    expected = expected.numpy()
    assert len(np.unique(expected)) > 1, "the generated tokens are all one: nothing to test"
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_to_hf_loads_in_transformers_and_round_trips_exactly(pair, tmp_path):
    name, hf, model = pair
    folder = to_hf(model, tmp_path / name)
    from safetensors.numpy import load_file

    names = set(load_file(folder / "model.safetensors"))
    assert names <= {k for k in hf.state_dict()}, names - set(hf.state_dict())
    reloaded_hf = type(hf).from_pretrained(folder).eval()
    src, tgt, src_valid, tgt_valid = _inputs(**INPUTS["batch3_padded"])
    np.testing.assert_array_equal(
        _hf_logits(reloaded_hf, src, tgt, src_valid, tgt_valid)[tgt_valid],
        _hf_logits(hf, src, tgt, src_valid, tgt_valid)[tgt_valid],
    )
    again = from_hf(folder)  # read with safetensors alone
    assert again.config == model.config
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", ["gpt2", "marian", "bart"])
def test_a_jaxformer_model_exports_with_parity(kind, tmp_path):
    """A model made in jaxformer (random weights) -> to_hf -> transformers: same logits."""
    fields = {
        "gpt2": dict(
            num_encoder_layers=0,
            position_embedding="learned",
            norm_placement="pre",
            activation="gelu_tanh",
            embed_scale=False,
        ),
        "marian": dict(position_embedding="sinusoidal_halves", activation="silu", logits_bias=True),
        "bart": dict(
            position_embedding="learned", embed_norm=True, logits_bias=True, embed_scale=False
        ),
    }[kind]
    model = _small(kind, fields)
    folder = to_hf(model, tmp_path / "b")
    hf = transformers.AutoModelForCausalLM if kind == "gpt2" else transformers.AutoModelForSeq2SeqLM
    hf = hf.from_pretrained(folder).eval()
    src, tgt, src_valid, tgt_valid = _inputs(**INPUTS["batch3_padded"])
    np.testing.assert_allclose(
        _jax_logits(model, src, tgt, src_valid, tgt_valid)[tgt_valid],
        _hf_logits(hf, src, tgt, src_valid, tgt_valid)[tgt_valid],
        rtol=0,
        atol=1e-5,
    )
    assert from_hf(folder).config == model.config


def _small(kind, fields):
    common = dict(attention_bias=True, norm_eps=1e-5, label_smoothing=0.0, max_len=40)
    config = TransformerConfig.tiny(V, d_model=32, d_ff=48, **common, **fields)
    if kind == "gpt2":
        config = config.replace(final_norm=True)
        return DecoderLM(config, rngs=nnx.Rngs(1))
    model = Transformer(config.replace(final_norm=False), rngs=nnx.Rngs(1))
    model.logits_bias.set_value(jax.random.normal(jax.random.PRNGKey(2), (V,)))
    return model


# --- what cannot be converted is refused, naming it -------------------------------------------


def _write_folder(path, config: dict, weights: dict | None = None):
    from safetensors.numpy import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if weights is not None:
        save_file(weights, path / "model.safetensors")
    return path


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    CASES["gpt2"](INIT_STD["logits"]).save_pretrained(folder)
    return folder


def _gpt2_config(folder, **changes):
    return json.loads((folder / "config.json").read_text()) | changes


def _gpt2_weights(folder):
    from safetensors.numpy import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_type="bert"), "model_type 'bert' is not supported; jaxformer converts"),
        (dict(activation_function="quick_gelu"), "activation_function='quick_gelu' has no"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True has"),
        (dict(scale_attn_weights=False), "scale_attn_weights=False has no jaxformer counterpart"),
        (dict(add_cross_attention=True), "add_cross_attention=True has no jaxformer counterpart"),
    ],
)
def test_unrepresentable_configs_are_refused(gpt2_folder, tmp_path, change, message):
    folder = _write_folder(tmp_path / "m", _gpt2_config(gpt2_folder, **change), {})
    with pytest.raises(ValueError, match=message):
        from_hf(folder)


def test_seq2seq_options_without_counterpart_are_refused():
    base = dict(SEQ2SEQ, model_type="marian")
    with pytest.raises(
        ValueError, match="encoder_attention_heads=4 differs from decoder_attention_heads=2"
    ):
        config_from_hf(base | dict(decoder_attention_heads=2))
    with pytest.raises(ValueError, match="'share_encoder_decoder_embeddings': False"):
        config_from_hf(base | dict(share_encoder_decoder_embeddings=False))
    with pytest.raises(ValueError, match="normalize_before=True has no jaxformer counterpart"):
        config_from_hf(base | dict(model_type="bart", normalize_before=True))


def test_folders_without_config_or_weights_are_refused(gpt2_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_hf(tmp_path)
    folder = _write_folder(tmp_path / "noweights", _gpt2_config(gpt2_folder))
    with pytest.raises(FileNotFoundError, match="no model.safetensors .*found \\['config.json'\\]"):
        from_hf(folder)
    with pytest.raises(TypeError, match="from_hf takes a transformers model or a folder path"):
        from_hf(42)


def test_weights_that_do_not_fit_are_refused(gpt2_folder, tmp_path):
    weights = _gpt2_weights(gpt2_folder)
    config = _gpt2_config(gpt2_folder)
    wrong = dict(weights, **{"transformer.h.0.mlp.c_fc.weight": np.zeros((32, 7), np.float32)})
    with pytest.raises(
        ValueError, match="decoder.layers.0.ffn.w1 has shape \\(32, 7\\), expected \\(32, 128\\)"
    ):
        from_hf(_write_folder(tmp_path / "shape", config, wrong))
    extra = dict(weights, **{"transformer.h.0.attn.rotary.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="'h.0.attn.rotary.weight' has no jaxformer counterpart"):
        from_hf(_write_folder(tmp_path / "extra", config, extra))
    missing = {k: v for k, v in weights.items() if k != "transformer.ln_f.bias"}
    with pytest.raises(ValueError, match="the checkpoint has no weight 'ln_f.bias'"):
        from_hf(_write_folder(tmp_path / "missing", config, missing))
    untied = dict(weights, **{"lm_head.weight": weights["transformer.wte.weight"] + 1})
    with pytest.raises(ValueError, match="lm_head.weight differs from tied to wte.weight"):
        from_hf(_write_folder(tmp_path / "untied", config, untied))


def test_to_hf_refuses_what_the_formats_cannot_hold(tmp_path):
    paper = Transformer(
        TransformerConfig.tiny(V, num_encoder_layers=1, num_decoder_layers=1), rngs=nnx.Rngs(0)
    )
    with pytest.raises(ValueError, match="position_embedding='sinusoidal' .* neither Marian"):
        to_hf(paper, tmp_path)
    lm_config = TransformerConfig.tiny(V, num_encoder_layers=0, activation="gelu_tanh", norm="rms")
    with pytest.raises(
        ValueError, match="gpt2 cannot hold this model: .*norm='rms' .*norm_placement='post'"
    ):
        to_hf(DecoderLM(lm_config, rngs=nnx.Rngs(0)), tmp_path)
    swiglu = DecoderLM(lm_config.replace(activation="swiglu"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="activation='swiglu' has no Hugging Face counterpart"):
        to_hf(swiglu, tmp_path)
    with pytest.raises(TypeError, match="to_hf converts a Transformer or a DecoderLM"):
        to_hf(object(), tmp_path)
