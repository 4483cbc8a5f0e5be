"""jaxformer: the Transformer (Vaswani et al., 2017) in JAX and Flax NNX."""

import importlib
from typing import TYPE_CHECKING

from jaxformer import accelerators, functional  # accelerators fills functional.DEVICE_CHECKS
from jaxformer.config import TransformerConfig
from jaxformer.models import DecoderLM, Encoder, Transformer, count_params

if TYPE_CHECKING:
    from jaxformer.data.tokenizers import check_tokens
    from jaxformer.train.config import RunConfig

__version__ = "0.1.0"
# Imported at first use, so that importing the model imports no training or data code.
_LAZY = {"RunConfig": "jaxformer.train.config", "check_tokens": "jaxformer.data.tokenizers"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
