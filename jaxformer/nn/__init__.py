"""Flax NNX modules: they declare parameters and call `jaxformer.functional`."""

from jaxformer.nn.attention import MultiHeadAttention
from jaxformer.nn.blocks import (
    DecoderLayer,
    DecoderStack,
    EncoderDecoder,
    EncoderLayer,
    EncoderStack,
    FeedForward,
    Norm,
    add_lora,
    make_norm,
    merge_lora,
)
from jaxformer.nn.embeddings import Embed, LearnedPositions
from jaxformer.nn.parameters import LOGICAL_AXES, lora_weight, plain
