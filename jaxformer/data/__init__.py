"""Tokenizers, synthetic tasks and file datasets."""

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
from jaxformer.data.tasks import DATE_FORMATS, TASKS, get_task
from jaxformer.data.tokenizers import (
    BPETokenizer,
    ByteTokenizer,
    HFTokenizer,
    check_tokens,
    load_tokenizer,
)
