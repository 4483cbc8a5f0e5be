"""The README's usage example runs as written and prints what its comment says."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_usage_example_runs_as_written():
    text = README.read_text()
    block = re.search(r"## Usage\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {})
    promised = re.search(r"print\(.*\)\s+# (.*)", block).group(1).strip()
    assert printed.getvalue().strip() == promised
