"""Model configuration: one frozen dataclass that checks itself, with the paper's presets."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxformer.functional.attention import IMPLEMENTATIONS
from jaxformer.functional.layers import ACTIVATIONS, NORM_PLACEMENTS, NORMS, BlockOptions

POSITION_EMBEDDINGS = ("sinusoidal", "learned", "rope", "none")
DTYPES = ("float32", "bfloat16")
# Rematerialisation of each layer in the backward pass: keep nothing ("full"), or keep the
# outputs of matmuls with weights ("dots": projections and feed-forward) and recompute the rest.
REMAT = ("none", "full", "dots")

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

    Head dims d_k / d_v default to d_model / num_heads. `num_kv_heads` < num_heads gives
    grouped-query (or, at 1, multi-query) attention. `dtype` is the compute dtype;
    parameters are kept in `param_dtype`. norm_eps, norm_bias, attention_bias, ffn_bias
    and final_norm also describe models that differ from the paper, such as PyTorch's
    nn.Transformer (see jaxformer.interop.torch).

    `remat` trades compute for memory in training (see REMAT); `scan_layers` keeps each
    layer stack's parameters stacked [N, ...] and runs it as one scan, so compile time
    does not grow with depth (checkpoints then hold the stacked layout). Neither changes
    the numbers.
    """

    vocab_size: int
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    num_kv_heads: int | None = None
    d_k: int | None = None
    d_v: int | None = None
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    label_smoothing: float = 0.1
    max_len: int = 512
    position_embedding: str = "sinusoidal"
    norm: str = "layer"
    norm_placement: str = "post"
    norm_eps: float = 1e-6
    norm_bias: bool = True
    final_norm: bool | None = None
    activation: str = "relu"
    share_embeddings: bool = True
    attention_bias: bool = False
    ffn_bias: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "xla"  # "xla" | "chunked" | "cudnn" (scaled_dot_product_attention)
    remat: str = "none"
    scan_layers: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "max_len"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("num_encoder_layers", "num_decoder_layers"):
            _check_int(name, getattr(self, name), minimum=0)
        for name in ("num_kv_heads", "d_k", "d_v"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        if self.d_k is None or self.d_v is None:
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                    "choose sizes that divide or set d_k and d_v explicitly"
                )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        for name in ("dropout_rate", "attention_dropout_rate", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        for name, allowed in (
            ("position_embedding", POSITION_EMBEDDINGS),
            ("norm", NORMS),
            ("norm_placement", NORM_PLACEMENTS),
            ("activation", ACTIVATIONS),
            ("dtype", DTYPES),
            ("param_dtype", DTYPES),
            ("attention_impl", IMPLEMENTATIONS),
            ("remat", REMAT),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.position_embedding == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.position_embedding == "rope" and self.key_dim % 2:
            raise ValueError(f"rope needs an even key head dim d_k, got {self.key_dim}")
        eps = self.norm_eps
        if not isinstance(eps, int | float) or isinstance(eps, bool) or eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        for name in ("share_embeddings", "attention_bias", "ffn_bias", "norm_bias", "scan_layers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.final_norm is not None and not isinstance(self.final_norm, bool):
            raise TypeError(f"final_norm must be a bool or None, got {self.final_norm!r}")

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
    def use_final_norm(self) -> bool:
        """A norm after the last layer: needed with pre-LN, absent in the paper's post-LN."""
        return self.norm_placement == "pre" if self.final_norm is None else self.final_norm

    def block_options(self) -> BlockOptions:
        return BlockOptions(
            norm=self.norm,
            norm_placement=self.norm_placement,
            norm_eps=self.norm_eps,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            attention_impl=self.attention_impl,
        )

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
        fields = dict(
            num_encoder_layers=2,
            num_decoder_layers=2,
            d_model=128,
            d_ff=512,
            num_heads=4,
            max_len=256,
        )
        return cls(vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def table3(cls, row: str, vocab_size: int, **overrides) -> TransformerConfig:
        """A row of the paper's Table 3 ("base", "A1".."A4", "B1", "B2", "C1".."C7",
        "D1".."D4", "E", "big"): the base model with that row's changes."""
        if row not in TABLE3_ROWS:
            raise ValueError(f"unknown Table 3 row {row!r}; rows are {list(TABLE3_ROWS)}")
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
            raise ValueError(f"unknown config key(s) {unknown}; valid keys are {valid}")
        return cls(**fields)

    def replace(self, **changes) -> TransformerConfig:
        return self.from_dict(self.to_dict() | changes)


def _check_int(name: str, value, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
