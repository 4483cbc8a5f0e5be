"""Datasets that produce training batches (dicts of NumPy arrays, see
`jaxformer.train.steps`) as a pure function of (seed, batch index), so that a resumed run
continues with exactly the batches it would have seen.

    TaskData   a synthetic task (jaxformer.data.tasks), sequence to sequence
    PairData   translation pairs, with length bucketing; TsvData: from a file of
               `source<TAB>target` lines
    DocumentData  documents for language modelling in rows of fixed length (packed or
               one a row); TextData: from a text file; ShardData (jaxformer.data.shards):
               from token shards

Each implements `TrainingData`.
"""

from __future__ import annotations

import collections
import copy
import pathlib
import random
import zlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Protocol

import numpy as np

from jaxformer.checks import BadValue, InputError, MissingFile, as_given, check_bool, check_int
from jaxformer.data import tasks as tasks_lib
from jaxformer.data.packing import Packed
from jaxformer.data.tokenizers import Tokenizer, check_tokens

Batch = dict[str, np.ndarray]

# The held-out pairs a run evaluates are drawn with this seed, whatever the run's: every
# seed of a configuration, and every variant of a sweep, is scored on the same sentences,
# which the sweep's seed-paired statistics pair (its crossed bootstrap needs them shared).
DEV_SEED = 0


class TrainingData(Protocol):
    """What the training loop and evaluation read of a dataset; a new data source subclasses
    it for the defaults of `description` and `counts`.

        model_kind   the model class it trains: "Transformer" or "DecoderLM"
        metrics      held-out metrics beyond the loss (`train.evaluate.METRICS`); () for none
        max_len      the longest sequence a batch holds (the model's max_len must reach it)
        tgt_len      the most target positions T a batch holds; predictions stop there
        dev_pairs    the held-out (source, target) pairs decoded; empty for an LM
        test_pairs   the pairs only the final model is scored on (`RunConfig.eval.final_test`)
        description  what the data kept and dropped, said as a run starts ("": nothing)
        counts       the numbers behind it, summary.json's `data_counts` ({}: none)

    A batch is a dict of NumPy arrays: `src`, `src_valid` [B, S] (encoder-decoder only),
    `tgt_in`, `tgt_out`, `tgt_valid` [B, T], and an LM's `segment_ids`, `positions` [B, T];
    tokens int32, `*_valid` bool (see `jaxformer.train.steps`)."""

    model_kind: str
    metrics: tuple[str, ...]
    max_len: int
    tgt_len: int
    dev_pairs: list[tuple[str, str]]
    test_pairs: list[tuple[str, str]]
    description: str = ""
    counts: Mapping[str, int] = MappingProxyType({})

    def train_batch(self, index: int, batch_size: int) -> Batch:
        """Training batch `index` of `batch_size` rows: a pure function of (seed, index), so
        a resumed run sees exactly the batches it would have seen."""
        ...

    def eval_batches(self, batch_size: int) -> Iterator[Batch]:
        """The held-out batches of `batch_size` rows, the last filled with all-padding
        rows (no loss is taken on them)."""
        ...

    def reseeded(self, seed: int) -> TrainingData:
        """This data for another seed: the batches that building it with `seed` gives (the
        held-out pairs do not depend on the seed: DEV_SEED), without reading or
        tokenizing anything again (the seeds of `train --seeds` share one build)."""
        other = copy.copy(self)
        other.seed = seed
        return other

    def for_process(self, rows) -> TrainingData:
        """This data for a process that holds only rows `rows` of each training batch (of
        several processes): a data source may leave the others padding, unread, since the
        placement transfers only a process's own rows. None or by default: all rows."""
        return self


def encode_pairs(
    pairs: list[tuple[str, str]], tokenizer: Tokenizer, src_len: int, tgt_len: int
) -> Batch:
    """Source tokens + EOS, and the target as decoder input (BOS + target) and output
    (target + EOS), padded to src_len / tgt_len, with the tokenizer's special ids. A None
    pair is an all-padding row."""
    ids = [None if p is None else (tokenizer.encode(p[0]), tokenizer.encode(p[1])) for p in pairs]
    _check_pair_ids(ids, tokenizer)
    for i, p in enumerate(ids):
        if p is not None and (len(p[0]) + 1 > src_len or len(p[1]) + 1 > tgt_len):
            lengths = (len(p[0]) + 1, len(p[1]) + 1)
            raise BadValue(
                f"example {i} needs lengths {lengths} > ({src_len}, {tgt_len}): {pairs[i][0]!r}"
            )
    return _pack_ids(ids, tokenizer, src_len, tgt_len)


class TaskData(TrainingData):
    """A synthetic task: fixed padded lengths, so one compiled step serves every batch. Its
    dev pairs are `dev_size` held-out examples drawn with DEV_SEED, the same for every
    seed; the seed draws the training examples."""

    model_kind = "Transformer"
    metrics = ("exact_match",)

    def __init__(
        self,
        task: str,
        tokenizer: Tokenizer,
        *,
        seed: int = 0,
        dev_size: int = 1000,
        vocab_size: int | None = None,
    ):
        _check_vocab(tokenizer, vocab_size)
        self.task = tasks_lib.get_task(task)
        self.tokenizer = tokenizer
        self.seed = seed
        # Byte tokenizer: one token per ASCII character; +1 for EOS (and BOS on tgt_in).
        self.src_len = _round_up(self.task.max_source_chars + 1, 8)
        self.tgt_len = _round_up(self.task.max_target_chars + 1, 8)
        self.dev_pairs = tasks_lib.dev_examples(self.task, DEV_SEED, dev_size)
        self.test_pairs: list[tuple[str, str]] = []

    @property
    def max_len(self) -> int:
        return max(self.src_len, self.tgt_len)

    def train_batch(self, index: int, batch_size: int) -> Batch:
        check_int("batch_size", batch_size)
        pairs = tasks_lib.train_examples(self.task, self.seed, index, batch_size)
        return encode_pairs(pairs, self.tokenizer, self.src_len, self.tgt_len)

    def eval_batches(self, batch_size: int):
        check_int("batch_size", batch_size)
        for i in range(0, len(self.dev_pairs), batch_size):
            pairs = _fill(self.dev_pairs[i : i + batch_size], batch_size)
            yield encode_pairs(pairs, self.tokenizer, self.src_len, self.tgt_len)


class PairData(TrainingData):
    """Translation pairs: epoch-wise shuffles of the training pairs; within a pool of 50
    batches, pairs of similar length (the longer side) are batched together, padded to a
    multiple of `pad_multiple` tokens, and the batches shuffled (the same for every seed
    with `shared_lengths`). With `batch_tokens` a batch holds the pairs of one padded length
    that fit that many tokens per side. `train` and `dev` hold (source, target, (source ids,
    target ids)). `dev_pairs` are `dev_size` dev pairs drawn with DEV_SEED, stratified by
    `dev_groups` so any prefix is a stratified sample. `test` is scored by the final model."""

    model_kind = "Transformer"
    metrics = ("exact_match", "bleu", "chrf")

    def __init__(
        self,
        train: list[tuple[str, str, tuple[list[int], list[int]]]],
        dev: list[tuple[str, str, tuple[list[int], list[int]]]],
        tokenizer: Tokenizer,
        *,
        max_len: int,
        seed: int = 0,
        dev_size: int = 1000,
        pad_multiple: int = 16,
        shared_lengths: bool = False,
        batch_tokens: int | None = None,
        test: list[tuple[str, str]] | None = None,
        dev_groups: list | None = None,
    ):
        check_int("pad_multiple", pad_multiple)
        if batch_tokens is not None:
            check_int("batch_tokens", batch_tokens)
        self.pad_multiple, self.shared_lengths = pad_multiple, shared_lengths
        self.batch_tokens = batch_tokens
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_len = max_len
        self.src_len = self.tgt_len = max_len  # for decoding held-out sources
        self._train = train
        order = stratified_order(dev_groups or [0] * len(dev), DEV_SEED)[:dev_size]
        self.dev_pairs = [dev[i][:2] for i in order]
        self._dev_ids = [dev[i][2] for i in order]
        self.test_pairs = list(test or [])
        self._epoch_cache: tuple[int, int, list[list[int]]] | None = None
        self._token_batches: list[list[int | None]] | None = None

    def reseeded(self, seed: int) -> PairData:
        other = copy.copy(self)
        other.seed, other._epoch_cache, other._token_batches = seed, None, None
        return other

    def batches_per_epoch(self, batch_size: int) -> int:
        if self.batch_tokens:
            return len(self._by_tokens())
        return _batches_per_epoch(len(self._train), batch_size, "training pairs")

    def _epoch(self, epoch: int, batch_size: int) -> list[list[int]]:
        if self._epoch_cache and self._epoch_cache[:2] == (epoch, batch_size):
            return self._epoch_cache[2]
        batches = list(self._by_tokens()) if self.batch_tokens else self._pooled(epoch, batch_size)
        lengths = "shared" if self.shared_lengths else self.seed  # one (pool, rank) per step
        random.Random(f"tsv:{lengths}:{epoch}:order").shuffle(batches)
        self._epoch_cache = (epoch, batch_size, batches)
        return batches

    def _pooled(self, epoch: int, batch_size: int) -> list[list[int]]:
        """Epoch `epoch`'s batches of batch_size pairs, of similar lengths within a pool."""
        order = list(range(len(self._train)))
        random.Random(f"tsv:{self.seed}:{epoch}").shuffle(order)
        n = self.batches_per_epoch(batch_size) * batch_size
        order, pool = order[:n], 50 * batch_size
        batches = []
        for start in range(0, n, pool):
            chunk = sorted(order[start : start + pool], key=self._length)
            batches += [chunk[j : j + batch_size] for j in range(0, len(chunk), batch_size)]
        return batches

    def _by_tokens(self) -> list[list[int | None]]:
        """The training pairs in batches of at most batch_tokens tokens a side: by padded
        length (ties in a seeded order), batch_tokens // length rows each, a length's last
        batch filled with None (all-padding rows); a pair longer than batch_tokens alone."""
        if self._token_batches is None:
            rng = random.Random(f"tsv:{self.seed}:tokens")
            order, by_width = list(range(len(self._train))), collections.defaultdict(list)
            rng.shuffle(order)
            for i in order:
                width = min(_round_up(self._length(i) + 1, self.pad_multiple), self.max_len)
                by_width[width].append(i)
            self._token_batches = []
            for width in sorted(by_width):
                pairs, rows = by_width[width], max(1, self.batch_tokens // width)
                for j in range(0, len(pairs), rows):
                    self._token_batches.append(_fill(pairs[j : j + rows], rows))
        return self._token_batches

    def _length(self, i: int) -> int:
        """The batching length of training pair `i`: its longer side, in tokens."""
        source_ids, target_ids = self._train[i][2]
        return max(len(source_ids), len(target_ids))

    def train_batch(self, index: int, batch_size: int) -> Batch:
        check_int("batch_size", batch_size)
        epoch, j = divmod(index, self.batches_per_epoch(batch_size))
        batch = self._epoch(epoch, batch_size)[j]
        return self._encode([None if i is None else self._train[i][2] for i in batch])

    def eval_batches(self, batch_size: int):
        check_int("batch_size", batch_size)
        for i in range(0, len(self._dev_ids), batch_size):
            yield self._encode(_fill(self._dev_ids[i : i + batch_size], batch_size))

    def _encode(self, ids: list[tuple[list[int], list[int]]]) -> Batch:
        real = [p for p in ids if p is not None]
        src_len = min(_round_up(max(len(s) + 1 for s, _ in real), self.pad_multiple), self.max_len)
        tgt_len = min(_round_up(max(len(t) + 1 for _, t in real), self.pad_multiple), self.max_len)
        return _pack_ids(ids, self.tokenizer, src_len, tgt_len)


def stratified_order(groups: list, seed: int) -> list[int]:
    """The indices of `groups` (one label per item) in a seeded random order whose every
    prefix is a stratified sample: each group shuffled, its k-th item of n placed at
    (k + u) / n with u uniform in [0, 1), and all sorted by that place."""
    rng = random.Random(f"eval:{seed}")
    members = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    keyed = []
    for g in sorted(members, key=str):
        items, offset = members[g], rng.random()
        rng.shuffle(items)
        keyed += [((k + offset) / len(items), i) for k, i in enumerate(items)]
    return [i for _, i in sorted(keyed)]


def pair_ids(
    tokenizer: Tokenizer, src: str, tgt: str, where: str, max_len: int
) -> tuple[list[int], list[int]] | None:
    """The (source, target) ids of a pair, or None when either with its EOS is longer
    than max_len. `where` names the pair in errors."""
    ids = (
        _token_ids(tokenizer, src, f"{where} source"),
        _token_ids(tokenizer, tgt, f"{where} target"),
    )
    return None if max(len(ids[0]), len(ids[1])) + 1 > max_len else ids


class TsvData(PairData):
    """`source<TAB>target` lines. One pair in ten (by a hash of the source) is held out;
    pairs longer than max_len tokens are skipped (and reported). `options` are PairData's
    (seed, dev_size, pad_multiple, shared_lengths, batch_tokens)."""

    def __init__(
        self,
        path: str | pathlib.Path,
        tokenizer: Tokenizer,
        *,
        max_len: int,
        vocab_size: int | None = None,
        **options,
    ):
        check_int("max_len", max_len)
        _check_vocab(tokenizer, vocab_size)
        lines = read_text_lines(path)
        train, dev, too_long = [], [], []
        for number, line in lines:
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise BadValue(
                    f"{path}:{number}: expected 'source<TAB>target' with both non-empty, "
                    f"got {len(fields)} field(s): {line[:60]!r}"
                )
            src, tgt = fields
            ids = pair_ids(tokenizer, src, tgt, f"{path}:{number}", max_len)
            if ids is None:
                too_long.append(number)
                continue
            (dev if zlib.crc32(src.encode()) % 10 == 0 else train).append((src, tgt, ids))
        if too_long:
            shown = ", ".join(map(str, too_long[:10])) + (" ..." if len(too_long) > 10 else "")
            print(
                f"{path}: skipped {len(too_long)} pair(s) longer than max_len={max_len}: lines {shown}"
            )
        if not train:
            raise BadValue(f"{path}: no training pairs (need non-empty source<TAB>target lines)")
        if not dev:  # a tiny file: hold out its last pair
            dev.append(train.pop())
        super().__init__(train, dev, tokenizer, max_len=max_len, **options)


class DocumentData(TrainingData):
    """Documents (strings) for a `DecoderLM`, each ending with EOS, in rows of seq_len + 1
    tokens (`jaxformer.data.packing`): with `pack`, whole documents best-fit into rows, with
    segment ids and positions per document; without, one per row, right-padded. A longer
    document is split at row boundaries; no loss is taken on padding or across documents.
    Each epoch visits the training rows in a seeded order."""

    model_kind = "DecoderLM"
    metrics = ()

    def __init__(
        self,
        train: list[str],
        test: list[str],
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        seed: int = 0,
        pack: bool = True,
    ):
        check_int("seq_len", seq_len)
        check_bool("pack", pack)
        rows = [self._packed(docs, tokenizer, seq_len + 1, pack) for docs in (train, test)]
        self._lay_out(tokenizer, *rows, seq_len=seq_len, seed=seed)

    @staticmethod
    def _packed(docs: list[str], tokenizer: Tokenizer, row_len: int, pack: bool) -> Packed:
        ids = [
            _token_ids(tokenizer, doc, f"document {d}") + [tokenizer.eos_id]
            for d, doc in enumerate(docs)
        ]
        lengths = np.array([len(i) for i in ids], np.int64)
        tokens = np.concatenate([np.asarray(i, np.int32) for i in ids] or [np.zeros(0, np.int32)])
        return Packed(tokens.__getitem__, np.cumsum(lengths) - lengths, lengths, row_len, pack=pack)

    def _lay_out(
        self,
        tokenizer: Tokenizer,
        train: Packed,
        test: Packed,
        *,
        seq_len: int,
        seed: int,
        eval_rows: int | None = None,
    ) -> None:
        self.tokenizer, self.seed, self.seq_len = tokenizer, seed, seq_len
        self.max_len = self.tgt_len = seq_len
        self._train, self._test = train, test
        self._eval_rows = test.rows if eval_rows is None else min(eval_rows, test.rows)
        self._only: np.ndarray | None = None  # the batch rows this process fills (None: all)
        self._order: tuple[int, int, np.ndarray] | None = None  # (seed, epoch, row order)
        self.dev_pairs: list[tuple[str, str]] = []  # no exact-match evaluation for an LM
        self.test_pairs: list[tuple[str, str]] = []

    def for_process(self, rows: np.ndarray | None) -> DocumentData:
        other = copy.copy(self)
        other._only = None if rows is None else np.asarray(rows, np.int64)
        return other

    def batches_per_epoch(self, batch_size: int) -> int:
        what = f"training rows of {self.seq_len + 1} tokens"
        return _batches_per_epoch(self._train.rows, batch_size, what)

    def train_batch(self, index: int, batch_size: int) -> Batch:
        check_int("batch_size", batch_size)
        epoch, j = divmod(index, self.batches_per_epoch(batch_size))
        if self._order is None or self._order[:2] != (self.seed, epoch):
            entropy = [abs(self.seed), int(self.seed < 0), epoch]
            rng = np.random.default_rng(np.random.SeedSequence(entropy))
            self._order = (self.seed, epoch, rng.permutation(self._train.rows))
        rows = self._order[2][j * batch_size : (j + 1) * batch_size]
        if self._only is not None:  # rows other processes hold stay padding, never read
            rows = np.where(np.isin(np.arange(batch_size), self._only), rows, -1)
        return self._train.batch(rows, self.tokenizer.pad_id)

    def eval_batches(self, batch_size: int):
        check_int("batch_size", batch_size)
        for i in range(0, self._eval_rows, batch_size):
            rows = np.arange(i, i + batch_size)
            rows = np.where(rows < self._eval_rows, rows, -1)  # past the held-out rows: padding
            yield self._test.batch(rows, self.tokenizer.pad_id)


class TextData(DocumentData):
    """Plain text for a `DecoderLM`: its documents (`text_documents`), one in ten held out
    (`held_out`). `options` are DocumentData's (seed, pack)."""

    def __init__(
        self,
        path: str | pathlib.Path,
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        vocab_size: int | None = None,
        **options,
    ):
        check_int("seq_len", seq_len)
        _check_vocab(tokenizer, vocab_size)
        docs = text_documents([line for _, line in read_text_lines(path)])
        if len(docs) < 2:
            raise BadValue(
                f"{path}: needs at least two documents (separated by blank lines, or one per "
                "line in a text without blank lines), to hold one out"
            )
        train, test = held_out(docs)
        super().__init__(train, test, tokenizer, seq_len=seq_len, **options)


def text_documents(lines: list[str]) -> list[str]:
    """The documents of a text's lines: its blocks of non-blank lines (paragraphs), or
    every non-blank line when there is one block."""
    docs, current = [], []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line)
        elif current:
            docs.append("\n".join(current))
            current = []
    return docs if len(docs) > 1 else [line for line in lines if line.strip()]


def held_out(docs: list[str]) -> tuple[list[str], list[str]]:
    """(train, held out) of at least two documents: one in ten held out, by a hash of its
    text (so a document stays on its side whatever else the text holds); neither empty."""
    train = [d for d in docs if zlib.crc32(d.encode()) % 10]
    test = [d for d in docs if not zlib.crc32(d.encode()) % 10]
    if not test:
        test.append(train.pop())
    if not train:
        train.append(test.pop())
    return train, test


def pad_rows(rows: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows right-padded with pad_id: tokens [B, width] int32 and valid [B, width],
    True on each row's own tokens. The mask comes from the lengths, never from comparing
    with pad_id, which may be a real token (GPT-2 pads with its EOS)."""
    lengths = np.array([len(row) for row in rows], int)
    if lengths.max(initial=0) > width:
        raise BadValue(f"a row of {lengths.max()} tokens does not fit width={width}")
    valid = np.arange(width) < lengths[:, None]
    tokens = np.full(valid.shape, pad_id, np.int32)
    tokens[valid] = np.concatenate([np.asarray(row, np.int32) for row in rows])
    return tokens, valid


def _pack_ids(
    ids: list[tuple[list[int], list[int]] | None], tokenizer: Tokenizer, src_len: int, tgt_len: int
) -> Batch:
    """The batch of (source ids, target ids) pairs; None is an all-padding row."""
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    src, src_valid = pad_rows([[] if p is None else [*p[0], eos] for p in ids], src_len, pad)
    tgt_in, _ = pad_rows([[] if p is None else [bos, *p[1]] for p in ids], tgt_len, pad)
    tgt_out, tgt_valid = pad_rows([[] if p is None else [*p[1], eos] for p in ids], tgt_len, pad)
    return dict(src=src, src_valid=src_valid, tgt_in=tgt_in, tgt_out=tgt_out, tgt_valid=tgt_valid)


def read_text_lines(path: str | pathlib.Path) -> list[tuple[int, str]]:
    """(line number, line) of a UTF-8 text file; clear errors for missing, empty, binary
    or non-UTF-8 files."""
    path = pathlib.Path(path)
    if not path.exists():
        raise MissingFile(f"{path}: no such file")
    if not path.is_file():
        raise BadValue(f"{path}: not a regular file")
    data = path.read_bytes()
    if not data.strip():
        raise BadValue(f"{path}: the file is empty")
    if b"\x00" in data[:8192]:
        raise BadValue(
            f"{path}: looks like a binary file (contains NUL bytes), expected UTF-8 text"
        )
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            out.append((number, raw.decode("utf-8").rstrip("\r")))
        except UnicodeDecodeError as e:
            raise BadValue(
                f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})"
            ) from None
    return out


def _check_pair_ids(ids: list[tuple[list[int], list[int]] | None], tokenizer: Tokenizer) -> None:
    """Every id of encode_pairs' `ids` in the tokenizer's vocabulary: one check of the whole
    batch (a batch is built every step), then, if it fails, the first example and side at
    fault named."""
    flat = [t for pair in ids if pair is not None for row in pair for t in row]
    try:
        check_tokens(flat, tokenizer.vocab_size)
    except InputError:
        for i, pair in enumerate(ids):
            for side, row in zip(("source", "target"), pair or (), strict=False):
                name = f"the tokenizer's ids for example {i}'s {side}"
                check_tokens(row, tokenizer.vocab_size, name=name)
        raise


def _token_ids(tokenizer: Tokenizer, text: str, where: str) -> list[int]:
    """tokenizer.encode(text), checked to lie in the tokenizer's vocabulary."""
    ids = tokenizer.encode(text)
    check_tokens(ids, tokenizer.vocab_size, name=f"the tokenizer's ids for {where}")
    return ids


def _check_vocab(tokenizer: Tokenizer, vocab_size: int | None) -> None:
    """The tokenizer's ids must fit a model with `vocab_size` (when given)."""
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise BadValue(
            f"the tokenizer has {tokenizer.vocab_size} ids but {as_given('vocab_size', vocab_size)}: "
            "its ids would fall outside the model's embedding table"
        )


def _batches_per_epoch(rows: int, batch_size: int, what: str) -> int:
    if rows < batch_size:
        raise BadValue(
            f"batch size {batch_size} is larger than the {rows} {what}; "
            f"give a smaller {as_given('batch_size')}"
        )
    return rows // batch_size


def _fill(items: list, n: int) -> list:
    """Pad a short last eval batch to n items with None (all-padding rows, zero weight)."""
    return items + [None] * (n - len(items))


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k
