"""Every Python block of the README runs as written (in a fresh folder), and where a
`print(...)` line carries a comment, the comment is what it prints."""

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


def _param(block: str):
    """A block that lays a model over a mesh of 8 devices says so in a comment."""
    marks = [pytest.mark.devices(8)] if "# 8 devices" in block else []
    return pytest.param(block, marks=marks, id=block.splitlines()[0][:40])


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_python_block_runs_as_written(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
    promised = [m.strip() for m in re.findall(r"^print\(.*\)\s+# (.*)$", block, re.M)]
    prints = re.findall(r"^print\(", block, re.M)
    if promised and len(promised) == len(prints):
        assert printed.getvalue().strip().splitlines()[-len(promised) :] == promised
