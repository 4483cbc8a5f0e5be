"""Markdown tables, written one way: the lab's report, the documentation's result pages and
the experiments' tables all go through `table`.

    >>> table(["T", "ms"], [[256, "5.4"]], align="rr")
    ['| T | ms |', '| ---: | ---: |', '| 256 | 5.4 |']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jaxformer.checks import BadValue

RULES = {"l": "---", "r": "---:"}


def table(columns: Sequence[str], rows: Iterable[Sequence], align: str) -> list[str]:
    """The lines of a markdown table: the header, the alignment rule, one line per row.

    `align` holds one letter per column, "l" (left) or "r" (right). Cells are written with
    `str`; a `|` inside a cell is escaped (`\\|`), so that it stays in its cell."""
    if len(align) != len(columns) or set(align) - set(RULES):
        raise BadValue(
            f"a table of {len(columns)} columns needs one align letter per column "
            f"(l or r), got {align!r}"
        )
    lines = [_line(columns), _line(RULES[a] for a in align)]
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise BadValue(
                f"a table of {len(columns)} columns got row {i} of {len(row)} cells: {row!r}"
            )
        lines.append(_line(row))
    return lines


def _line(cells: Iterable) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
