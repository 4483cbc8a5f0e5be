"""jaxformer_lab.markdown.table: the one writer of markdown tables."""

import pytest

from jaxformer.checks import BadValue
from jaxformer_lab.markdown import table


def test_header_alignment_rule_and_rows():
    lines = table(["T", "kernel", "ms"], [[256, "xla", 5.4], [512, "chunked", ""]], "rlr")
    assert lines == [
        "| T | kernel | ms |",
        "| ---: | --- | ---: |",
        "| 256 | xla | 5.4 |",
        "| 512 | chunked |  |",
    ]


def test_a_bar_inside_a_cell_is_escaped():
    lines = table(["figure", "value"], [("max |diff|", "a|b")], "ll")
    assert lines[2] == r"| max \|diff\| | a\|b |"
    assert lines[2].replace("\\|", "").count("|") == 3  # two cells: three bars


def test_a_table_without_rows_is_its_header():
    assert table(["a"], [], "l") == ["| a |", "| --- |"]


@pytest.mark.parametrize(
    "columns, rows, align, message",
    [
        (["a", "b"], [["x", "y", "z"]], "ll", "2 columns got row 0 of 3 cells"),
        (["a", "b"], [["x", "y"], ["x"]], "ll", "2 columns got row 1 of 1 cells"),
        (["a", "b"], [], "l", "2 columns needs one align letter per column"),
        (["a", "b"], [], "lc", "got 'lc'"),
    ],
)
def test_mismatched_rows_or_alignment_are_refused(columns, rows, align, message):
    with pytest.raises(BadValue, match=message):
        table(columns, rows, align)
