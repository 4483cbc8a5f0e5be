"""The lab's size limits, read from the source with `ast`: every module docstring of
lab/jaxformer_lab stays at 15 lines or fewer (what a reader needs to use and fork the
module; the method in full and the evidence live in the docs)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB = ROOT / "lab" / "jaxformer_lab"
MAX_DOCSTRING_LINES = 15


def docstring_lines(path: pathlib.Path) -> int:
    """The lines of the module docstring of `path` as written (0 without one)."""
    docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    return 0 if docstring is None else docstring.count("\n") + 1


def test_every_lab_module_docstring_is_at_most_15_lines():
    modules = sorted(LAB.rglob("*.py"))
    assert len(modules) > 20  # the walk found the lab
    over = {p.relative_to(LAB).as_posix(): docstring_lines(p) for p in modules}
    over = {name: n for name, n in over.items() if n > MAX_DOCSTRING_LINES}
    listed = ", ".join(f"{name} ({n} lines)" for name, n in over.items())
    assert not over, f"module docstrings over {MAX_DOCSTRING_LINES} lines: {listed}"


def test_the_count_is_the_docstring_as_written(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""One\n\ntwo\n"""\n\nx = 1\n')
    assert docstring_lines(module) == 4  # the closing quotes' line counts
    module.write_text("x = 1\n")
    assert docstring_lines(module) == 0
