"""jaxformer bench internals-overhead: blocks of N steps with and without the internals
step, in paired rounds; the record carries the overhead and the internals step's cost with
their intervals."""

import json

import pytest

from jaxformer import cli


@pytest.mark.slow  # 15-30 s: the dates model's two steps compiled, 16 blocks
def test_the_overhead_and_the_internals_step_carry_intervals(tmp_path):
    out = tmp_path / "internals.json"
    assert cli.main(["bench", "internals-overhead", "--every", "2", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    times = record["data"]["times"]
    assert [len(times[k]) for k in ("without", "with")] == [6, 6]
    assert len(record["data"]["internals_step_s"]) == 6
    (row,) = record["tables"][0]["rows"]
    assert row[:2] == ["2", "6"] and all(" [" in cell for cell in row[2:])
    overhead = record["data"]["headline"]["overhead"]
    assert row[4].startswith(f"{overhead:+.1%}")
