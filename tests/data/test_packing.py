"""Packing documents into rows (`jaxformer.data.packing`): against plain-Python references
and hand-worked rows; properties with hypothesis (every prediction of every document made
exactly once, in order; no document split unless longer than a row; segment ids and
positions; packed never less full than unpacked); and the loss of a packed batch equal to
its documents' losses taken one by one."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxformer.config import TransformerConfig
from jaxformer.data import packing
from jaxformer.data.packing import Packed
from jaxformer.models import DecoderLM
from jaxformer.train.steps import model_loss_sums

PAD = -1  # a value no document token takes


def packed(lengths, row_len, pack=True, window=packing.WINDOW_ROWS):
    """Documents whose tokens are their stream positions (every token distinct)."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.cumsum(lengths) - lengths
    return Packed(lambda at: at, starts, lengths, row_len, pack=pack, window=window), starts


def reference_pieces(lengths, row_len):
    out = []
    for d, n in enumerate(lengths):
        start = 0
        while n >= 2 and start < n - 1:
            out.append((d, start, min(row_len, n - start)))
            start += row_len - 1
    return out


def reference_loads(lengths, capacity, window):
    """Best-fit decreasing by brute force: the sorted row loads of each window."""
    loads, ends = [], np.cumsum(lengths) // window
    for w in dict.fromkeys(ends.tolist()):
        rooms = []
        for n in sorted((n for n, e in zip(lengths, ends, strict=True) if e == w), reverse=True):
            fits = [i for i, room in enumerate(rooms) if n <= room]
            if fits:
                i = min(fits, key=lambda i: rooms[i])
                rooms[i] -= n
            else:
                rooms.append(capacity - n)
        loads.append(sorted(capacity - room for room in rooms))
    return loads


def reference_batch(layout: Packed, rows):
    """A batch built token by token, from the layout's pieces."""
    B, L = len(rows), layout.row_len
    tokens, segments, positions = np.full((B, L), PAD), np.zeros((B, L), int), np.zeros((B, L), int)
    for b, r in enumerate(rows):
        if r < 0:
            continue
        for k, p in enumerate(range(layout.row_ptr[r], layout.row_ptr[r + 1])):
            for t in range(layout.length[p]):
                tokens[b, layout.col[p] + t] = layout.src[p] + t
                segments[b, layout.col[p] + t] = k + 1
                positions[b, layout.col[p] + t] = t
    valid = np.zeros((B, L - 1), bool)
    for b in range(B):
        for t in range(L - 1):
            valid[b, t] = segments[b, t] == segments[b, t + 1] != 0
    return tokens, segments, positions, valid


def test_pieces_share_one_token_and_match_the_reference():
    doc, start, length = packing.pieces(np.array([1, 2, 5, 9, 4, 0]), 4)
    assert list(zip(doc, start, length, strict=True)) == [
        (1, 0, 2),
        (2, 0, 4),
        (2, 3, 2),
        (3, 0, 4),
        (3, 3, 4),
        (3, 6, 3),
        (4, 0, 4),
    ]
    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths, row_len = rng.integers(0, 40, size=30), int(rng.integers(2, 12))
        got = list(zip(*packing.pieces(lengths, row_len), strict=True))
        assert [tuple(map(int, p)) for p in got] == reference_pieces(lengths, row_len)


def test_a_hand_worked_packed_batch():
    """Documents of 3, 9, 2, 4, 1 and 5 tokens in rows of 4: the 9 and the 5 split into
    pieces sharing a token, the 1 dropped (nothing to predict), the rest best-fit."""
    layout, _ = packed([3, 9, 2, 4, 1, 5], 4)
    batch = layout.batch(np.arange(layout.rows), PAD)
    rows = np.concatenate([batch["tgt_in"], batch["tgt_out"][:, -1:]], axis=1)
    np.testing.assert_array_equal(
        rows,
        [
            [3, 4, 5, 6],  # the 9-token document's pieces: 3-6, 6-9, 9-11
            [6, 7, 8, 9],
            [14, 15, 16, 17],  # the 4
            [19, 20, 21, 22],  # the 5's first piece
            [0, 1, 2, PAD],  # the 3, then a gap of one (too small for any piece)
            [9, 10, 11, PAD],
            [12, 13, 22, 23],  # the 2 and the 5's last piece
        ],
    )
    np.testing.assert_array_equal(batch["segment_ids"][-1], [1, 1, 2])
    np.testing.assert_array_equal(batch["positions"][-1], [0, 1, 0])
    np.testing.assert_array_equal(batch["tgt_valid"][-1], [True, False, True])
    np.testing.assert_array_equal(batch["tgt_valid"][4], [True, True, False])
    assert layout.rows == 7 and layout.tokens == 26 and layout.documents == 5


def test_unpacked_rows_hold_one_piece_each_and_no_segment_ids():
    layout, _ = packed([3, 9, 2], 4, pack=False)
    batch = layout.batch(np.array([0, -1, 3]), PAD)
    assert sorted(batch) == ["tgt_in", "tgt_out", "tgt_valid"]
    np.testing.assert_array_equal(batch["tgt_in"], [[0, 1, 2], [PAD] * 3, [9, 10, 11]])
    np.testing.assert_array_equal(batch["tgt_valid"], [[1, 1, 0], [0, 0, 0], [1, 1, 0]])
    lengths = batch["tgt_valid"].sum(1)  # a prefix: padding the model may take as lengths
    np.testing.assert_array_equal(batch["tgt_valid"], np.arange(3) < lengths[:, None])


def test_best_fit_matches_a_brute_force_reference():
    rng = np.random.default_rng(1)
    for _ in range(30):
        capacity = int(rng.integers(2, 30))
        lengths = rng.integers(2, capacity + 1, size=int(rng.integers(1, 80)))
        window = int(rng.integers(1, 200))
        row, col = packing.best_fit(lengths, capacity, window)
        loads = collections.Counter(row.tolist())
        for r in loads:  # each row's items lie side by side from column 0
            items = sorted(
                (int(c), int(n)) for c, n, rr in zip(col, lengths, row, strict=True) if rr == r
            )
            assert [c for c, _ in items] == np.cumsum([0] + [n for _, n in items])[:-1].tolist()
        by_window = collections.defaultdict(list)
        ends = np.cumsum(lengths) // window
        for r in sorted(loads):
            by_window[int(ends[row == r][0])].append(int(lengths[row == r].sum()))
        assert [sorted(v) for _, v in sorted(by_window.items())] == reference_loads(
            lengths, capacity, window
        )


@pytest.mark.parametrize("pack", [True, False])
def test_batches_match_a_token_by_token_reference(pack):
    layout, _ = packed(np.random.default_rng(2).integers(0, 30, size=60), 9, pack=pack, window=3)
    rows = np.array([3, -1, 0, layout.rows - 1, 5])
    batch = layout.batch(rows, PAD)
    tokens, segments, positions, valid = reference_batch(layout, rows)
    np.testing.assert_array_equal(batch["tgt_in"], tokens[:, :-1])
    np.testing.assert_array_equal(batch["tgt_out"], tokens[:, 1:])
    np.testing.assert_array_equal(batch["tgt_valid"], valid)
    if pack:
        np.testing.assert_array_equal(batch["segment_ids"], segments[:, :-1])
        np.testing.assert_array_equal(batch["positions"], positions[:, :-1])


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    row_len=st.integers(2, 17),
    window=st.integers(1, 6),
)
def test_every_prediction_of_every_document_is_made_once_in_order(lengths, row_len, window):
    lengths = np.array(lengths)
    for pack in (True, False):
        layout, starts = packed(lengths, row_len, pack=pack, window=window)
        batch = layout.batch(np.arange(layout.rows), PAD)
        x, y, valid = batch["tgt_in"], batch["tgt_out"], batch["tgt_valid"]
        made = collections.Counter(zip(x[valid].tolist(), y[valid].tolist(), strict=True))
        wanted = [
            (s + t, s + t + 1) for s, n in zip(starts, lengths, strict=True) for t in range(n - 1)
        ]
        assert made == collections.Counter(wanted)  # each once, none across documents
        rows = np.concatenate([x, y[:, -1:]], axis=1)
        for s, n in zip(starts, lengths, strict=True):
            pieces = sorted(p for row in rows if (p := row[(row >= s) & (row < s + n)].tolist()))
            if n < 2:
                assert not pieces  # nothing to predict: left out
                continue
            assert len(pieces) == 1 or n > row_len  # whole unless longer than a row
            joined = pieces[0] + [t for piece in pieces[1:] for t in piece[1:]]  # one shared
            assert joined == list(range(s, s + n))  # in order, nothing missing or repeated
        if pack:
            seg, pos = batch["segment_ids"], batch["positions"]
            for b in range(len(seg)):  # 1, 2, ... from column 0, padding (0) only at the end
                ids = seg[b][seg[b] > 0]
                assert (np.diff(ids) >= 0).all() and ids[0] == 1 and (seg[b][: len(ids)] > 0).all()
                for k in set(ids.tolist()):
                    np.testing.assert_array_equal(
                        pos[b][seg[b] == k], np.arange((seg[b] == k).sum())
                    )
    unpacked, _ = packed(lengths, row_len, pack=False)
    full, _ = packed(lengths, row_len, window=window)
    assert full.rows <= unpacked.rows and full.tokens == unpacked.tokens
    assert full.efficiency >= unpacked.efficiency


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_packed_batch_loses_what_its_documents_lose_one_by_one(jit):
    """The loss sums of packed rows equal those of each document alone in its own row:
    nothing leaks between documents, padding costs nothing, every target counted once."""
    config = TransformerConfig.tiny(50).replace(
        num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16, label_smoothing=0.0
    )
    model = DecoderLM(config, rngs=nnx.Rngs(0))
    docs = [np.array([5, 6, 7, 8, 9]), np.array([10, 11, 12]), np.array([13, 14, 15, 16, 17, 18])]
    stream = np.concatenate(docs).astype(np.int32)
    lengths = np.array([len(d) for d in docs])
    layout = Packed(stream.__getitem__, np.cumsum(lengths) - lengths, lengths, 9)
    assert layout.rows == 2  # the 6 alone, the 5 and the 3 together
    graphdef, state = nnx.split(model)

    def sums(state, batch):
        return model_loss_sums(nnx.merge(graphdef, state), batch, rng=None, label_smoothing=0.0)

    sums = jax.jit(sums) if jit else sums
    together = sums(state, {k: jnp.asarray(v) for k, v in layout.batch(np.arange(2), 0).items()})
    alone = [sums(state, {"tgt_in": d[None, :-1], "tgt_out": d[None, 1:]}) for d in docs]
    assert int(together.tokens) == sum(len(d) - 1 for d in docs)
    np.testing.assert_allclose(together.nll, sum(a.nll for a in alone), rtol=1e-5)
