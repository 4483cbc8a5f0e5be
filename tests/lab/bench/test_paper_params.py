"""jaxformer bench paper-params: Table 3's parameter counts against the paper's."""

import json

import pytest

from jaxformer import cli
from jaxformer_lab.bench import paper_params


def test_base_and_a_width_row_match_the_paper_and_big_does_not(tmp_path):
    out = tmp_path / "params.json"
    assert (
        cli.main(["bench", "paper-params", "--rows", "base", "C5", "big", "--out", str(out)]) == 0
    )
    record = json.loads(out.read_text())
    headline = record["data"]["headline"]
    assert abs(headline["base_M"] - 65) < 0.5  # the paper's 65M at 41,000 tokens
    assert headline["max_abs_mismatch_M_without_big"] <= 1.0  # C5: its change from base
    assert headline["big_mismatch_M"] > 4  # the documented exception
    # The paper's base and big counts need two different shared vocabularies.
    assert headline["vocab_big_minus_base"][1] < headline["vocab_base"][0]
    assert [row[0] for row in record["tables"][0]["rows"]] == ["base", "C5", "big"]


def test_a_count_is_linear_in_the_vocabulary():
    # One shared embedding matrix of vocab x d_model (tied with the output projection).
    assert paper_params.count("base", 3) - paper_params.count("base", 1) == 2 * 512


@pytest.mark.parametrize(
    "argv, message",
    [(["--vocab", "0"], "--vocab must be an int >= 1"), (["--rows", "Z9"], "not rows of Table 3")],
)
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert cli.main(["bench", "paper-params", *argv]) == 2
    assert message in capsys.readouterr().err
