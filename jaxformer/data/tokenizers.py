"""Tokenizers: byte-level (default, nothing to download or train), BPE trained on the
user's own text, and a Hugging Face `tokenizer.json` (a converted checkpoint's); the last
two use the `tokenizers` package (`pip install jaxformer[bpe]`); `IdsTokenizer` stands in
for none (token shards without a tokenizer: ids only).

Every tokenizer names its special ids `pad_id` (filler; may equal eos_id), `bos_id` (the
decoder's start) and `eos_id`; byte and BPE use 0, 1, 2. A tokenizer saves to and loads
from `tokenizer.json` in a folder."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable

import numpy as np

from jaxformer.checks import (
    BadType,
    BadValue,
    MissingFile,
    MissingPackage,
    check_instance,
    check_int,
)

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")
_IDS = ("pad_id", "bos_id", "eos_id")  # the special ids every tokenizer names
FILENAME = "tokenizer.json"
MIN_MERGE_COUNT = 50  # BPE sized from the data: a merge needs a pair seen this often


def check_tokens(tokens, vocab_size: int, *, name: str = "tokens") -> None:
    """Raise ValueError naming the first position and value of a token id (tokens: any
    array-like of integers) outside [0, vocab_size): jitted code cannot raise on values,
    and an out-of-range id would embed silently."""
    check_int("vocab_size", vocab_size)
    array = np.asarray(tokens)
    if array.size == 0:
        return
    if not np.issubdtype(array.dtype, np.integer):
        raise BadType(f"{name} must hold integer token ids, got dtype {array.dtype}")
    bad = (array < 0) | (array >= vocab_size)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        where = f"{name}[{', '.join(map(str, position))}]" if position else name
        raise BadValue(
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
        kept = [i - len(SPECIALS) for i in _until_eos(ids, self) if i >= len(SPECIALS)]
        return bytes(kept).decode("utf-8", errors="replace")

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One printable label per id (for plots)."""
        return [SPECIALS[i] if i < len(SPECIALS) else _byte_label(i) for i in map(int, ids)]

    def save(self, folder: str | pathlib.Path) -> None:
        path = pathlib.Path(folder) / FILENAME
        path.write_text(json.dumps({"jaxformer_tokenizer": "byte"}))


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` with its special ids named explicitly, since
    a `tokenizer.json` does not say which token plays which part. `bos_id` is the token
    the decoder starts from (HF's decoder_start_token_id); `encode` adds no special tokens."""

    kind = "hf"

    def __init__(self, tokenizer, *, pad_id: int, bos_id: int, eos_id: int):
        check_instance("tokenizer", tokenizer, _import_tokenizers().Tokenizer)
        self._tok = tokenizer
        for name, value in zip(_IDS, (pad_id, bos_id, eos_id), strict=True):
            check_int(name, value, minimum=None)
            if not 0 <= value < self.vocab_size:
                raise BadValue(
                    f"{name}={value} is outside the tokenizer's vocabulary [0, {self.vocab_size})"
                )
        self.pad_id, self.bos_id, self.eos_id = int(pad_id), int(bos_id), int(eos_id)

    @classmethod
    def from_file(
        cls, path: str | pathlib.Path, *, pad_id: int, bos_id: int, eos_id: int
    ) -> HFTokenizer:
        """The tokenizer in a Hugging Face `tokenizer.json` file, with its special ids."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise MissingFile(f"{path}: no such file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise BadValue(f"{path} is not a Hugging Face tokenizer file ({e})") from None
        return cls(_parse(text, path), pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ids up to the first EOS, without special tokens."""
        specials = (self.pad_id, self.bos_id)
        kept = [i for i in _until_eos(ids, self) if i not in specials]
        return self._tok.decode(kept, skip_special_tokens=True)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One label per id (for plots)."""
        return [self._tok.id_to_token(int(i)) or "?" for i in ids]

    def save(self, folder: str | pathlib.Path) -> None:
        path = pathlib.Path(folder) / FILENAME
        saved = {"jaxformer_tokenizer": self.kind, "tokenizer": json.loads(self._tok.to_str())}
        path.write_text(json.dumps(saved | {name: getattr(self, name) for name in _IDS}))

    def save_hf(self, path: str | pathlib.Path) -> None:
        """Write the Hugging Face `tokenizer.json` itself (what `from_file` reads)."""
        self._tok.save(str(path))


class BPETokenizer(HFTokenizer):
    """Byte-level BPE trained here with the `tokenizers` package; ids 0-2 are the specials."""

    kind = "bpe"

    def __init__(self, tokenizer):
        super().__init__(tokenizer, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)

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


class IdsTokenizer:
    """No tokenizer (token shards without one): vocab_size ids, eos_id ending (and padding,
    starting) text; text is refused, ids decode as numbers."""

    kind = "ids"

    def __init__(self, vocab_size: int, eos_id: int):
        check_int("vocab_size", vocab_size)
        check_int("eos_id", eos_id, minimum=0)
        if eos_id >= vocab_size:
            raise BadValue(f"eos_id={eos_id} is outside the vocabulary [0, {vocab_size})")
        self.vocab_size, self.pad_id, self.bos_id, self.eos_id = vocab_size, eos_id, eos_id, eos_id

    def encode(self, text: str) -> list[int]:
        raise BadValue("this model was trained on token ids with no tokenizer: it takes no text")

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(map(str, _until_eos(ids, self)))

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        return [str(int(i)) for i in ids]

    def save(self, folder: str | pathlib.Path) -> None:
        saved = {"jaxformer_tokenizer": "ids", "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        (pathlib.Path(folder) / FILENAME).write_text(json.dumps(saved))


Tokenizer = ByteTokenizer | BPETokenizer | HFTokenizer | IdsTokenizer


def load_tokenizer(folder: str | pathlib.Path, eos_id: int | None = None) -> Tokenizer:
    """The tokenizer saved in `folder` (a run's output folder) or in a tokenizer.json file
    named; with `eos_id`, a Hugging Face tokenizer.json whose end-of-text (also padding and
    start) id that is."""
    path = pathlib.Path(folder)
    path = path if path.is_file() else path / FILENAME
    if not path.is_file():
        raise MissingFile(f"no tokenizer in {folder}: {path} does not exist")
    if eos_id is not None:
        return HFTokenizer.from_file(path, pad_id=eos_id, bos_id=eos_id, eos_id=eos_id)
    saved = _read_saved(path)
    kind = saved["jaxformer_tokenizer"]
    if kind == "byte":
        return ByteTokenizer()
    if kind == "ids":
        return IdsTokenizer(saved["vocab_size"], saved["eos_id"])
    tokenizer = _parse(json.dumps(saved["tokenizer"]), path)
    if kind == "bpe":
        return BPETokenizer(tokenizer)
    return HFTokenizer(tokenizer, **{name: saved[name] for name in _IDS})


_SAVED_KEYS = {"byte": (), "bpe": ("tokenizer",), "hf": ("tokenizer", *_IDS)}
_SAVED_KEYS["ids"] = ("vocab_size", "eos_id")


def _read_saved(path: pathlib.Path) -> dict:
    """The JSON of a saved tokenizer, checked to hold what its kind needs."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        kind = saved["jaxformer_tokenizer"]
        missing = [key for key in _SAVED_KEYS.get(kind, ()) if key not in saved]
    except (ValueError, KeyError, TypeError) as e:  # UTF-8 and JSON errors are ValueErrors
        raise BadValue(f"{path} is not a jaxformer tokenizer file ({e})") from None
    if kind not in _SAVED_KEYS:
        raise BadValue(f"{path}: unknown tokenizer kind {kind!r}")
    if missing:
        raise BadValue(f"{path}: a saved {kind!r} tokenizer lacks the keys {missing}")
    return saved


def _until_eos(ids: Iterable[int], tokenizer) -> list[int]:
    """The ids before the tokenizer's first EOS, checked to lie in its vocabulary."""
    ids = list(ids)
    check_tokens(ids, tokenizer.vocab_size, name="ids")
    ids = [int(i) for i in ids]
    return ids[: ids.index(tokenizer.eos_id)] if tokenizer.eos_id in ids else ids


def _parse(text: str, path: pathlib.Path):
    """A `tokenizers.Tokenizer` from its JSON text, read from `path`."""
    tokenizers = _import_tokenizers()
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # `tokenizers` raises a bare Exception for any malformed JSON
        raise BadValue(f"{path} is not a Hugging Face tokenizer file ({e})") from None


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise MissingPackage(
            "the BPE and Hugging Face tokenizers need the 'tokenizers' package: "
            "pip install 'jaxformer[bpe]'"
        ) from None
    return tokenizers


def _byte_label(byte_id: int) -> str:
    c = chr(byte_id - len(SPECIALS))
    if c == " ":
        return "␣"
    return c if c.isprintable() and c.isascii() else f"\\x{ord(c):02x}"
