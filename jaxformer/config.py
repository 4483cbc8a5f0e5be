"""The model's configuration: TransformerConfig, with the paper's presets and Table 3's
rows, a frozen dataclass that checks itself; config files read (the run's configuration is
`jaxformer.train.config`)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
from typing import Any

import jax.numpy as jnp

from jaxformer.checks import (
    BadValue,
    MissingFile,
    as_given,
    check_bool,
    check_choice,
    check_divisible,
    check_even,
    check_int,
    check_number,
)
from jaxformer.functional.layers import NORM_PLACEMENTS, BlockOptions
from jaxformer.functional.registry import POSITIONS

# Positions built into the model; fixed tables (the sinusoids, or your own) are the
# registered functional.POSITIONS.
MODEL_POSITIONS = ("learned", "rope", "none")
PRESETS = ("tiny", "paper_base", "paper_big", "gpt2_small")  # TransformerConfig's constructors
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Rematerialisation of each layer in the backward pass: keep nothing ("full"), or keep the
# outputs of matmuls with weights ("dots": projections and feed-forward) and recompute the rest.
REMAT = ("none", "full", "dots")
# The output projection + loss in training: the [B*T, V] float32 logits at once ("dense"),
# vocabulary chunks that never hold them all ("chunked"), or chunked when B*T*V is large.
LM_HEADS = ("auto", "dense", "chunked")
# What each LoRA target (`nn.add_lora`) adapts in every attention (self and cross) and
# feed-forward module; a weight's input axes come first (wo's: H, Dv).
LORA_TARGETS = dict(q=("wq",), k=("wk",), v=("wv",), o=("wo",), ff=("w1", "w_gate", "w2"))


def lora_targets(text: str | None) -> tuple[str, ...]:
    """The LORA_TARGETS that a comma-separated `text` names (None: "q,v", the LoRA paper's)."""
    for name in (names := tuple((text or "q,v").split(","))):
        if name not in LORA_TARGETS:
            close = difflib.get_close_matches(name, LORA_TARGETS, n=1)
            raise BadValue(
                f"{as_given('lora_targets', text)} names {name!r}: "
                + (f"did you mean {close[0]!r}? " if close else "")
                + f"give a comma-separated list of {','.join(LORA_TARGETS)}"
            )
    return names


def setting(default, help: str, choices: tuple[str, ...] | None = None, *, resume: bool = False):
    """A config field with its default, its help text and its choices, from which the
    `jaxformer` command derives its options; `resume` marks a run option that a resumed
    run must share with its checkpoint (RunConfig.resume_settings)."""
    metadata = {"help": help, "choices": choices, "resume": resume}
    return dataclasses.field(default=default, metadata=metadata)


# Table 3 of the paper: each row is the base model with these fields changed.
TABLE3_ROWS: dict[str, dict[str, Any]] = {
    "base": {},
    "A1": dict(num_heads=1, d_k=512, d_v=512),
    "A2": dict(num_heads=4, d_k=128, d_v=128),
    "A3": dict(num_heads=16, d_k=32, d_v=32),
    "A4": dict(num_heads=32, d_k=16, d_v=16),
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    "C1": dict(num_encoder_layers=2, num_decoder_layers=2),
    "C2": dict(num_encoder_layers=4, num_decoder_layers=4),
    "C3": dict(num_encoder_layers=8, num_decoder_layers=8),
    "C4": dict(d_model=256, d_k=32, d_v=32),
    "C5": dict(d_model=1024, d_k=128, d_v=128),
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    "D1": dict(dropout_rate=0.0),
    "D2": dict(dropout_rate=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    "E": dict(position_embedding="learned"),
    "big": dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and choices of a Transformer. Defaults are the paper's base model.

    d_k / d_v default to d_model / num_heads; `num_kv_heads` < num_heads gives grouped-query
    attention. `dtype` is the compute dtype, `param_dtype` the parameters'.

    `remat` trades compute for memory (see REMAT); `scan_layers` stacks each layer stack's
    parameters [N, ...] and runs it as one scan, so compile time does not grow with depth.
    `lm_head` chooses how training computes the output projection and loss (LM_HEADS)."""

    vocab_size: int = setting(
        dataclasses.MISSING, "vocabulary size V (in training: the tokenizer's)"
    )
    num_encoder_layers: int = setting(6, "encoder layers N")
    num_decoder_layers: int = setting(6, "decoder layers N (the layers of a decoder-only LM)")
    d_model: int = setting(512, "model dimension")
    d_ff: int = setting(2048, "feed-forward hidden dimension")
    num_heads: int = setting(8, "attention heads h")
    num_kv_heads: int | None = setting(None, "key/value heads (grouped-query); default h")
    d_k: int | None = setting(None, "key (and query) head dimension; default d_model / h")
    d_v: int | None = setting(None, "value head dimension; default d_model / h")
    dropout_rate: float = setting(0.1, "residual and embedding dropout P_drop")
    attention_dropout_rate: float = setting(0.0, "dropout on the attention weights")
    label_smoothing: float = setting(0.1, "label smoothing eps_ls of the training loss")
    max_len: int = setting(512, "longest sequence (rows of the position table)")
    position_embedding: str = setting(
        "sinusoidal", "sinusoidal, sinusoidal_halves, learned, rope, none, or a registered table"
    )
    norm: str = setting("layer", "layer (LayerNorm), rms (RMSNorm), or a registered norm")
    norm_placement: str = setting("post", "post-LN (the paper) or pre-LN", NORM_PLACEMENTS)
    norm_eps: float = setting(1e-6, "epsilon of the norms")
    norm_bias: bool = setting(True, "LayerNorm with a bias (beta)")
    final_norm: bool | None = setting(None, "a norm after each stack; default with pre-LN")
    activation: str = setting(
        "relu", "relu, gelu, gelu_tanh, silu, swiglu, or a registered activation"
    )
    share_embeddings: bool = setting(
        True, "one matrix embeds source and target and makes the logits"
    )
    embed_scale: bool = setting(True, "token embeddings times sqrt(d_model) (section 3.4)")
    embed_norm: bool = setting(False, "a norm over embeddings + positions (BART)")
    logits_bias: bool = setting(False, "a learned bias on the output logits (Marian, BART)")
    attention_bias: bool = setting(False, "biases on the attention projections")
    ffn_bias: bool = setting(True, "biases on the feed-forward layers")
    dtype: str = setting("float32", "compute dtype (parameters stay float32)", tuple(DTYPES))
    param_dtype: str = setting("float32", "parameter dtype", tuple(DTYPES))
    attention_impl: str = setting(
        "auto", "attention kernel: auto (tokamax, cudnn, chunked or xla by device), or registered"
    )
    remat: str = setting("none", "recompute layers in the backward pass", REMAT)
    lm_head: str = setting(
        "auto", "training's output head + loss: auto (chunked if B*T*V is large)", LM_HEADS
    )
    scan_layers: bool = setting(False, "stacked layers in one scan (faster compile)")

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "max_len"):
            check_int(name, getattr(self, name))
        for name in ("num_encoder_layers", "num_decoder_layers"):
            check_int(name, getattr(self, name), minimum=0)
        for name in ("num_kv_heads", "d_k", "d_v"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        if self.d_k is None or self.d_v is None:
            check_divisible("d_model", self.d_model, "num_heads", self.num_heads)
        check_divisible("num_heads", self.num_heads, "num_kv_heads", self.kv_heads)
        check_number("label_smoothing", self.label_smoothing, "[0, 1)")
        self.block_options()  # checks norm, activation, dropout rates, attention_impl
        POSITIONS.check(self.position_embedding, also=MODEL_POSITIONS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("param_dtype", self.param_dtype, DTYPES)
        check_choice("remat", self.remat, REMAT)
        check_choice("lm_head", self.lm_head, LM_HEADS)
        if self.position_embedding in ("sinusoidal", "sinusoidal_halves"):
            check_even("d_model", self.d_model, "sinusoidal positions")
        if self.position_embedding == "rope":
            check_even("key head dim d_k", self.key_dim, "rotary embeddings")
        for name in (f.name for f in dataclasses.fields(self) if f.type == "bool"):
            check_bool(name, getattr(self, name))
        if self.final_norm is not None:
            check_bool("final_norm", self.final_norm)

    # Derived sizes.
    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def key_dim(self) -> int:
        return self.d_model // self.num_heads if self.d_k is None else self.d_k

    @property
    def value_dim(self) -> int:
        return self.d_model // self.num_heads if self.d_v is None else self.d_v

    @property
    def position_table(self) -> bool:
        """Positions come from a table of max_len rows, so sequences are at most max_len."""
        return self.position_embedding == "learned" or self.position_embedding in POSITIONS.names

    @property
    def use_final_norm(self) -> bool:
        """A norm after the last layer: needed with pre-LN, absent in the paper's post-LN."""
        return self.norm_placement == "pre" if self.final_norm is None else self.final_norm

    def block_options(self) -> BlockOptions:
        """The layers' options: the config's fields of the same names."""
        names = (f.name for f in dataclasses.fields(BlockOptions))
        return BlockOptions(**{name: getattr(self, name) for name in names})

    # Presets.
    @classmethod
    def paper_base(cls, vocab_size: int, **overrides) -> TransformerConfig:
        """Base model: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1 (65M params)."""
        return cls(vocab_size=vocab_size, **overrides)

    @classmethod
    def paper_big(cls, vocab_size: int, **overrides) -> TransformerConfig:
        """Big model: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (213M params)."""
        return cls.table3("big", vocab_size, **overrides)

    @classmethod
    def tiny(cls, vocab_size: int, **overrides) -> TransformerConfig:
        """A small model for CPU experiments and tests: 2+2 layers, d_model=128, h=4."""
        layers = dict(num_encoder_layers=2, num_decoder_layers=2)
        sizes = dict(d_model=128, d_ff=512, num_heads=4, max_len=256)
        return cls(vocab_size=vocab_size, **(layers | sizes | overrides))

    @classmethod
    def gpt2_small(cls, vocab_size: int = 50304, **overrides) -> TransformerConfig:
        """GPT-2-small's shape as a decoder-only model (124M parameters with V = 50304):
        12 pre-LN layers, d_model=768, d_ff=3072, h=12, context 1024, learned positions,
        gelu_tanh, biases, no embedding scale, no dropout or label smoothing, bfloat16
        compute."""
        fields = dict(
            num_encoder_layers=0,
            num_decoder_layers=12,
            d_model=768,
            d_ff=3072,
            num_heads=12,
            max_len=1024,
            position_embedding="learned",
            norm_placement="pre",
            activation="gelu_tanh",
            embed_scale=False,
            attention_bias=True,
            dropout_rate=0.0,
            label_smoothing=0.0,
            dtype="bfloat16",
        )
        return cls(vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def table3(cls, row: str, vocab_size: int, **overrides) -> TransformerConfig:
        """A row of the paper's Table 3 ("base", "A1".."A4", "B1", "B2", "C1".."C7",
        "D1".."D4", "E", "big"): the base model with that row's changes."""
        if row not in TABLE3_ROWS:
            raise BadValue(f"unknown Table 3 row {row!r}; rows are {list(TABLE3_ROWS)}")
        return cls(vocab_size=vocab_size, **(TABLE3_ROWS[row] | overrides))

    # Serialisation.
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> TransformerConfig:
        """Build from a mapping of field names; an unknown key is an error listing the valid ones."""
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(fields) - set(valid))
        if unknown:
            raise BadValue(f"unknown config key(s) {unknown}; valid keys are {valid}")
        return cls(**fields)

    def replace(self, **changes) -> TransformerConfig:
        return self.from_dict(self.to_dict() | changes)


def _yaml_problem(error) -> str:
    """A YAML error in one line: what is wrong, and where ("line 2, column 3")."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return problem + where


def load_config_file(path: str) -> dict:
    """Config fields from a JSON or YAML file (a mapping)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise MissingFile(f"{path}: no such config file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BadValue(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            fields = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BadValue(f"{path}: not valid YAML ({_yaml_problem(e)})") from None
    else:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadValue(f"{path}: not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise BadValue(f"{path}: expected a mapping of config fields, got {type(fields).__name__}")
    return fields
