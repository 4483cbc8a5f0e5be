"""jaxformer: the Transformer (Vaswani et al., 2017) in JAX and Flax NNX."""

from jaxformer import functional
from jaxformer.config import RunConfig, TransformerConfig
from jaxformer.data.tokenizers import check_tokens
from jaxformer.models import DecoderLM, Encoder, Transformer, count_params

__version__ = "0.1.0"
