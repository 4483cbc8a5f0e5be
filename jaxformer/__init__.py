"""jaxformer: the Transformer (Vaswani et al., 2017) in JAX and Flax NNX."""

import importlib

from jaxformer import accelerators  # noqa: F401  (fills DEVICE_CHECKS, which "auto" reads)

__version__ = "0.1.0"
# Each name imported at first use: the model imports no training or data code.
_LAZY = {
    "TransformerConfig": "jaxformer.config",
    "DecoderLM": "jaxformer.models",
    "Encoder": "jaxformer.models",
    "Transformer": "jaxformer.models",
    "count_params": "jaxformer.models",
    "RunConfig": "jaxformer.train.config",
    "check_tokens": "jaxformer.data.tokenizers",
}
__all__ = ["functional", *_LAZY]


def __getattr__(name: str):
    if name == "functional":
        return importlib.import_module("jaxformer.functional")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer' has no attribute {name!r}")
