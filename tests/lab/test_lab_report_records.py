"""Every published XLA-vs-eager record's headline table is what the lab's code makes from
the report.json beside it: a page that opens with it shows measured figures, not a copy."""

import json
import pathlib

import pytest

from jaxformer_lab.bench import xla_vs_eager
from jaxformer_lab.results import Record

ROOT = pathlib.Path(__file__).resolve().parents[2] / "docs/results/xla_vs_eager"
WITH_HEADLINES = [p for p in sorted(ROOT.glob("*/record.json")) if Record.read(p).tables]


def test_the_published_runs_with_a_headline_are_found():
    assert len(WITH_HEADLINES) >= 3


@pytest.mark.parametrize("path", WITH_HEADLINES, ids=lambda p: p.parent.name)
def test_a_records_headline_table_rebuilds_from_its_report(path):
    record = Record.read(path)
    result = json.loads((path.parent / "report.json").read_text())
    out = pathlib.Path(record.command.split("--out ")[1].split()[0])
    line = xla_vs_eager.headline(result, out)
    assert record.data["headline"] == line
    assert len(record.tables) == 1
    assert record.tables[0].markdown() == xla_vs_eager.headline_table(line).markdown()
