"""`jaxformer eval` where lm-eval is not installed (the default line): one line naming the
extra (tests/lab/test_lm_eval.py, which needs lm-eval, is skipped there)."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None, reason="lm-eval installed")
def test_without_lm_eval_the_command_names_the_extra_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "jaxformer", "eval", str(tmp_path), "--tasks", "tiny_facts"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "lab[eval]" in done.stderr and "lm-eval" in done.stderr
