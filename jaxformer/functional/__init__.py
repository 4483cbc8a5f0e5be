"""Pure functions of arrays for every part of the Transformer. No Flax, no optax, no I/O."""

from jaxformer.functional.attention import (
    AttentionParams,
    masked_softmax,
    merge_heads,
    multi_head_attention,
    project_heads,
    scaled_dot_product_attention,
)
from jaxformer.functional.layers import (
    BlockOptions,
    DecoderLayerParams,
    EncoderLayerParams,
    FeedForwardParams,
    NormParams,
    decoder_layer,
    dropout,
    embed,
    encoder_layer,
    feed_forward,
    layer_norm,
    normalize,
    residual,
    rms_norm,
    tied_logits,
)
from jaxformer.functional.masks import causal_mask, combine_masks, padding_mask, segment_mask
from jaxformer.functional.positions import apply_rope, sinusoidal_positions

__all__ = [
    "AttentionParams",
    "BlockOptions",
    "DecoderLayerParams",
    "EncoderLayerParams",
    "FeedForwardParams",
    "NormParams",
    "apply_rope",
    "causal_mask",
    "combine_masks",
    "decoder_layer",
    "dropout",
    "embed",
    "encoder_layer",
    "feed_forward",
    "layer_norm",
    "masked_softmax",
    "merge_heads",
    "multi_head_attention",
    "normalize",
    "padding_mask",
    "project_heads",
    "residual",
    "rms_norm",
    "scaled_dot_product_attention",
    "segment_mask",
    "sinusoidal_positions",
    "tied_logits",
]
