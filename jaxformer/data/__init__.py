"""Tokenizers, synthetic tasks, file datasets, token shards and packing."""

from jaxformer.data.datasets import (
    DocumentData,
    PairData,
    TaskData,
    TextData,
    TrainingData,
    TsvData,
    encode_pairs,
    pad_rows,
)
from jaxformer.data.packing import Packed
from jaxformer.data.shards import ShardData, read_shard, write_shard
from jaxformer.data.tasks import DATE_FORMATS, TASKS, get_task
from jaxformer.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    HFTokenizer,
    IdsTokenizer,
    check_tokens,
    load_tokenizer,
)
