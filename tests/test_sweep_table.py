"""experiments/sweep_table.py on a constructed sweep: the report's tables in the
docs/results format, recomputed from the run folders, rendered as a results.Record."""

import importlib.util
import json
import pathlib

import pytest

from jaxformer import results, sweep
from tests.test_sweep import finished, system, write_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep_table = _module("sweep_table")


def test_a_sweep_becomes_a_results_file_with_its_verdicts(tmp_path):
    path = write_spec(tmp_path, variants={"base": {}, "better": {}}, seeds=3)
    spec = sweep.Spec.load(path)
    for seed in range(3):
        base = {"bleu": 10.0 + seed, "chrf": 30.0}
        finished(spec.folder("base", seed), base, system(0.6, seed))
        better = {"bleu": 13.0 + seed, "chrf": 33.0}
        finished(spec.folder("better", seed), better, system(0.85, 10 + seed))
    out = tmp_path / "docs" / "sweep.json"
    line = sweep_table.main(
        [str(path), "--about", "A toy.", "--note", "Read it.", "--out", str(out)]
    )
    assert line["verdicts"] == {"better": {"bleu": "better", "chrf": "better"}}
    result = json.loads(out.read_text())
    assert result["command"] == f"jaxformer sweep {path}"
    figures, differences, verdicts = result["tables"]
    assert figures["caption"].startswith("A toy. Each variant: mean")
    assert figures["rows"][1][:3] == ["better", "3/3", "14.00 ± 2.48"]
    assert differences["rows"] == [["better", "3", "+3.00 ± 0.00", "+3.00 ± 0.00"]]
    assert verdicts["notes"] == ["Read it."] and verdicts["rows"][0][7] == "better"
    text = results.Record.from_dict(result).markdown()
    assert "| better | 3/3 | 14.00 ± 2.48 | 33.00 |" in text and "Read it." in text

    png = tmp_path / "figures" / "curves.png"  # a folder not yet made
    line = sweep_table.main(
        [str(path), "--baseline", "better", "--curves", str(png), "--out", str(out)]
    )
    assert line["verdicts"] == {"base": {"bleu": "worse", "chrf": "worse"}}
    assert png.read_bytes().startswith(b"\x89PNG")
    sweep_table.main([str(path), "--comparisons-only", "--about", "Again.", "--out", str(out)])
    differences, verdicts = json.loads(out.read_text())["tables"]
    assert differences["caption"].startswith("Again. Variant minus base")


def test_bad_input_is_one_error_line_with_exit_2(tmp_path, capsys):
    path, out = write_spec(tmp_path), str(tmp_path / "x.json")
    for argv, message in [
        ([str(path), "--out", out], "no such sweep folder"),
        ([str(path), "--baseline", "nope", "--out", out], "--baseline 'nope' is not one of"),
        ([str(tmp_path / "missing.yaml"), "--out", out], "missing.yaml: no such config file"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            sweep_table.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, baseline",
    [
        ("sweep_wyc_web_speedrun", None),
        ("sweep_wyc_web_speedrun_batch", "no_dropout"),
        ("sweep_wyc_web_speedrun_levers", "no_dropout_batch_32"),
    ],
)
def test_the_committed_speedrun_sweep_tables_are_what_its_committed_records_compute(
    tmp_path, name, baseline
):
    out = tmp_path / "sweep.json"
    records = ROOT / "records" / "sweeps" / "wyc-web-speedrun"
    argv = [str(ROOT / "configs" / "sweeps" / "wyc_web_speedrun.yaml"), "--sweep-out", str(records)]
    if baseline:
        argv += ["--baseline", baseline, "--comparisons-only"]
    sweep_table.main([*argv, "--out", str(out)])
    committed = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())["tables"]
    computed = json.loads(out.read_text())["tables"]
    for table in committed + computed:  # the words around the tables are options
        table.pop("caption")
        table.pop("notes", None)
    assert computed == committed
