"""experiments/batch_shapes.py: the shapes of a run's training batches per pad multiple,
counted from the batches `jaxformer train` builds."""

import importlib.util
import json
import pathlib
import sys

import pytest

PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "batch_shapes.py"
spec = importlib.util.spec_from_file_location("batch_shapes", PATH)
batch_shapes = sys.modules["batch_shapes"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(batch_shapes)


@pytest.mark.slow  # 30 s of CI's quick suite: every batch of wyc-web counted
def test_the_counts_cover_every_batch_and_the_largest_multiple_leaves_one_shape(tmp_path):
    out = tmp_path / "shapes.json"
    batch_shapes.main(["--steps", "40", "--pad-multiples", "16", "128", "--out", str(out)])
    rows = json.loads(out.read_text())["tables"][0]["rows"]
    assert [r[0] for r in rows] == ["16", "128"]
    assert rows[1][1:] == ["1", "128x128: 40"]  # max_len 128: every batch padded to it
    counts = [int(part.split(": ")[1]) for part in rows[0][2].split(", ")]
    assert sum(counts) == 40 and len(counts) == int(rows[0][1]) > 1


def test_bad_input_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        batch_shapes.main(["--pad-multiples", "0"])
    assert exit_.value.code == 2
    assert "--pad-multiples must be >= 1" in capsys.readouterr().err
