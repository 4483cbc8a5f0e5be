"""`jaxformer gpu-report` on a CPU: the parts of configs/gpu_report.yaml (peers first,
each within 4 minutes, benchmarks through `jaxformer bench`),
a machine without a GPU is refused (the dry run named), the dry run starts every part,
a part keeps to its budget, calls resume where the last
one stopped and merge into one summary and one markdown, and the markdown is rendered
from the parts' files."""

import json
import os
import pathlib
import subprocess
import sys
from unittest import mock

import pytest

from jaxformer import cli
from jaxformer.functional import ATTENTION
from jaxformer_lab import gpu_report, results
from jaxformer_lab.bench import plan

ROOT = pathlib.Path(__file__).resolve().parents[2]


def report(*argv: str) -> int:
    """`jaxformer gpu-report ARGV`'s exit status, run in this process as if typed."""
    with mock.patch.object(sys, "argv", ["jaxformer", "gpu-report", *argv]):
        return cli.main(["gpu-report", *argv])


ORDER = [
    "peers",
    "tests-kernels",
    "tests-rest",
    "lm-kernels",
    "lm-heads",
    "lm-remat",
    "profile",
    "attention",
    "xla_vs_eager",
    "train-step",
    "table3",
    "seeds",
    *(f"xla_vs_eager_full_{i}" for i in range(1, len(gpu_report.lab_full_groups()) + 1)),
]


def test_parts_run_in_priority_order_within_four_minutes(tmp_path):
    parts = gpu_report.parts(tmp_path, 3)
    assert [p.name for p in parts] == ORDER
    assert all(0 < p.budget_s <= gpu_report.MAX_PART_S == 240 for p in parts)
    peers = parts[0].commands[0]
    assert peers[1:5] == ["-m", "jaxformer", "bench", "gpt2-peers"] and "--batch" in peers
    assert peers[-1] == str(tmp_path / "peers" / "gpt2-peers.json")
    table3 = parts[ORDER.index("table3")]  # 3 runs share the GPU; their logs time compiles
    assert table3.env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.30", "JAX_LOG_COMPILES": "1"}


def test_the_labs_gpu_runs_fit_their_parts_and_cover_its_plan(tmp_path):
    parts = {p.name: p for p in gpu_report.parts(tmp_path, 3)}
    quick = parts["xla_vs_eager"]
    assert quick.budget_s <= 180 and "--quick" in quick.commands[0]
    limit = quick.commands[0][quick.commands[0].index("--time-limit") + 1]
    assert float(limit) < quick.budget_s  # the lab stops itself, writing, before the kill
    groups = gpu_report.lab_full_groups()
    assert [p for g in groups for p in g] == plan.GPU_FULL.part_names()
    full = [parts[f"xla_vs_eager_full_{i}"] for i in range(1, len(groups) + 1)]
    assert all(p.budget_s <= gpu_report.MAX_PART_S for p in full)
    assert {p.commands[0][p.commands[0].index("--out") + 1] for p in full} == {
        str(tmp_path / "xla_vs_eager_full")
    }  # one folder: the calls resume and merge


def test_the_test_parts_are_make_test_gpus_subset():
    makefile = (ROOT / "Makefile").read_text()
    line = makefile[makefile.index("test-gpu:") : makefile.index("# The GPU tables")]
    paths = [p for paths in gpu_report.gpu_tests().values() for p in paths]
    assert sorted(paths) == sorted(w for w in line.split() if w.startswith("tests/"))


@pytest.mark.slow  # 25 s of CI's quick suite: two dozen programs started with --help
def test_the_dry_run_starts_every_part(tmp_path):
    assert report("--dry-run", "--out", str(tmp_path)) == 0
    saved = json.loads((tmp_path / "dry_run.json").read_text())
    assert list(saved["parts"]) == ORDER
    assert {s["status"] for s in saved["parts"].values()} == {"started"}
    assert (
        saved["machine"]["jax"]
        and saved["date"]
        and saved["command"].startswith("jaxformer gpu-report --dry-run")
    )
    assert not (tmp_path / "summary.json").exists()  # a dry run touches no result


def test_lm_throughput_runs_every_registered_attention_kernel(tmp_path):
    runs = gpu_report.lm_runs()
    everything = [r for part in runs.values() for r in part]
    assert {r[0] for r in runs["kernels"]} == {"auto", *ATTENTION.names}
    grid = {(b, r) for a, b, r, h in everything if a == "auto" and h == "auto"}
    assert grid == {(b, r) for b in gpu_report.LM_BATCHES for r in gpu_report.LM_REMATS}
    assert {h for *_, h in everything} == {"auto", "dense", "chunked"}
    records = [gpu_report.lm_throughput_argv(r, tmp_path)[-1] for r in everything]
    assert len(set(records)) == len(everything)  # each run has its own record


def test_a_part_keeps_to_its_budget_and_reports_failures(tmp_path):
    slow = [sys.executable, "-c", "import time; time.sleep(30)"]
    fails = [sys.executable, "-c", "raise SystemExit(3)"]
    ok = [sys.executable, "-c", "print('fine')"]
    timed = gpu_report.run_part(gpu_report.Part("slow", 6, [slow, ok], ok), tmp_path, 6)
    assert timed["status"] == "timed out" and timed["wall_s"] < 20
    failed = gpu_report.run_part(gpu_report.Part("f", 60, [ok, fails, ok], ok), tmp_path, 60)
    assert failed["status"] == "failed (exit 3)"
    assert [r["status"] for r in failed["runs"]] == ["ok", "failed (exit 3)"]
    assert (tmp_path / "f" / "log0.txt").read_text() == "fine\n"
    going = gpu_report.Part("g", 60, [ok, fails, ok], ok, keep_going=True)
    assert gpu_report.run_part(going, tmp_path, 60)["status"] == "some failed"


PEERS = json.dumps(
    results.Record(
        [results.Table(["program", "ms"], [], "lr")], "jaxformer bench gpt2-peers", "", "", ""
    ).to_dict()
)


def fake_parts(out, jobs, budgets=(30, 30, 30)):
    """Parts named as the report's first three; each appends a line to runs.txt; the peers
    part writes its table, the first test part prints pytest's closing line."""
    names = ORDER[:3]
    code = (
        "import pathlib, sys; out = pathlib.Path(sys.argv[1]); name = sys.argv[2]\n"
        "with open(out / 'runs.txt', 'a') as f: f.write(name + '\\n')\n"
        "if name == 'peers':\n"
        "    (out / 'peers').mkdir(exist_ok=True)\n"
        f"    (out / 'peers/gpt2-peers.json').write_text({PEERS!r})\n"
        "print('3 passed in 1.00s')\n"
    )
    return [
        gpu_report.Part(n, b, [[sys.executable, "-c", code, str(out), n]], ["true"])
        for n, b in zip(names, budgets, strict=True)
    ]


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(gpu_report, "parts", fake_parts)
    found = {"device": "Fake GPU", "platform": "gpu", "jax": "0"}
    monkeypatch.setattr(gpu_report, "machine", lambda: found)


def runs(out):
    return (out / "runs.txt").read_text().split()


def test_calls_resume_and_merge_into_one_summary(tmp_path, fake, capsys):
    assert report("--parts", "peers", "--out", str(tmp_path)) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {
        "ran": {"peers": "ok"},
        "left": ["tests-kernels", "tests-rest"],
    }
    report("--out", str(tmp_path))  # the finished part is skipped
    assert runs(tmp_path) == ORDER[:3]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [c["ran"] for c in summary["calls"]] == [["peers"], ["tests-kernels", "tests-rest"]]
    assert {p["status"] for p in summary["parts"].values()} == {"ok"}
    assert summary["parts"]["peers"]["device"] == "Fake GPU"
    tables = (tmp_path / "gpu_tables.md").read_text()  # both calls' parts, in one file
    assert "## jaxformer bench gpt2-peers --batch 32" in tables and "| program | ms |" in tables
    assert "- tests-kernels (tests/functional tests/nn): `3 passed in 1.00s`" in tables
    assert tables.index("| peers | ok |") < tables.index("| tests-rest | ok |")
    report("--out", str(tmp_path))
    assert runs(tmp_path) == ORDER[:3]  # nothing left to run


def test_a_forced_part_reruns_and_a_killed_one_resumes(tmp_path, fake):
    report("--out", str(tmp_path))
    report("--parts", "tests-rest", "--force", "--out", str(tmp_path))
    assert runs(tmp_path) == [*ORDER[:3], "tests-rest"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    summary["parts"]["peers"]["status"] = "running"  # its call was killed
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    report("--out", str(tmp_path))
    assert runs(tmp_path) == [*ORDER[:3], "tests-rest", "peers"]


def test_a_call_stops_at_the_first_part_its_time_cannot_hold(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(gpu_report, "parts", lambda out, jobs: fake_parts(out, jobs, (30, 600, 30)))
    report("--budget-minutes", "1", "--out", str(tmp_path))
    assert runs(tmp_path) == ["peers"]  # tests-kernels needs 600 s of 60; order is kept


def test_the_markdown_is_rendered_from_the_parts_files(tmp_path):
    (tmp_path / "lm_throughput").mkdir()
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
    record = results.Record([], "jaxformer bench lm-throughput", "H100", "", "", data=row)
    record.write(tmp_path / "lm_throughput" / "auto-b32-none-auto.json")
    (tmp_path / "tests-rest").mkdir()
    (tmp_path / "tests-rest" / "log0.txt").write_text("....\n7 passed, 1 failed in 9.10s\n")
    record = dict(status="ok", wall_s=9.5, budget_s=240, date="2026-01-01", device="H100")
    summary = dict(
        calls=[dict(date="2026-01-01T00:00:00+00:00", command="jaxformer gpu-report", machine={})],
        parts={"tests-rest": record},
    )
    summary["calls"][0]["machine"] = dict(device="H100")
    text = gpu_report.render(summary, tmp_path)
    assert "# GPU report: H100" in text and "| tests-rest | ok | 9.5 | 240 |" in text
    assert "| auto | auto | 32 | none | 389000.5 | 31.4% | 84.2 | 3.00 |" in text
    assert "`7 passed, 1 failed in 9.10s`" in text
    assert "jaxformer bench attention" not in text  # no file, no section


def test_a_machine_without_a_gpu_is_refused_naming_the_dry_run(tmp_path):
    out = tmp_path / "x"
    command = [sys.executable, "-m", "jaxformer", "gpu-report", "--out", str(out)]
    command += ["--budget-minutes", "0.01"]  # were it not refused, no part would start
    env = os.environ | {"JAX_PLATFORMS": "cpu"}  # the CPU, even on a GPU machine
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("jaxformer gpu-report: error: no NVIDIA GPU here: JAX says")
    assert "`jaxformer gpu-report --dry-run`" in done.stderr
    assert not out.exists()


def test_unknown_parts_are_refused(tmp_path, capsys):
    assert report("--dry-run", "--parts", "peers", "bogus", "--out", str(tmp_path)) == 2
    error = capsys.readouterr().err
    assert error.startswith("jaxformer gpu-report: error: unknown parts ['bogus']")
