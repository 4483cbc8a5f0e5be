"""Hugging Face checkpoints in and out: GPT-2, Marian and BART (`pip install 'jaxformer[hf]'`;
`transformers` is needed only to pass a model object, a folder is read with `safetensors`).

    gpt2    GPT2LMHeadModel / GPT2Model        -> DecoderLM (pre-LN, learned positions)
    marian  MarianMTModel / MarianModel        -> Transformer (post-LN, sinusoids)
    bart    BartForConditionalGeneration / BartModel -> Transformer (post-LN, learned)

`from_hf` reads the architecture (`config_from_hf`) and copies the weights; `to_hf` writes
`config.json` and `model.safetensors` that `from_pretrained` loads. What jaxformer cannot
express is refused with an error naming it; training-only differences (embd_pdrop,
activation_dropout, layerdrop) are not. BART's two unused position rows are dropped."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
from flax import nnx

from jaxformer.checks import BadType, BadValue, MissingFile, MissingPackage
from jaxformer.config import TransformerConfig
from jaxformer.data.tokenizers import ByteTokenizer, HFTokenizer
from jaxformer.functional.positions import sinusoidal_positions
from jaxformer.interop.weights import (
    Link,
    Path,
    attention,
    dense,
    fill_params,
    from_jax,
    heads_out,
    layer_norm,
    packed_attention,
    params_of,
    same,
    to_jax,
)
from jaxformer.models import DecoderLM, Transformer
from jaxformer.nn import merge_lora

CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE = "config.json", "model.safetensors", "tokenizer.json"
INDEX_FILE = "model.safetensors.index.json"
MODEL_TYPES = ("gpt2", "marian", "bart")
ACTIVATIONS = {  # Hugging Face's activation_function -> jaxformer's
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "swish": "silu",
    "silu": "silu",
}
BART_POSITION_OFFSET = 2
# Weights of the model with a head that sit outside its base model ("transformer." or "model.").
OUTSIDE_BASE_MODEL = ("lm_head.weight", "final_logits_bias")


# --- in ------------------------------------------------------------------------------------


def from_hf(model_or_path) -> Transformer | DecoderLM:
    """The jaxformer model of a Hugging Face GPT-2, Marian or BART model: a `transformers`
    model object, or a local folder with config.json and model.safetensors."""
    hf_config, weights = _read(model_or_path)
    config = config_from_hf(hf_config)
    cls = DecoderLM if hf_config["model_type"] == "gpt2" else Transformer
    target = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    weights = _strip_prefix(weights, hf_config["model_type"])
    links = _links(hf_config["model_type"], config)
    arrays = to_jax(links, weights, "from_hf")
    _check_leftovers(weights, {n for link in links for n in link.names}, hf_config, config)
    fill_params(target, arrays, "from_hf")
    return target


def load(folder: str | pathlib.Path) -> tuple[Transformer | DecoderLM, HFTokenizer]:
    """The model (`from_hf`) and tokenizer of a Hugging Face folder: its tokenizer.json,
    with the special ids of its config.json (GPT-2: eos, also bos and pad unless given;
    Marian and BART: pad, eos, and decoder_start_token_id as the decoder's first token)."""
    model = from_hf(folder)
    path = pathlib.Path(folder) / TOKENIZER_FILE
    if not path.is_file():
        raise MissingFile(
            f"{folder}: no {TOKENIZER_FILE}; jaxformer reads Hugging Face's tokenizer.json "
            "(sentencepiece files alone, as in OPUS-MT folders, are not supported)"
        )
    c = json.loads((pathlib.Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    eos = c.get("eos_token_id")
    bos = c.get("bos_token_id") if c["model_type"] == "gpt2" else c.get("decoder_start_token_id")
    ids = dict(pad_id=c.get("pad_token_id"), bos_id=bos, eos_id=eos)
    ids = {k: eos if v is None else v for k, v in ids.items()}
    if eos is None:
        raise BadValue(f"{folder}/{CONFIG_FILE} names no eos_token_id")
    tokenizer = HFTokenizer.from_file(path, **ids)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise BadValue(
            f"{path} has {tokenizer.vocab_size} tokens, more than the model's "
            f"vocab_size={model.config.vocab_size}"
        )
    return model, tokenizer


def is_model_folder(folder: str | pathlib.Path) -> bool:
    """Whether `folder` holds a Hugging Face config.json and safetensors weights."""
    folder = pathlib.Path(folder)
    weights = (folder / WEIGHTS_FILE).is_file() or (folder / INDEX_FILE).is_file()
    return (folder / CONFIG_FILE).is_file() and weights


def config_from_hf(hf_config: dict[str, Any]) -> TransformerConfig:
    """The TransformerConfig of a Hugging Face config (a dict, as in config.json)."""
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise BadValue(
            f"model_type {model_type!r} is not supported; jaxformer converts {list(MODEL_TYPES)}"
        )
    fields = _gpt2_fields(hf_config) if model_type == "gpt2" else _seq2seq_fields(hf_config)
    activation = hf_config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise BadValue(
            f"activation_function={activation!r} has no jaxformer counterpart; supported: "
            f"{list(ACTIVATIONS)}"
        )
    return TransformerConfig(
        vocab_size=hf_config["vocab_size"],
        activation=ACTIVATIONS[activation],
        norm="layer",
        norm_bias=True,
        attention_bias=True,
        ffn_bias=True,
        label_smoothing=0.0,
        **fields,
    )


def _gpt2_fields(c: dict) -> dict:
    _refuse(c, "scale_attn_weights", False, "attention scores are always scaled by 1/sqrt(d_k)")
    _refuse(c, "scale_attn_by_inverse_layer_idx", True, "jaxformer does not scale by layer")
    _refuse(c, "add_cross_attention", True, "a DecoderLM has no cross-attention")
    d_model = c["n_embd"]
    return dict(
        num_encoder_layers=0,
        num_decoder_layers=c["n_layer"],
        d_model=d_model,
        d_ff=c.get("n_inner") or 4 * d_model,
        num_heads=c["n_head"],
        max_len=c["n_positions"],
        dropout_rate=c.get("resid_pdrop", 0.1),
        attention_dropout_rate=c.get("attn_pdrop", 0.1),
        position_embedding="learned",
        norm_placement="pre",
        norm_eps=c.get("layer_norm_epsilon", 1e-5),
        final_norm=True,
        share_embeddings=c.get("tie_word_embeddings", True),
        embed_scale=False,
    )


def _seq2seq_fields(c: dict) -> dict:
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if c[a] != c[b]:
            raise BadValue(f"{a}={c[a]} differs from {b}={c[b]}: jaxformer's stacks share one")
    ties = {k: c.get(k, True) for k in ("tie_word_embeddings", "share_encoder_decoder_embeddings")}
    if not all(ties.values()):
        raise BadValue(f"{ties}: jaxformer's Transformer ties source, target and output embeddings")
    if c.get("decoder_vocab_size") not in (None, c["vocab_size"]):
        raise BadValue(f"decoder_vocab_size={c['decoder_vocab_size']} differs from vocab_size")
    for name in ("normalize_before", "add_final_layer_norm", "normalize_embedding"):
        _refuse(c, name, True, "BART and Marian here are post-LN without extra norms")
    bart = c["model_type"] == "bart"
    return dict(
        num_encoder_layers=c["encoder_layers"],
        num_decoder_layers=c["decoder_layers"],
        d_model=c["d_model"],
        d_ff=c["encoder_ffn_dim"],
        num_heads=c["encoder_attention_heads"],
        max_len=c["max_position_embeddings"],
        dropout_rate=c.get("dropout", 0.1),
        attention_dropout_rate=c.get("attention_dropout", 0.0),
        position_embedding="learned" if bart else "sinusoidal_halves",
        norm_placement="post",
        norm_eps=1e-5,
        final_norm=False,
        share_embeddings=True,
        embed_scale=c.get("scale_embedding", False),
        embed_norm=bart,
        logits_bias=True,
    )


def _refuse(c: dict, name: str, value, why: str) -> None:
    if c.get(name) == value:
        raise BadValue(f"{name}={value} has no jaxformer counterpart: {why}")


def _read(model_or_path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config dict, weights by name as float32 NumPy) of a model object or a folder."""
    if isinstance(model_or_path, (str, pathlib.Path)):
        return _read_folder(pathlib.Path(model_or_path))
    if not (hasattr(model_or_path, "config") and hasattr(model_or_path, "state_dict")):
        raise BadType(
            "from_hf takes a transformers model or a folder path, got "
            f"{type(model_or_path).__name__}"
        )
    weights = {
        name: t.detach().cpu().float().numpy() for name, t in model_or_path.state_dict().items()
    }
    return model_or_path.config.to_dict(), weights


def _read_folder(folder: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    if not (folder / CONFIG_FILE).is_file():
        raise MissingFile(f"{folder}: no {CONFIG_FILE} (not a Hugging Face model folder)")
    hf_config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    if (folder / INDEX_FILE).is_file():
        index = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
        files = sorted({folder / f for f in index["weight_map"].values()})
    elif (folder / WEIGHTS_FILE).is_file():
        files = [folder / WEIGHTS_FILE]
    else:
        found = sorted(p.name for p in folder.iterdir())
        raise MissingFile(
            f"{folder}: no {WEIGHTS_FILE} (jaxformer reads safetensors weights; found {found})"
        )
    safetensors_numpy = _import("safetensors.numpy")
    weights = {}
    for f in files:
        weights |= {k: np.asarray(v, np.float32) for k, v in safetensors_numpy.load_file(f).items()}
    return hf_config, weights


def _strip_prefix(weights: dict, model_type: str) -> dict:
    """Names relative to the base model ("transformer." / "model." dropped)."""
    prefix = "transformer." if model_type == "gpt2" else "model."
    return {k.removeprefix(prefix): v for k, v in weights.items()}


def _check_leftovers(weights: dict, used: set, hf_config: dict, config: TransformerConfig) -> None:
    """Weights not converted must be ones jaxformer recomputes or ties; others are refused."""
    shared = "wte.weight" if hf_config["model_type"] == "gpt2" else "shared.weight"
    tied = {"lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    leftovers = sorted(set(weights) - used)
    for name in leftovers:
        if name in tied and config.share_embeddings:
            _check_equal(name, weights[name], weights[shared], f"tied to {shared}")
        elif name.endswith("embed_positions.weight") and config.position_embedding != "learned":
            table = sinusoidal_positions(config.max_len, config.d_model, layout="halves")
            _check_equal(name, weights[name], np.asarray(table), "Marian's fixed sinusoids")
        elif not name.endswith((".attn.bias", ".attn.masked_bias")):  # GPT-2's old mask buffers
            raise BadValue(f"from_hf: the weight {name!r} has no jaxformer counterpart")


def _check_equal(name: str, got: np.ndarray, expected: np.ndarray, what: str) -> None:
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=0, atol=1e-6):
        raise BadValue(f"from_hf: {name} differs from {what}; jaxformer cannot represent it")


# --- out -----------------------------------------------------------------------------------


def to_hf(model: Transformer | DecoderLM, folder: str | pathlib.Path, *, tokenizer=None):
    """Write `model` as a Hugging Face checkpoint folder (config.json, model.safetensors)
    that transformers' `from_pretrained` loads: a DecoderLM as GPT-2, a Transformer as
    Marian (sinusoids in halves) or BART (learned positions and an embedding norm).

    tokenizer: its special ids go into config.json (default 0, 1, 2), and a BPE or Hugging
    Face one is written as tokenizer.json. LoRA adapters are merged into the weights they
    adapt (`nn.merge_lora`). Returns the folder. ValueError names what the format cannot hold."""
    model_type = _model_type_of(model)
    model = merge_lora(model)
    if model.config.scan_layers:
        raise BadValue("to_hf: scan_layers=True stacks the layers; convert a model without it")
    hf_config = _hf_config(model_type, model.config, tokenizer or ByteTokenizer())
    differences = _differences(model.config, config_from_hf(hf_config))
    if differences:
        raise BadValue(f"to_hf: {model_type} cannot hold this model: {differences}")
    weights = _hf_weights(model, model_type)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
    save_file = _import("safetensors.numpy").save_file
    save_file(weights, folder / WEIGHTS_FILE, metadata={"format": "pt"})
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.save_hf(folder / TOKENIZER_FILE)
    return folder


def _hf_weights(model, model_type: str) -> dict[str, np.ndarray]:
    """The model's parameters under their Hugging Face names."""
    links = _links(model_type, model.config)
    weights = from_jax(links, params_of(model), f"to_hf: {model_type}")
    prefix = "transformer." if model_type == "gpt2" else "model."
    return {
        (k if k in OUTSIDE_BASE_MODEL else prefix + k): np.ascontiguousarray(v)
        for k, v in weights.items()
    }


def _model_type_of(model) -> str:
    if isinstance(model, DecoderLM):
        return "gpt2"
    if not isinstance(model, Transformer):
        raise BadType(f"to_hf converts a Transformer or a DecoderLM, got {type(model).__name__}")
    position = model.config.position_embedding
    if position == "sinusoidal_halves":
        return "marian"
    if position == "learned" and model.config.embed_norm:
        return "bart"
    raise BadValue(
        f"to_hf: a Transformer with position_embedding={position!r} and embed_norm="
        f"{model.config.embed_norm} is neither Marian ('sinusoidal_halves') nor BART "
        "('learned' with embed_norm)"
    )


# Fields that do not change the weights or the function they compute.
_NOT_ARCHITECTURE = (
    "label_smoothing",
    "dtype",
    "param_dtype",
    "attention_impl",
    "remat",
    "lm_head",
)


def _differences(have: TransformerConfig, can: TransformerConfig) -> str:
    """The architecture fields of `have` that `can` (what the format holds) lacks."""
    have, can = have.to_dict(), can.to_dict()
    return ", ".join(
        f"{k}={have[k]!r} (it has {can[k]!r})"
        for k in have
        if k not in _NOT_ARCHITECTURE and have[k] != can[k]
    )


def _hf_config(model_type: str, c: TransformerConfig, tokenizer) -> dict:
    """The Hugging Face config.json of `c` as `model_type`, with the tokenizer's ids."""
    ids = dict(
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        decoder_start_token_id=tokenizer.bos_id,
    )
    activation = {v: k for k, v in ACTIVATIONS.items() if k not in ("gelu_pytorch_tanh", "silu")}
    if c.activation not in activation:
        raise BadValue(
            f"to_hf: activation={c.activation!r} has no Hugging Face counterpart; "
            f"{model_type} takes {sorted(activation)}"
        )
    common = dict(
        model_type=model_type, vocab_size=c.vocab_size, tie_word_embeddings=c.share_embeddings
    )
    common["activation_function"] = activation[c.activation]
    if model_type == "gpt2":
        ids.pop("decoder_start_token_id")
        gpt2 = dict(
            architectures=["GPT2LMHeadModel"],
            n_layer=c.num_decoder_layers,
            n_embd=c.d_model,
            n_inner=c.d_ff,
            n_head=c.num_heads,
            n_positions=c.max_len,
            layer_norm_epsilon=c.norm_eps,
            resid_pdrop=c.dropout_rate,
            embd_pdrop=c.dropout_rate,
            attn_pdrop=c.attention_dropout_rate,
        )
        return common | ids | gpt2
    architecture = {"marian": "MarianMTModel", "bart": "BartForConditionalGeneration"}[model_type]
    seq2seq = dict(
        architectures=[architecture],
        encoder_layers=c.num_encoder_layers,
        decoder_layers=c.num_decoder_layers,
        d_model=c.d_model,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        encoder_attention_heads=c.num_heads,
        decoder_attention_heads=c.num_heads,
        max_position_embeddings=c.max_len,
        dropout=c.dropout_rate,
        attention_dropout=c.attention_dropout_rate,
        activation_dropout=0.0,
        scale_embedding=c.embed_scale,
        is_encoder_decoder=True,
        forced_eos_token_id=ids["eos_token_id"],
        share_encoder_decoder_embeddings=True,
    )
    return common | ids | seq2seq


# --- one table of names, used in both directions -------------------------------------------


def _links(model_type: str, c: TransformerConfig) -> list[Link]:
    if model_type == "gpt2":
        return _gpt2_links(c)
    links = _embedding_links(c, model_type)
    for stack, n in (("encoder", c.num_encoder_layers), ("decoder", c.num_decoder_layers)):
        for i in range(n):
            links += _seq2seq_layer_links(c, f"{stack}.layers.{i}", (stack, "layers", i))
    return links


def _gpt2_links(c: TransformerConfig) -> list[Link]:
    links = [
        same("wte.weight", ("inputs", "embed", "table")),
        same("wpe.weight", ("inputs", "positions", "table")),
        *layer_norm("ln_f", ("decoder", "final_norm")),
    ]
    if not c.share_embeddings:
        links.append(same("lm_head.weight", ("output_embed", "table")))
    H = c.num_heads
    for i in range(c.num_decoder_layers):
        hf, jx = f"h.{i}", ("decoder", "layers", i)
        links += [  # Conv1D layers: [in, out]
            *layer_norm(f"{hf}.ln_1", (*jx, "norm1")),
            *layer_norm(f"{hf}.ln_2", (*jx, "norm3")),
            *packed_attention(
                f"{hf}.attn.c_attn.weight",
                f"{hf}.attn.c_attn.bias",
                (*jx, "self_attn"),
                H,
                out_in=False,
            ),
            *heads_out(f"{hf}.attn.c_proj", (*jx, "self_attn"), H, out_in=False),
            *dense(f"{hf}.mlp.c_fc", (*jx, "ffn"), "w1", "b1", out_in=False),
            *dense(f"{hf}.mlp.c_proj", (*jx, "ffn"), "w2", "b2", out_in=False),
        ]
    return links


def _embedding_links(c: TransformerConfig, model_type: str) -> list[Link]:
    links = [
        same("shared.weight", ("src_inputs", "embed", "table")),
        Link(
            ("final_logits_bias",), (("logits_bias",),), lambda b: [b[0][0]], lambda b: [b[0][None]]
        ),
    ]
    if model_type == "bart":
        for stack, inputs in (("encoder", "src_inputs"), ("decoder", "tgt_inputs")):
            links.append(
                Link(
                    (f"{stack}.embed_positions.weight",),
                    ((inputs, "positions", "table"),),
                    lambda t: [t[0][BART_POSITION_OFFSET:]],
                    lambda t: [np.pad(t[0], ((BART_POSITION_OFFSET, 0), (0, 0)))],
                )
            )
            links += layer_norm(f"{stack}.layernorm_embedding", (inputs, "norm"))
    return links


def _seq2seq_layer_links(c: TransformerConfig, hf: str, jx: Path) -> list[Link]:
    decoder = jx[0] == "decoder"
    links = [
        *attention(f"{hf}.self_attn", (*jx, "self_attn"), c.num_heads),
        *layer_norm(f"{hf}.self_attn_layer_norm", (*jx, "norm1")),
        *dense(f"{hf}.fc1", (*jx, "ffn"), "w1", "b1", out_in=True),
        *dense(f"{hf}.fc2", (*jx, "ffn"), "w2", "b2", out_in=True),
        *layer_norm(f"{hf}.final_layer_norm", (*jx, "norm3" if decoder else "norm2")),
    ]
    if decoder:
        links += attention(f"{hf}.encoder_attn", (*jx, "cross_attn"), c.num_heads)
        links += layer_norm(f"{hf}.encoder_attn_layer_norm", (*jx, "norm2"))
    return links


def _import(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise MissingPackage(
            f"jaxformer.interop.hf needs {name.split('.')[0]}: pip install 'jaxformer[hf]'"
        ) from None
