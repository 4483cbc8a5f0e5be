"""`jaxformer bench first-hour` on a stand-in checkout: a clone of its commit runs each
step's make target as a user would (no CI variables, an empty pip cache when cold), and the
record times each install and run and sums each command; a failing step names itself."""

import subprocess

import pytest

from jaxformer.checks import BadValue
from jaxformer_lab.bench import first_hour

MAKEFILE = """\
.venv/.installed-run:
\ttest -z "$$CI" && test -n "$$PIP_CACHE_DIR"  # a user's shell, pip's cache empty
\tmkdir -p .venv && touch $@ && touch env.txt
train: .venv/.installed-run
\tcat env.txt
.venv/.installed-dev: .venv/.installed-run
\ttouch $@
test: .venv/.installed-dev
\t@test -f env.txt && echo "3 passed"
"""


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "Makefile").write_text(MAKEFILE)
    for command in (["init", "-q"], ["add", "Makefile"], ["commit", "-qm", "a stand-in"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *command], cwd=root)
    monkeypatch.setattr(first_hour, "ROOT", root)
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("PIP_CACHE_DIR", raising=False)
    return root


def test_each_step_is_timed_in_a_fresh_clone_as_a_user_runs_it(checkout):
    record = first_hour.run(first_hour.FirstHourOptions())
    steps = record.data["steps"]
    assert [s["target"] for s in steps] == [
        t for p in ("train", "test") for _, t in first_hour.STEPS[p]
    ]
    assert record.data["headline"]["pip_cache"] == "cold"
    assert record.data["headline"]["train"] == pytest.approx(sum(s["wall_s"] for s in steps[:2]))
    rows = record.tables[0].rows
    assert rows[-2][0] == "**make train from a fresh clone**" and rows[-1][0].startswith(
        "**make test"
    )
    assert not (checkout / ".venv").exists()  # the clone ran it, not the checkout
    assert "fresh clone of jaxformer at commit" in record.source
    low, high = sorted(record.data["headline"]["gemm_gflops"])
    assert 0 < low <= high and f"{low:.0f}-{high:.0f} GFLOP/s" in record.summary
    assert record.summary.startswith("From a fresh clone, pip's cache cold, `make train` took")
    assert record.data["line"] == "an environment that did not start"  # the stand-in's .venv


def test_the_gemm_rate_is_the_products_flops_over_the_best_time(monkeypatch):
    times = iter([5.0, 4.0, 2.0, 3.0, 6.0] * 2)
    monkeypatch.setattr(first_hour, "_seconds", lambda fn: next(times))
    assert first_hour.gemm_gflops(n=1000, repeats=5) == pytest.approx(2 * 1000**3 / 2.0 / 1e9)


def test_a_failing_step_names_itself_its_last_line_and_the_failed_tests(checkout):
    failing = 'echo "FAILED tests/t.py::test_x - boom"; echo "1 failed"; exit 1'
    (checkout / "Makefile").write_text(MAKEFILE.replace('echo "3 passed"', failing))
    subprocess.run(["git", "commit", "-qam", "fails", "--author", "t <t@t>"], cwd=checkout,
                   env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})  # fmt: skip
    with pytest.raises(
        RuntimeError,
        match=r"exited with 2 after \d+ s: 1 failed\n  FAILED tests/t.py::test_x - boom$",
    ):
        first_hour.run(first_hour.FirstHourOptions(parts=("test",)))


def test_unknown_parts_are_one_line():
    with pytest.raises(BadValue, match="--parts lint: choose from train test"):
        first_hour.FirstHourOptions(parts=("train", "lint"))


def test_a_lab_run_outside_a_checkout_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(first_hour, "ROOT", tmp_path)  # an installed lab: no git checkout
    with pytest.raises(BadValue, match=f"clones the checkout it runs from, and {tmp_path} is not"):
        first_hour.run(first_hour.FirstHourOptions())
