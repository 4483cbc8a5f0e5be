"""Bad input to the lab's commands found by a fault trial: each is one line naming what to
change, exit code 2, no traceback, before any work is done, and leaves no folder or
record behind."""

import json
import re

import pytest

from jaxformer.cli import main


def _run(capsys, *argv):
    """`jaxformer ARGV` in this process: (exit code, stderr lines)."""
    try:
        code = main([*map(str, argv)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def _files(tmp):
    """A spec that would run, a file, a folder named like a record, variant files."""
    base = {"task": "copy", "steps": 2, "batch_size": 2, "eval_examples": 2}
    spec = {"base": base, "variants": {"a": {}}, "seeds": 1, "out": str(tmp / "sweep")}
    (tmp / "spec.json").write_text(json.dumps(spec))
    (tmp / "files.json").write_text(json.dumps(spec | {"variant_files": 3}))
    (tmp / "raises.json").write_text(json.dumps(spec | {"variant_files": [str(tmp / "v.py")]}))
    (tmp / "v.py").write_text("raise RuntimeError('no such kernel')\n")
    (tmp / "file").write_text("")
    (tmp / "folder.json").mkdir()


FAULTS = [
    ("variant_files not a list", ["sweep", "files.json"], r"files.json: variant_files must be a list of files or modules, got 3$"),
    ("sweep folder is a file", ["sweep", "spec.json", "--out", "file"], r"cannot make the sweep folder \S*file \(File exists\); choose another --out$"),
    ("sweep folder cannot be made", ["sweep", "spec.json", "--out", "/proc/no/sweep"], r"cannot make the sweep folder /proc/no/sweep \(.*\); choose another --out$"),
    ("--set value not YAML", ["sweep", "spec.json", "--set", "d_model=[1"], r"--set d_model=\[1: not a YAML value \(.*\)$"),
    ("gpu-report --out a file", ["gpu-report", "--dry-run", "--parts", "peers", "--out", "file"], r"--out \S*file: cannot make the folder \(.*\)$"),
    ("bench --out a folder", ["bench", "decode", "--quick", "--out", "folder.json"], r"--out \S*folder.json is a folder; give the record's file path$"),
    ("bench --out under a file", ["bench", "decode", "--quick", "--out", "file/d.json"], r"--out \S*file/d.json: \S*file is a file; choose another --out$"),
    ("compile-check --out a folder", ["compile-check", "--target", "tpu:v5e:2x4", "--out", "folder.json"], "is a folder"),
    ("sweep calibrate --out a folder", ["sweep", "calibrate", "--out", "folder.json"], "is a folder"),
    ("sweep report --out a folder", ["sweep", "report", "spec.json", "--out", "folder.json"], "is a folder"),
    ("--parts before the load is measured", ["bench", "xla-vs-eager", "--parts", "nope", "--out", "lab"], r"--parts nope: not in the cpu plan"),
]  # fmt: skip


@pytest.mark.parametrize("argv, match", [pytest.param(a, m, id=n) for n, a, m in FAULTS])
def test_lab_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, argv, match):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)  # the files by name
    before = sorted(p.name for p in tmp_path.iterdir())
    code, lines = _run(capsys, *argv)
    assert code == 2 and len(lines) == 1, lines
    assert re.match(rf"jaxformer {argv[0]}( [\w-]+)?: error: ", lines[0]), lines
    assert re.search(match, lines[0]), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no folder, no record


def test_a_sweeps_variant_file_that_raises_shows_its_own_error(tmp_path, capsys, monkeypatch):
    """As `train --variants`: the user's exception and their line, not a traceback."""
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, lines = _run(capsys, "sweep", "raises.json")
    assert code == 2 and len(lines) <= 5, lines
    assert lines[0] == f"jaxformer sweep: error: --variants {tmp_path / 'v.py'} raised on import:"
    assert lines[-1] == "RuntimeError: no such kernel"
    assert not (tmp_path / "sweep").exists()
