"""Tokenizers: byte-level (default, nothing to download or train) and BPE trained on the
user's own text with the `tokenizers` package (`pip install jaxformer[bpe]`).

Both reserve the same special ids: 0 = padding, 1 = BOS, 2 = EOS. A tokenizer saves to and
loads from `tokenizer.json` in a folder (beside the checkpoints).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable

import numpy as np

from jaxformer.checks import check_int

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
FILENAME = "tokenizer.json"
MIN_MERGE_COUNT = 50  # BPE sized from the data: a merge needs a pair seen this often


def check_tokens(tokens, vocab_size: int, *, name: str = "tokens") -> None:
    """Raise ValueError if a token id lies outside [0, vocab_size), naming the first
    offending position and value.

    A host-side check for ids entering a model: jitted code cannot raise on values, and
    an out-of-range id would silently embed as NaN (too large) or as another token's row
    (negative). tokens: any array-like of integers (NumPy, JAX, lists).
    """
    check_int("vocab_size", vocab_size)
    array = np.asarray(tokens)
    if array.size == 0:
        return
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integer token ids, got dtype {array.dtype}")
    bad = (array < 0) | (array >= vocab_size)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        where = f"{name}[{', '.join(map(str, position))}]" if position else name
        raise ValueError(
            f"{where} = {array[position]} is outside the vocabulary [0, {vocab_size}) "
            f"({int(bad.sum())} id(s) out of range)"
        )


class ByteTokenizer:
    """UTF-8 bytes shifted past the special ids: vocabulary of 3 + 256 = 259."""

    kind = "byte"
    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID
    vocab_size = len(SPECIALS) + 256

    def encode(self, text: str) -> list[int]:
        return [b + len(SPECIALS) for b in text.encode("utf-8")]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids up to the first EOS; other special ids are skipped."""
        ids = list(ids)
        check_tokens(ids, self.vocab_size, name="ids")
        out = bytearray()
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i >= len(SPECIALS):
                out.append(i - len(SPECIALS))
        return out.decode("utf-8", errors="replace")

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One printable label per id (for plots)."""
        labels = []
        for i in ids:
            i = int(i)
            labels.append(SPECIALS[i] if i < len(SPECIALS) else _byte_label(i - len(SPECIALS)))
        return labels

    def save(self, folder: str | pathlib.Path) -> None:
        path = pathlib.Path(folder) / FILENAME
        path.write_text(json.dumps({"jaxformer_tokenizer": "byte"}))


class BPETokenizer:
    """Byte-level BPE trained with the `tokenizers` package; ids 0-2 are the specials."""

    kind = "bpe"
    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, tokenizer):
        self._tok = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int | None = None) -> BPETokenizer:
        """BPE learned from `texts`, up to `vocab_size` ids. With vocab_size None the
        vocabulary is sized from the data: merges stop at pairs seen fewer than
        MIN_MERGE_COUNT times, so that every token is common enough to be learned (at
        most 32000 ids)."""
        tokenizers = _import_tokenizers()
        if vocab_size is not None:
            check_int("vocab_size", vocab_size, minimum=300)  # 256 bytes + specials + merges
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=32000 if vocab_size is None else vocab_size,
            min_frequency=MIN_MERGE_COUNT if vocab_size is None else 0,
            special_tokens=list(SPECIALS),
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        check_tokens(ids, self.vocab_size, name="ids")
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._tok.decode([i for i in ids if i >= len(SPECIALS)])

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        return [self._tok.id_to_token(int(i)) or "?" for i in ids]

    def save(self, folder: str | pathlib.Path) -> None:
        path = pathlib.Path(folder) / FILENAME
        path.write_text(
            json.dumps({"jaxformer_tokenizer": "bpe", "tokenizer": json.loads(self._tok.to_str())})
        )


Tokenizer = ByteTokenizer | BPETokenizer


def load_tokenizer(folder: str | pathlib.Path) -> Tokenizer:
    """The tokenizer saved in `folder` (a run's output folder)."""
    path = pathlib.Path(folder) / FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer in {folder}: {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        kind = data["jaxformer_tokenizer"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a jaxformer tokenizer file ({e})") from None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        tokenizers = _import_tokenizers()
        return BPETokenizer(tokenizers.Tokenizer.from_str(json.dumps(data["tokenizer"])))
    raise ValueError(f"{path}: unknown tokenizer kind {kind!r}")


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            "the BPE tokenizer needs the 'tokenizers' package: pip install 'jaxformer[bpe]'"
        ) from None
    return tokenizers


def _byte_label(b: int) -> str:
    c = chr(b)
    if c == " ":
        return "␣"
    return c if c.isprintable() and b < 128 else f"\\x{b:02x}"
