"""jaxformer_lab.records: run records read in place from a folder's .tar.xz, as the
committed records are; and a sweep's report read from its archive."""

import json
import pathlib
import shutil

import pytest

from jaxformer.checks import BadValue, MissingFile
from jaxformer.cli import main
from jaxformer.files import read_json, read_metrics
from jaxformer_lab import records
from jaxformer_lab.results import Record
from tests.lab.sweep.test_report import report
from tests.lab.sweep.test_sweep import finished, system, write_spec


def study(root: pathlib.Path, name: str = "study") -> pathlib.Path:
    """A folder of a run's files, one of them a metrics.jsonl, and a note."""
    (root / name / "a" / "seed0").mkdir(parents=True)
    (root / name / "b").mkdir()
    (root / name / "a" / "seed0" / "summary.json").write_text('{"bleu": 1.5}')
    (root / name / "a" / "seed0" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (root / name / "b" / "note.txt").write_text("é\n")
    return root / name


def test_a_packed_folder_reads_the_same_from_its_archive(tmp_path):
    folder = study(tmp_path)
    archive = records.pack(folder)
    assert archive == tmp_path / "study.tar.xz"
    first = archive.read_bytes()
    assert records.pack(folder).read_bytes() == first  # the same files, the same bytes
    assert records.tree(folder) == folder  # the folder, while it is there
    shutil.rmtree(folder)
    top = records.tree(folder)
    assert top == records.tree(archive) and str(top) == str(archive) and top.name == "study"
    assert [p.name for p in top.iterdir()] == ["a", "b"] and top.is_dir()
    run = records.tree(folder / "a" / "seed0")
    assert run == top / "a" / "seed0" and run.parent.parent == top
    assert records.tree(archive / "a" / "seed0") == run
    assert read_json(run / "summary.json") == {"bleu": 1.5}
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert (top / "b" / "note.txt").read_text() == "é\n" and (top / "b" / "note.txt").is_file()
    assert not (run / "nope").exists() and not run.is_file()
    with pytest.raises(MissingFile, match=r"study\.tar\.xz/a/seed0/nope: no such file"):
        read_json(run / "nope")
    with pytest.raises(IsADirectoryError):
        run.read_text()
    assert records.tree(tmp_path / "elsewhere") == tmp_path / "elsewhere"  # in no archive


def test_a_damaged_or_foreign_archive_is_one_error_naming_it(tmp_path):
    archive = records.pack(study(tmp_path))
    shutil.rmtree(tmp_path / "study")
    archive.write_bytes(archive.read_bytes()[:60])  # cut short
    with pytest.raises(BadValue, match=r"study\.tar\.xz: not a readable \.tar\.xz"):
        records.tree(archive).exists()
    records.pack(study(tmp_path, "other")).rename(archive)  # files under other/, not study/
    with pytest.raises(BadValue, match=r"other/a/seed0/metrics\.jsonl is not under study/"):
        records.tree(archive).is_dir()


def test_a_missing_folder_is_one_error_line(tmp_path):
    with pytest.raises(MissingFile, match="nope: no such folder"):
        records.pack(tmp_path / "nope")


def test_a_sweep_reports_the_same_tables_from_its_archive(tmp_path, capsys):
    path = write_spec(tmp_path, variants={"base": {}, "better": {}}, seeds=2)
    for seed in range(2):
        finished(tmp_path / "sweep" / "base" / f"seed{seed}", {"bleu": 10.0}, system(0.6, seed))
        finished(tmp_path / "sweep" / "better" / f"seed{seed}", {"bleu": 13.0}, system(0.9, seed))
    report(capsys, path, "--out", tmp_path / "folder.json")
    records.pack(tmp_path / "sweep")
    shutil.rmtree(tmp_path / "sweep")
    for out in (tmp_path / "sweep", tmp_path / "sweep.tar.xz"):  # its folder's name, or its own
        line = report(capsys, path, "--sweep-out", out, "--out", tmp_path / "archive.json")
        assert line["verdicts"] == {"better": {"bleu": "better"}}
        tables = [Record.read(tmp_path / f"{n}.json").tables for n in ("folder", "archive")]
        assert tables[0] == tables[1]
    assert main(["sweep", "report", str(path), "--out", str(tmp_path / "x.json")]) == 0
    assert json.loads(capsys.readouterr().out)["sweep"] == str(tmp_path / "sweep.tar.xz")
