"""experiments/gpu_report.py on a CPU: the dry run starts every step, a step keeps to its
budget, and the markdown is rendered from the steps' files."""

import importlib.util
import json
import pathlib
import sys

import pytest

from jaxformer.functional import ATTENTION

PATH = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "gpu_report.py"
spec = importlib.util.spec_from_file_location("gpu_report", PATH)
gpu_report = sys.modules["gpu_report"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_report)


def test_the_dry_run_starts_every_step(tmp_path):
    summary = gpu_report.main(["--dry-run", "--out", str(tmp_path)])
    names = [s.name for s in gpu_report.steps(tmp_path, 1)]
    assert list(summary["steps"]) == names
    assert {s["status"] for s in summary["steps"].values()} == {"started"}
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["machine"]["jax"] and saved["date"] and "--dry-run" in saved["command"]
    tables = (tmp_path / "gpu_tables.md").read_text()
    assert all(f"| {name} | started |" in tables for name in names)


def test_lm_throughput_runs_every_registered_attention_kernel(tmp_path):
    argvs = gpu_report.lm_throughput_argvs(tmp_path)
    kernels = {a[a.index("--attention") + 1] for a in argvs}
    assert kernels == {"auto", *ATTENTION.names}
    grid = {(a[3], a[5]) for a in argvs if a[1] == "auto" and a[7] == "auto"}
    assert grid == {(str(b), r) for b in gpu_report.LM_BATCHES for r in gpu_report.LM_REMATS}
    assert len({a[-1] for a in argvs}) == len(argvs)  # each run has its own folder


def test_a_step_keeps_to_its_budget_and_reports_failures(tmp_path):
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    fails = [sys.executable, "-c", "raise SystemExit(3)"]
    ok = [sys.executable, "-c", "print('fine')"]
    timed = gpu_report.run_step(gpu_report.Step("slow", 6, [slow, ok], ok), tmp_path, 6)
    assert timed["status"] == "timed out" and timed["wall_s"] < 20
    failed = gpu_report.run_step(gpu_report.Step("f", 60, [ok, fails, ok], ok), tmp_path, 60)
    assert failed["status"] == "failed (exit 3)"
    assert [r["status"] for r in failed["runs"]] == ["ok", "failed (exit 3)"]
    assert (tmp_path / "f" / "log0.txt").read_text() == "fine\n"


def test_the_markdown_is_rendered_from_the_steps_files(tmp_path):
    run = tmp_path / "lm_throughput" / "auto-b32-none-auto"
    run.mkdir(parents=True)
    row = dict(
        attention="auto",
        lm_head="auto",
        batch=32,
        remat="none",
        mfu=0.3141,
        tokens_per_second=389000.5,
        step_ms=84.2,
        temp_bytes=3 * 2**30,
    )
    (run / "lm_throughput.json").write_text(json.dumps(row))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "log0.txt").write_text("....\n7 passed, 1 failed in 9.10s\n")
    summary = dict(
        date="2026-01-01T00:00:00+00:00",
        command="gpu_report.py",
        machine=dict(device="H100"),
        steps={"tests": dict(status="ok", wall_s=9.5, budget_s=300)},
    )
    text = gpu_report.render(summary, tmp_path)
    assert "# GPU report: H100" in text and "| tests | ok | 9.5 | 300 |" in text
    assert "| auto | auto | 32 | none | 389000.5 | 31.4% | 84.2 | 3.00 |" in text
    assert "`7 passed, 1 failed in 9.10s`" in text
    assert "Attention kernels" not in text  # no file, no section


def test_unknown_steps_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_report.main(["--dry-run", "--only", "tests", "bogus", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "unknown steps ['bogus']" in capsys.readouterr().err
