"""Pure functions of arrays for every part of the Transformer. No Flax, no optax, no I/O."""

from jaxformer.functional import sites
from jaxformer.functional.attention import (
    AUTO_CHUNKED_BYTES,
    AttentionOutput,
    AttentionParams,
    KVCache,
    attention_weights,
    attention_with_weights,
    choose_implementation,
    masked_softmax,
    merge_heads,
    multi_head_attention,
    project_heads,
    project_kv,
    scaled_dot_product_attention,
    write_kv,
)
from jaxformer.functional.kernels import AUTO_RULES, AutoRule
from jaxformer.functional.layers import (
    BlockOptions,
    DecoderLayerCache,
    DecoderLayerParams,
    DecoderOutput,
    EncoderLayerParams,
    FeedForwardParams,
    NormParams,
    decoder_layer,
    decoder_layer_cache,
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
from jaxformer.functional.losses import LossSums, chunked_cross_entropy, cross_entropy
from jaxformer.functional.masks import (
    AttentionMask,
    causal_mask,
    combine_masks,
    fold_masks,
    padding_lengths,
    padding_mask,
    segment_mask,
)
from jaxformer.functional.positions import apply_rope, sinusoidal_positions
from jaxformer.functional.registry import (
    ACTIVATIONS,
    ATTENTION,
    DEVICE_CHECKS,
    NORMS,
    POSITIONS,
    Registry,
    Variant,
)
