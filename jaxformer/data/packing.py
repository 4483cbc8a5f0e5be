"""Documents into the rows of a language model's batches: every row holds row_len tokens
(seq_len inputs and, shifted by one, seq_len targets).

A document longer than a row is split at row boundaries into pieces that start every
row_len - 1 tokens, so consecutive pieces share one token (the last target of one is the
first input of the next) and every prediction inside a document is made exactly once.
`Packed` lays the pieces out: packed, best-fit decreasing within windows of consecutive
documents (whole pieces aligned to their first token, segment ids 1, 2, ... per piece in
a row, 0 for padding, positions restarting at 0); unpacked, one piece per row,
right-padded, which needs no segment ids (padding after a row's tokens is never attended
under the causal mask). A prediction whose target lies in another piece or in padding
carries no loss (`tgt_valid`). The layout is a pure function of the document lengths."""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

WINDOW_ROWS = 256  # documents are packed together within windows of this many rows' tokens


def pieces(lengths: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document, start, length) of every piece of documents of `lengths` tokens: pieces
    start every row_len - 1 tokens and hold up to row_len; a document of fewer than two
    tokens (nothing to predict) has none."""
    lengths = np.asarray(lengths, np.int64)
    count = np.where(lengths >= 2, -(-(lengths - 1) // (row_len - 1)), 0)
    doc = np.repeat(np.arange(len(lengths)), count)
    start = (np.arange(len(doc)) - np.repeat(_firsts(count), count)) * (row_len - 1)
    return doc, start, np.minimum(row_len, lengths[doc] - start)


def best_fit(lengths: np.ndarray, capacity: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of items of `lengths` (each <= capacity) placed by best-fit decreasing
    in windows of consecutive items holding about `window` tokens: longest first (ties in
    order), each into the open row of its window with the least room that holds it, else a
    new row. Rows are numbered in order of opening."""
    lengths = np.asarray(lengths, np.int64)
    row, col = np.empty(len(lengths), np.int64), np.empty(len(lengths), np.int64)
    edges = np.flatnonzero(np.diff(np.cumsum(lengths) // max(window, 1))) + 1
    opened = 0
    for items in np.split(np.arange(len(lengths)), edges):
        order = items[np.argsort(-lengths[items], kind="stable")]
        rooms: list[int] = []  # sorted room sizes that some open row has
        rows_with: dict[int, list[int]] = {}  # room -> the open rows with that room
        for i, n in zip(order.tolist(), lengths[order].tolist(), strict=True):
            k = bisect.bisect_left(rooms, n)
            if k == len(rooms):
                r, room, opened = opened, capacity, opened + 1
            else:
                room = rooms[k]
                r = rows_with[room].pop()
                if not rows_with[room]:
                    del rooms[k]
            row[i], col[i], room = r, capacity - room, room - n
            if room >= 2:  # a gap of one token holds no piece
                if not rows_with.setdefault(room, []):
                    bisect.insort(rooms, room)
                rows_with[room].append(r)
    return row, col


class Packed:
    """Documents (token `starts` and `lengths` in a source that `read(positions)` reads)
    laid out in rows of row_len tokens; see the module doc. `rows` rows hold `tokens` real
    tokens; `efficiency` is their share of the rows' slots."""

    def __init__(
        self,
        read: Callable[[np.ndarray], np.ndarray],
        starts: np.ndarray,
        lengths: np.ndarray,
        row_len: int,
        *,
        pack: bool = True,
        window: int = WINDOW_ROWS,
    ):
        doc, start, length = pieces(lengths, row_len)
        if pack:
            row, col = best_fit(length, row_len, window * row_len)
        else:
            row, col = np.arange(len(length)), np.zeros(len(length), np.int64)
        order = np.lexsort((col, row))  # pieces by row, then column
        self.read, self.row_len, self.pack = read, row_len, pack
        self.src = (np.asarray(starts, np.int64)[doc] + start)[order]
        self.length, self.col = length[order], col[order]
        self.rows = int(row.max(initial=-1)) + 1
        self.row_ptr = np.searchsorted(row[order], np.arange(self.rows + 1))
        self.documents = int(np.count_nonzero(np.asarray(lengths) >= 2))
        self.tokens = int(length.sum())
        self.efficiency = self.tokens / max(self.rows * row_len, 1)

    def batch(self, rows: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
        """Rows `rows` (indices; -1 for an all-padding row) as a batch: tgt_in, tgt_out,
        tgt_valid [B, row_len - 1], and when packed segment_ids and positions."""
        rows = np.asarray(rows, np.int64)
        real = np.flatnonzero(rows >= 0)
        first, count = self.row_ptr[rows[real]], np.diff(self.row_ptr)[rows[real]]
        piece = np.repeat(first - _firsts(count), count) + np.arange(count.sum())
        segment = piece - np.repeat(first, count) + 1  # 1, 2, ... within each row
        length = self.length[piece]
        each = np.repeat(np.arange(len(piece)), length)  # the piece of every token
        within = np.arange(len(each)) - _firsts(length)[each]
        at = np.repeat(real, count)[each] * self.row_len + self.col[piece][each] + within
        shape = (len(rows), self.row_len)
        tokens = np.full(shape, pad_id, np.int32)
        segments, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
        tokens.flat[at] = self.read(self.src[piece][each] + within)
        segments.flat[at], positions.flat[at] = segment[each], within
        seg_in, seg_out = segments[:, :-1], segments[:, 1:]
        batch = {
            "tgt_in": tokens[:, :-1],
            "tgt_out": tokens[:, 1:],
            "tgt_valid": (seg_in == seg_out) & (seg_out != 0),
        }
        if self.pack:
            batch |= {"segment_ids": seg_in, "positions": positions[:, :-1]}
        return batch


def _firsts(counts: np.ndarray) -> np.ndarray:
    """Where each run of `counts` items starts in their concatenation (exclusive cumsum)."""
    return np.cumsum(counts) - counts
