"""Flax NNX modules: they declare parameters and call `jaxformer.functional`."""

from jaxformer.nn.attention import MultiHeadAttention
from jaxformer.nn.blocks import (
    DecoderLayer,
    DecoderStack,
    EncoderLayer,
    EncoderStack,
    FeedForward,
    Norm,
)
from jaxformer.nn.embeddings import Embed, LearnedPositions
from jaxformer.nn.encoder_decoder import EncoderDecoder
from jaxformer.nn.parameters import LOGICAL_AXES

__all__ = [
    "LOGICAL_AXES",
    "DecoderLayer",
    "DecoderStack",
    "Embed",
    "EncoderDecoder",
    "EncoderLayer",
    "EncoderStack",
    "FeedForward",
    "LearnedPositions",
    "MultiHeadAttention",
    "Norm",
]
