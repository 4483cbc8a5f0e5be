"""Token shards in llm.c's format, memory-mapped: a header of 256 int32 (magic, version,
token count), then the tokens: magic 20240520 version 1, uint16 (what llm.c's and
modded-nanogpt's GPT-2 scripts write and read), or 20240801 version 7, uint32 (llm.c's
Llama 3 format), which `write_shard` uses for vocabularies over 65,536 ids.

`ShardData` trains a DecoderLM on shards. A document starts at each end-of-text token
(written before every document) and at each shard's start, and runs through the next
end-of-text token: predicting it ends the document, and every token but a shard's first is
a target once. At start each shard is checked (header, size, every id below the
vocabulary, a chunk at a time) and its documents laid out in rows (`jaxformer.data.
packing`); each epoch visits the rows in a seeded order, a batch reading only its rows."""

from __future__ import annotations

import glob
import os
import pathlib

import numpy as np

from jaxformer.checks import BadValue, MissingFile, as_given, check_bool, check_int
from jaxformer.data.datasets import DocumentData
from jaxformer.data.packing import Packed
from jaxformer.data.tokenizers import FILENAME, IdsTokenizer, Tokenizer, load_tokenizer

HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
FORMATS = {20240520: (1, np.dtype("<u2")), 20240801: (7, np.dtype("<u4"))}  # magic: version, ids
GPT2_EOT = 50256  # GPT-2's <|endoftext|>, which llm.c's and modded-nanogpt's shards hold
CHUNK = 1 << 24  # tokens checked at a time


def write_shard(path: str | pathlib.Path, tokens, vocab_size: int) -> None:
    """`tokens` as a shard at `path` (uint16 for a vocabulary of up to 65,536 ids, else
    uint32), written to a temporary name and renamed: a crash leaves no partial shard."""
    magic = 20240520 if vocab_size <= 1 << 16 else 20240801
    version, dtype = FORMATS[magic]
    tokens = np.asarray(tokens)
    if len(tokens) >= 1 << 31:
        raise BadValue(f"{path}: a shard holds fewer than 2**31 tokens, got {len(tokens):,}")
    header = np.zeros(HEADER_INTS, "<i4")
    header[:3] = magic, version, len(tokens)
    path = pathlib.Path(path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype(dtype).tobytes())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def read_shard(path: str | pathlib.Path) -> np.memmap:
    """The tokens of a shard, memory-mapped, after checking its header against its size."""
    size = pathlib.Path(path).stat().st_size
    if size < HEADER_BYTES:
        raise BadValue(
            f"{path}: {size} bytes, shorter than a token shard's {HEADER_BYTES}-byte header"
        )
    magic, version, count = (int(x) for x in np.fromfile(path, "<i4", count=3))
    if magic not in FORMATS:
        raise BadValue(
            f"{path}: not a token shard: magic number {magic}, expected 20240520 (llm.c's "
            "uint16 shards) or 20240801 (its uint32 ones)"
        )
    expected, dtype = FORMATS[magic]
    if version != expected:
        raise BadValue(f"{path}: version {version} of magic number {magic}, expected {expected}")
    if count < 1 or size != HEADER_BYTES + count * dtype.itemsize:
        raise BadValue(
            f"{path}: its header says {count:,} tokens ({HEADER_BYTES + count * dtype.itemsize:,} "
            f"bytes) but the file has {size:,} bytes: truncated, or not a token shard"
        )
    return np.memmap(path, dtype, mode="r", offset=HEADER_BYTES, shape=(count,))


def shard_paths(pattern: str, option: str) -> list[str]:
    """The files a glob names, sorted; none is an error naming the run `option` it came from."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise MissingFile(f"{as_given(option)} {pattern!r} matches no file")
    return paths


def shard_tokenizer(pattern: str, vocab_size: int | None, eot_id: int | None) -> Tokenizer:
    """The tokenizer.json beside the first shard of `pattern` (`jaxformer prepare`'s), else
    ids only: vocab_size ids, eot_id (default GPT-2's 50256) ending text."""
    beside = pathlib.Path(shard_paths(pattern, "data_shards")[0]).parent / FILENAME
    if beside.is_file():
        return load_tokenizer(beside)
    eot = GPT2_EOT if eot_id is None else eot_id
    if vocab_size is None or eot >= vocab_size:
        raise BadValue(
            f"with no {FILENAME} beside the {as_given('data_shards')}, the vocabulary is the "
            f"model's {as_given('vocab_size')} ({vocab_size}) and the end-of-text id "
            f"{as_given('eot_id')} ({eot}, by default GPT-2's) must lie in it: give both "
            f"(GPT-2's shards: {as_given('vocab_size', 50257)})"
        )
    return IdsTokenizer(vocab_size, eot)


class TokenShards:
    """The shards a glob names as one stream: memory-mapped, each checked (header, size,
    every id below vocab_size), its documents' `starts` and `lengths` found."""

    def __init__(self, pattern: str, option: str, vocab_size: int, eot_id: int):
        self.paths = shard_paths(pattern, option)
        self.maps = [read_shard(path) for path in self.paths]
        sizes = np.array([len(m) for m in self.maps], np.int64)
        self.offsets, self.tokens = np.cumsum(sizes) - sizes, int(sizes.sum())
        starts, lengths = [], []
        for path, tokens, offset in zip(self.paths, self.maps, self.offsets, strict=True):
            first = _documents(tokens, path, vocab_size, eot_id)
            starts.append(first + offset)
            lengths.append(np.append(first[1:] + 1, len(tokens)) - first)  # through the next EOT
        self.starts, self.lengths = np.concatenate(starts), np.concatenate(lengths)

    def read(self, positions: np.ndarray) -> np.ndarray:
        """The tokens at stream `positions`."""
        if len(self.maps) == 1:
            return self.maps[0][positions]
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        out = np.empty(len(positions), np.int64)
        for i in np.unique(shard):
            here = shard == i
            out[here] = self.maps[i][positions[here] - self.offsets[i]]
        return out


def _documents(tokens: np.memmap, path: str, vocab_size: int, eot_id: int) -> np.ndarray:
    """Where the documents of a shard start (0 and each end-of-text token), after checking
    each id against the vocabulary, a chunk at a time."""
    found = [np.zeros(1, np.int64)]
    for lo in range(0, len(tokens), CHUNK):
        chunk = np.asarray(tokens[lo : lo + CHUNK])
        if int(chunk.max()) >= vocab_size:
            at = lo + int(np.argmax(chunk >= vocab_size))
            raise BadValue(
                f"{path}: token id {tokens[at]} at offset {at:,} (tokens after the header) is "
                f"outside the vocabulary [0, {vocab_size})"
            )
        found.append(np.flatnonzero(chunk == eot_id) + lo)
    return np.unique(np.concatenate(found))


class ShardData(DocumentData):
    """Token shards for a `DecoderLM` (see the module doc): the `train` and `val` globs,
    with `tokenizer`'s vocabulary and end-of-text id (or `eot_id`); its held-out rows are
    the first `dev_size` rows of the validation shards."""

    def __init__(
        self,
        train: str,
        val: str | None,
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        seed: int = 0,
        pack: bool = True,
        eot_id: int | None = None,
        dev_size: int = 1000,
    ):
        check_int("seq_len", seq_len)
        check_int("dev_size", dev_size)
        check_bool("pack", pack)
        if val is None:
            raise BadValue(
                f"{as_given('data_shards')} needs {as_given('val_shards')}, a glob of held-out "
                "shards (DIR/val_*.bin)"
            )
        eot = tokenizer.eos_id if eot_id is None else eot_id
        named = ((train, "data_shards"), (val, "val_shards"))
        sets = [TokenShards(p, option, tokenizer.vocab_size, eot) for p, option in named]
        rows = [Packed(s.read, s.starts, s.lengths, seq_len + 1, pack=pack) for s in sets]
        for (pattern, option), laid in zip(named, rows, strict=True):
            if not laid.rows:
                raise BadValue(
                    f"{as_given(option)} {pattern!r} holds no document of two tokens or more"
                )
        self._lay_out(tokenizer, *rows, seq_len=seq_len, seed=seed, eval_rows=dev_size)
        train, val = rows
        self.counts = dict(train_tokens=sets[0].tokens, train_documents=train.documents)
        self.counts |= dict(train_rows=train.rows, val_rows=val.rows)
        self.description = (
            f"token shards: {sets[0].tokens:,} tokens in {len(sets[0].paths)} file(s), "
            f"{train.documents:,} documents in {train.rows:,} rows of {seq_len + 1} tokens, "
            f"{train.efficiency:.1%} real ({'packed' if pack else 'one piece a row'}); held "
            f"out: {val.rows:,} rows, {self._eval_rows:,} evaluated"
        )
