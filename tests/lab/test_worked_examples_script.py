"""experiments/worked_examples.py, which writes its table through the lab: the stated
values of popular explanations it finds wrong."""

import json
import subprocess
import sys


def test_worked_examples_script(tmp_path):
    run = subprocess.run(
        [sys.executable, "experiments/worked_examples.py", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["stated_values_wrong"] == 8
    assert (tmp_path / "worked_examples.md").exists()
