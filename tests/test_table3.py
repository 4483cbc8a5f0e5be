"""experiments/table3.py: the scaling rule on the paper's rows, and (slow) a two-row,
two-step rerun on wyc-web that writes the table."""

import importlib.util
import pathlib

import pytest

from jaxformer.config import TABLE3_ROWS

PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "table3.py"
spec = importlib.util.spec_from_file_location("table3", PATH)
table3 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table3)


def test_every_row_is_scaled_by_one_rule():
    base = table3.scaled("base")
    assert base == dict(
        d_model=128, d_ff=512, d_k=16, d_v=16, num_encoder_layers=3, num_decoder_layers=3,
        num_heads=8, dropout_rate=0.1, label_smoothing=0.1, position_embedding="sinusoidal",
    )  # fmt: skip
    assert table3.scaled("A1") == base | dict(num_heads=1, d_k=128, d_v=128)
    assert table3.scaled("B1") == base | dict(d_k=4)
    assert table3.scaled("C1") == base | dict(num_encoder_layers=1, num_decoder_layers=1)
    assert table3.scaled("C5") == base | dict(d_model=256, d_k=32, d_v=32)
    assert table3.scaled("D3") == base | dict(label_smoothing=0.0)
    assert table3.scaled("E") == base | dict(position_embedding="learned")
    assert set(table3.PAPER) == set(TABLE3_ROWS)


@pytest.mark.slow
def test_a_two_row_rerun_writes_the_table(tmp_path):
    out = tmp_path / "t3"
    args = ["--rows", "base", "A1", "--steps", "2", "--seeds", "1", "--eval-examples", "8"]
    headline = table3.main([*args, "--out", str(out)])
    assert headline["rows"] == 2 and headline["base_bleu"] is not None
    lines = (out / "table3.md").read_text().splitlines()
    assert lines[2].startswith(
        "| base | 3 | 128 | 512 | 8 | 16 | 16 | 0.1 | 0.1 | sinusoidal | 4.92 | 25.8 | 65 |"
    )
    assert lines[3].startswith("| A1 | 3 | 128 | 512 | 1 | 128 | 128 |") and lines[3].endswith(
        "| 1 |"
    )
