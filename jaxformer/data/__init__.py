"""Tokenizers, synthetic tasks, file datasets, token shards and packing."""

import importlib

# Each name imported at first use: a plugin registering its datasets by name imports the
# registry alone.
_MODULES = {
    "jaxformer.data.datasets": "DocumentData PairData TaskData TextData TrainingData TsvData "
    "encode_pairs pad_rows",
    "jaxformer.data.packing": "Packed",
    "jaxformer.data.shards": "ShardData read_shard write_shard",
    "jaxformer.data.tasks": "DATE_FORMATS TASKS get_task",
    "jaxformer.data.tokenizers": "BPETokenizer ByteTokenizer HFTokenizer IdsTokenizer "
    "check_tokens load_tokenizer",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxformer.data' has no attribute {name!r}")
