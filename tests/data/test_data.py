import collections
import datetime

import numpy as np
import pytest

from jaxformer import data
from jaxformer.data import datasets, tasks

TOK = data.ByteTokenizer()


def test_every_written_date_determines_one_date():
    seen: dict[str, datetime.date] = {}
    d = tasks.FIRST_DATE
    while d <= tasks.LAST_DATE:
        for name, fmt in tasks.DATE_FORMATS.items():
            s = fmt(d)
            assert seen.setdefault(s, d) == d, f"{s!r} ({name}) is {d} and {seen[s]}"
            assert len(s) <= tasks.get_task("dates").max_source_chars
        d += datetime.timedelta(days=1)
    assert len(tasks.DATE_FORMATS) >= 12


def test_date_examples():
    fmt = tasks.DATE_FORMATS
    d = datetime.date(2001, 3, 3)
    assert fmt["weekday, D Month YYYY"](d) == "Saturday, 3 March 2001"
    assert fmt["Dth of Month YYYY"](d) == "3rd of March 2001"
    assert fmt["DD/MM/YY"](d) == "03/03/01"
    assert (
        fmt["the Dth of Month, YYYY"](datetime.date(1999, 12, 22)) == "the 22nd of December, 1999"
    )
    assert fmt["Month Dth, YYYY"](datetime.date(2011, 4, 11)) == "April 11th, 2011"


@pytest.mark.parametrize("name", tasks.TASKS)
def test_tasks_are_deterministic_and_splits_disjoint(name):
    task = tasks.get_task(name)
    a = tasks.train_examples(task, seed=3, index=7, n=50)
    assert a == tasks.train_examples(task, seed=3, index=7, n=50)
    assert a != tasks.train_examples(task, seed=3, index=8, n=50)
    test = tasks.dev_examples(task, seed=3, n=100)
    assert len({s for s, _ in test}) == 100
    train_sources = {s for i in range(20) for s, _ in tasks.train_examples(task, 3, i, 50)}
    assert not train_sources & {s for s, _ in test}
    src, tgt = a[0]
    if name == "reverse":
        assert tgt == src[::-1]
    if name == "sort":
        assert tgt == "".join(sorted(src))
    if name == "addition":
        x, y = src.split("+")
        assert int(tgt) == int(x) + int(y)


def test_dates_test_split_holds_out_whole_dates():
    task = tasks.get_task("dates")
    test_dates = {t for _, t in tasks.dev_examples(task, 0, 300)}
    train_dates = {t for i in range(30) for _, t in tasks.train_examples(task, 0, i, 64)}
    assert not test_dates & train_dates


def test_byte_tokenizer_round_trip(tmp_path):
    text = "Größe 3/3/01 ✓"
    ids = TOK.encode(text)
    assert min(ids) >= 3 and TOK.decode(ids + [2, 50]) == text
    TOK.save(tmp_path)
    assert isinstance(data.load_tokenizer(tmp_path), data.ByteTokenizer)
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        data.load_tokenizer(tmp_path / "missing")


def test_encode_pairs_shifts_the_target():
    b = data.encode_pairs([("ab", "xy"), None], TOK, 4, 4)
    x, y = TOK.encode("xy")
    np.testing.assert_array_equal(b["tgt_in"][0], [1, x, y, 0])
    np.testing.assert_array_equal(b["tgt_out"][0], [x, y, 2, 0])
    np.testing.assert_array_equal(b["src_valid"][0], [True, True, True, False])
    assert not b["tgt_valid"][1].any()


def test_tsv_data(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"source {i}\ttarget {i}\n" for i in range(200)))
    d = data.TsvData(path, TOK, max_len=64, seed=0)
    b = d.train_batch(0, 8)
    assert b["src"].shape[0] == 8 and b["src"].shape[1] % 16 == 0
    assert d.train_batch(3, 8)["src"].tolist() == d.train_batch(3, 8)["src"].tolist()
    assert 0 < len(d.dev_pairs) < 200


def test_batches_group_pairs_by_their_longer_side(tmp_path):
    """Targets about as long as their sources, +-10: batching by the longer side pads
    both sides little (by the source alone, each batch's targets spread by the noise)."""
    rng = np.random.default_rng(0)
    sources = rng.integers(5, 50, 800)
    targets = np.clip(sources + rng.integers(-10, 11, 800), 1, 60)
    path = tmp_path / "pairs.tsv"
    path.write_text(
        "".join(f"{'s' * a}\t{'t' * b}\n" for a, b in zip(sources, targets, strict=True))
    )
    d = data.TsvData(path, TOK, max_len=64, seed=0, pad_multiple=1)
    batches = [d.train_batch(i, 16) for i in range(d.batches_per_epoch(16))]
    real = sum(int(b["src_valid"].sum() + b["tgt_valid"].sum()) for b in batches)
    padded = sum(b["src"].size + b["tgt_in"].size for b in batches)
    assert 1 - real / padded < 0.115  # 0.091; sorting by the source alone: 0.139
    for b in batches:  # each row's longer side: close within a batch (by the source: 12)
        longer = np.maximum(b["src_valid"].sum(1), b["tgt_valid"].sum(1))
        assert longer.max() - longer.min() <= 6


def test_pad_multiple_sets_the_padded_lengths(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"source {i}\ttarget {'x' * (i % 40)}\n" for i in range(200)))
    wide = data.TsvData(path, TOK, max_len=96, seed=0, pad_multiple=64)
    fine = data.TsvData(path, TOK, max_len=96, seed=0, pad_multiple=8)
    lengths = {wide.train_batch(i, 8)["tgt_in"].shape[1] for i in range(20)}
    assert lengths <= {64, 96}  # multiples of 64, capped at max_len
    b_wide, b_fine = wide.train_batch(0, 8), fine.train_batch(0, 8)
    assert (
        b_fine["tgt_in"].shape[1] % 8 == 0
        and b_fine["tgt_in"].shape[1] <= b_wide["tgt_in"].shape[1]
    )
    n = b_fine["tgt_in"].shape[1]  # the same pairs: only the padding differs
    np.testing.assert_array_equal(b_wide["tgt_in"][:, :n], b_fine["tgt_in"])
    assert not b_wide["tgt_valid"][:, n:].any()
    with pytest.raises(ValueError, match="pad_multiple must be >= 1"):
        data.TsvData(path, TOK, max_len=96, pad_multiple=0)


def test_shared_lengths_give_every_seed_alike_lengths_and_its_own_pairs(tmp_path):
    """With shared_lengths, step i of each seed draws a batch of the same length rank in its
    pool: the seeds' batches stacked in one program pad far less than with each seed's own
    order of lengths, and each seed still trains on pairs of its own."""
    rng = np.random.default_rng(1)
    path = tmp_path / "pairs.tsv"
    lengths = rng.integers(2, 90, 3000)
    path.write_text("".join(f"{i}{'s' * n}\t{'t' * n}\n" for i, n in enumerate(lengths)))

    def lengths_and_pairs(shared: bool):
        seeds = [
            data.TsvData(path, TOK, max_len=96, seed=s, pad_multiple=8, shared_lengths=shared)
            for s in range(4)
        ]
        batches = [[d.train_batch(i, 16) for d in seeds] for i in range(40)]
        lengths = np.array([[b["src"].shape[1] for b in step] for step in batches])
        return lengths, [[b["src"].tobytes() for b in step] for step in batches]

    own, _ = lengths_and_pairs(False)
    shared, rows = lengths_and_pairs(True)
    padded = lambda lengths: lengths.max(1).sum() * 4 / lengths.sum()  # noqa: E731
    assert padded(own) > 1.3 and padded(shared) < 1.1
    assert all(len(set(step)) == 4 for step in rows)  # each seed's own pairs
    np.testing.assert_array_equal(lengths_and_pairs(True)[0], shared)  # and reproducible


def test_token_batches_hold_at_most_their_tokens_and_every_pair_once_an_epoch(tmp_path):
    """batch_tokens: a batch holds batch_tokens // its padded length rows (one shape per
    length, the last batch of a length filled with all-padding rows); the same batches every
    epoch, in a new order."""
    rng = np.random.default_rng(2)
    path = tmp_path / "pairs.tsv"
    lengths = rng.integers(2, 90, 1000)
    path.write_text("".join(f"{i}{'s' * n}\t{'t' * n}\n" for i, n in enumerate(lengths)))
    d = data.TsvData(path, TOK, max_len=96, seed=0, pad_multiple=16, batch_tokens=600)
    n = d.batches_per_epoch(64)  # batch_size is not what cuts them
    epochs = [[d.train_batch(e * n + i, 64) for i in range(n)] for e in range(2)]
    for b in epochs[0]:
        rows, width = b["src"].shape[0], max(b["src"].shape[1], b["tgt_in"].shape[1])
        assert rows == 600 // width and rows * width <= 600  # every width here is <= 96
    firsts = [[bytes(b["src"][0]) for b in batches] for batches in epochs]
    pairs = [
        bytes(row)
        for b in epochs[0]
        for row, ok in zip(b["src"], b["src_valid"][:, 0], strict=True)
        if ok
    ]
    assert len(pairs) == len(set(pairs)) == len(d._train)  # each training pair once
    assert sorted(firsts[0]) == sorted(firsts[1]) and firsts[0] != firsts[1]  # reordered
    loss_rows = sum(int(b["tgt_valid"].any(1).sum()) for b in epochs[0])
    assert loss_rows == len(d._train)  # the filled rows carry no target


@pytest.mark.parametrize(
    "content,match",
    [
        (b"a\tb\nno tab here\n", r"pairs.tsv:2: expected 'source<TAB>target'"),
        (b"a\tb\nx\ty\tz\n", r"pairs.tsv:2: .*got 3 field"),
        (b"a\tb\n\tb\n", r"pairs.tsv:2: .*both non-empty"),
        (b"a\tb\n\xff\xfe\tq\n", r"pairs.tsv:2: not valid UTF-8"),
        (b"\x00\x01\x02", "looks like a binary file"),
        (b"", "the file is empty"),
    ],
)
def test_tsv_errors_name_the_line(tmp_path, content, match):
    path = tmp_path / "pairs.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        data.TsvData(path, TOK, max_len=64)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="no such file"):
        data.TsvData("/nonexistent/file.tsv", TOK, max_len=64)


def test_text_data_packs_documents(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"doc {i} " + "x" * (i % 7) for i in range(60)))
    d = data.TextData(path, TOK, seq_len=16)
    b = d.train_batch(0, 4)
    assert b["tgt_in"].shape == (4, 16)
    np.testing.assert_array_equal(b["tgt_in"][:, 1:], b["tgt_out"][:, :-1])
    seg = b["segment_ids"]
    # Inside a document, positions count up from where the piece starts.
    for row in range(4):
        for t in range(1, 16):
            if seg[row, t] == seg[row, t - 1] and seg[row, t]:
                assert b["positions"][row, t] == b["positions"][row, t - 1] + 1
    # No loss where the target (the next input token) belongs to another document.
    crosses = seg[:, :-1] != seg[:, 1:]
    assert not (b["tgt_valid"][:, :-1] & crosses).any()
    assert b["tgt_valid"].any()


def test_bpe_tokenizer_trains_saves_and_loads(tmp_path):
    pytest.importorskip("tokenizers", reason="the BPE tokenizer needs the 'tokenizers' extra")
    texts = [f"the cat sat on mat number {i}" for i in range(200)]
    tok = data.BPETokenizer.train(texts, vocab_size=300)
    ids = tok.encode("the cat sat")
    assert min(ids) >= 3 and tok.decode(ids + [2, 5]) == "the cat sat"
    assert len(ids) < len("the cat sat")  # merges happened
    tok.save(tmp_path)
    again = data.load_tokenizer(tmp_path)
    assert again.encode("the cat sat") == ids and again.vocab_size == tok.vocab_size


def test_text_without_blank_lines_has_one_document_per_line(tmp_path):
    def documents(text_data):  # the documents of both splits
        return text_data._train.documents + text_data._test.documents

    lines = [f"sentence number {i} about the weather" for i in range(40)]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n")
    assert documents(data.TextData(path, TOK, seq_len=16)) == 40
    paragraphs = tmp_path / "paragraphs.txt"
    paragraphs.write_text("\n\n".join("\n".join(lines[i : i + 4]) for i in range(0, 40, 4)))
    assert documents(data.TextData(paragraphs, TOK, seq_len=16)) == 10


def test_bpe_sized_from_the_data_keeps_only_common_merges():
    pytest.importorskip("tokenizers", reason="the BPE tokenizer needs the 'tokenizers' extra")
    texts = [f"order {i:05d} shipped to the warehouse on monday" for i in range(400)]
    capped = data.BPETokenizer.train(texts, vocab_size=2000)
    sized = data.BPETokenizer.train(texts)
    assert sized.vocab_size < capped.vocab_size
    assert "warehouse" in "".join(sized.token_strings(sized.encode(" warehouse")))
    assert len(sized.encode("00123")) > 1  # a number seen once is not one token


def test_pad_rows_masks_by_length_not_by_value():
    tokens, valid = data.pad_rows([[5, 0], [], [7]], 3, pad_id=0)  # 0 is also a real token
    np.testing.assert_array_equal(tokens, [[5, 0, 0], [0, 0, 0], [7, 0, 0]])
    np.testing.assert_array_equal(valid, [[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert tokens.dtype == np.int32
    with pytest.raises(ValueError, match="a row of 4 tokens does not fit width=3"):
        data.pad_rows([[1, 2, 3, 4]], 3, pad_id=0)


def test_stratified_order_makes_every_prefix_a_stratified_sample():
    groups = ["ruth"] * 70 + ["esther"] * 150 + ["james"] * 100 + ["tiny"] * 3
    order = datasets.stratified_order(groups, seed=0)
    assert sorted(order) == list(range(len(groups)))  # a permutation
    assert order == datasets.stratified_order(groups, seed=0)
    assert order != datasets.stratified_order(groups, seed=1)
    for m in range(1, len(groups) + 1):
        prefix = collections.Counter(groups[i] for i in order[:m])
        for g in set(groups):
            assert abs(prefix[g] - m * groups.count(g) / len(groups)) <= 2, (m, g)
    within = [i for i in order if groups[i] == "esther"]
    assert within != sorted(within)  # shuffled inside a group, not in verse order


def _same_data(a, b, batch_size: int = 8) -> None:
    """a and b give the same batches (two epochs' worth of indices) and held-out pairs."""
    assert a.seed == b.seed and a.dev_pairs == b.dev_pairs and a.test_pairs == b.test_pairs
    for i in (0, 1, 7, 40):
        x, y = a.train_batch(i, batch_size), b.train_batch(i, batch_size)
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    for x, y in zip(a.eval_batches(batch_size), b.eval_batches(batch_size), strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_reseeded_data_is_a_fresh_build_with_that_seed(tmp_path):
    """`train --seeds` builds the data once and reseeds it for each other seed: each seed
    must get exactly what its own build would give (order, held-out sample, batches)."""
    tsv, text = tmp_path / "pairs.tsv", tmp_path / "t.txt"
    tsv.write_text("".join(f"source {i} {'a' * (i % 9)}\ttarget {i}\n" for i in range(300)))
    text.write_text("\n\n".join(f"doc {i} " + "x" * (i % 7) for i in range(80)))
    builds = {
        "task": lambda seed: data.TaskData("dates", TOK, seed=seed, dev_size=20),
        "tsv": lambda seed: data.TsvData(tsv, TOK, max_len=64, seed=seed, dev_size=12),
        "text": lambda seed: data.TextData(text, TOK, seq_len=16, seed=seed),
    }
    for name, build in builds.items():
        first = build(0)
        first.train_batch(3, 8)  # an epoch cached for seed 0 must not leak into seed 5
        other = first.reseeded(5)
        _same_data(other, build(5))
        _same_data(first, build(0))  # the first is left as it was
        assert other.dev_pairs == first.dev_pairs, name  # every seed scores the same pairs
        assert (other.train_batch(0, 8)["tgt_in"] != first.train_batch(0, 8)["tgt_in"]).any()
