"""jaxformer_lab.bench.pythons: which interpreters run torch and which JAX lines are
compared, found by one rule, and the environment a worker in another one gets."""

import importlib.util
import os
import pathlib
import platform
import sys

import jax
import pytest

from jaxformer.checks import MissingFile, MissingPackage
from jaxformer_lab.bench import pythons

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_describe_reads_an_interpreters_versions_without_importing_them():
    info = pythons.describe(sys.executable)
    assert info["python"] == platform.python_version() and info["jax"] == jax.__version__
    assert info["prefix"] == sys.prefix and info["path"] == sys.executable
    has_torch = importlib.util.find_spec("torch") is not None
    assert (info["torch"] is not None) == has_torch


def test_a_path_that_is_no_interpreter_is_one_line(tmp_path):
    with pytest.raises(MissingFile, match="no such interpreter"):
        pythons.describe(str(tmp_path / "python"))
    with pytest.raises(MissingFile, match="--torch-python .*: no such file"):
        pythons.check_python("--torch-python", str(tmp_path / "python"))


def test_environments_are_looked_for_in_the_checkout_cwd_and_beside_this_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folders = pythons.search_folders()
    assert folders[0] == ROOT and tmp_path in folders
    assert pathlib.Path(os.path.abspath(sys.prefix)).parent in folders
    for name in (".venv-b", ".venv-a", "venv-c"):
        (tmp_path / name / "bin").mkdir(parents=True)
        (tmp_path / name / "bin" / "python").touch()
    found = [p for p in pythons.candidates() if p.startswith(str(tmp_path))]
    assert found == [str(tmp_path / f".venv-{x}/bin/python") for x in "ab"]  # sorted, .venv* only
    assert os.path.join(os.path.abspath(sys.prefix), "bin", "python") not in pythons.candidates()


FAKE = {
    "/e/this": dict(python="3.13.0", jax="0.12.0", torch=None, prefix="/e"),
    "/e/.venv-3.12": dict(python="3.12.1", jax="0.12.0", torch=None, prefix="/e2"),
    "/e/.venv-3.11": dict(python="3.11.7", jax="0.10.2", torch="2.13.0", prefix="/e3"),
    "/e/.venv-old": dict(python="3.10.1", jax="0.10.2", torch=None, prefix="/e4"),
    "/e/.venv-same": dict(python="3.11.7", jax="0.10.2", torch=None, prefix="/e6"),
    "/e/.venv-bare": dict(python="3.12.0", jax=None, torch=None, prefix="/e5"),
}


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(pythons, "describe", lambda p: {"path": p} | FAKE[p])
    monkeypatch.setattr(pythons, "candidates", lambda: [p for p in FAKE if p != "/e/this"])
    monkeypatch.setattr(sys, "executable", "/e/this")


def test_torch_runs_in_the_first_environment_found_with_torch(fake):
    assert pythons.torch_python()["path"] == "/e/.venv-3.11"
    assert pythons.torch_python("/e/.venv-3.11")["torch"] == "2.13.0"
    with pytest.raises(MissingPackage, match="--torch-python /e/.venv-3.12 .*has no torch"):
        pythons.torch_python("/e/.venv-3.12")


def test_no_torch_anywhere_is_none_and_a_line_saying_where_it_looked(fake, monkeypatch):
    monkeypatch.setattr(pythons, "candidates", lambda: ["/e/.venv-3.12"])
    assert pythons.torch_python() is None
    line = pythons.no_torch_found()
    assert "\n" not in line and "--torch-python" in line and str(ROOT) in line


def test_the_jax_lines_are_this_one_then_one_per_other_jax_the_newest_python(fake):
    lines = pythons.jax_lines()
    assert [i["path"] for i in lines] == ["/e/this", "/e/.venv-3.11"]
    given = pythons.jax_lines(("/e/.venv-3.12", "/e/this"))
    assert [i["path"] for i in given] == ["/e/.venv-3.12", "/e/this"]  # as given, repeats kept
    with pytest.raises(MissingPackage, match="/e/.venv-bare .*has no JAX"):
        pythons.jax_lines(("/e/.venv-bare",))


def test_a_worker_imports_this_code_and_none_of_this_environments_paths(monkeypatch):
    mine = os.path.join(os.path.abspath(sys.prefix), "lib", "libtpu.so")
    monkeypatch.setenv("TPU_LIBRARY_PATH", mine)
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(mine), "/usr/bin"]))
    monkeypatch.setenv("SOMETHING", "kept")
    env = pythons.worker_env(EXTRA="1")
    assert "TPU_LIBRARY_PATH" not in env and env["PATH"] == "/usr/bin"
    assert env["SOMETHING"] == "kept" and env["EXTRA"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(ROOT), str(ROOT / "lab")]
