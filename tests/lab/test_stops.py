"""The lab's long commands stop cleanly: Ctrl-C (SIGINT), SIGTERM and SIGHUP while a
benchmark compiles, while the XLA-vs-eager lab waits on fresh processes, and while
`gpu-report --dry-run` runs its parts' processes; each exits 130, 143 or 129 within
seconds with one line naming the command that reruns it, writes no half record, and
leaves no process it started alive."""

import json
import signal

import pytest

from tests.stopping import STOPS, Started


@pytest.mark.parametrize("name", STOPS)
def test_a_stop_while_a_benchmark_compiles_leaves_no_record(tmp_path, name):
    out, signum = tmp_path / "decode.json", getattr(signal, name)
    run = Started(["bench", "decode", "--quick", "--out", str(out)])
    run.wait_for("err", r"tokens: speed-up")  # one length done: compiling the next
    code, seconds = run.stop(signum)
    assert code == 128 + signum and seconds < 10, run.err()
    rerun = f"jaxformer bench decode --out {out} --quick"
    said = f"jaxformer bench decode: stopped by {name}; no record written: rerun `{rerun}`"
    assert run.err()[-1] == said
    assert list(tmp_path.iterdir()) == []  # no record, no half of one
    assert run.lines["out"] == []
    assert run.survivors() == []


@pytest.mark.slow
@pytest.mark.parametrize("name", STOPS)
@pytest.mark.parametrize(
    ("part", "phase"),
    [("first-calls-train_step", r"fresh process 1/"), ("layer", r"torch._dynamo.explain")],
)
def test_a_stop_while_the_xla_vs_eager_lab_runs_a_part(tmp_path, part, phase, name):
    """In a part that starts fresh processes, and in torch's explain (whose broad
    `except Exception` once took the stop for a failure)."""
    out, signum = tmp_path / "lab", getattr(signal, name)
    argv = ["bench", "xla-vs-eager", "--quick", "--dry-run", "--allow-load", "--parts", part]
    run = Started([*argv, "--out", str(out)])
    run.wait_for("err", phase)
    code, seconds = run.stop(signum)
    assert code == 128 + signum and seconds < 15, run.err()
    assert run.err()[-1].startswith(f"jaxformer bench xla-vs-eager: stopped by {name}")
    assert run.survivors() == []
    report = json.loads((out / "report.json").read_text())  # what was measured, kept
    assert name in json.dumps(report)


@pytest.mark.parametrize("name", STOPS)
def test_a_stop_to_a_gpu_report_dry_run_ends_its_parts_processes(tmp_path, name):
    out, signum = tmp_path / "report", getattr(signal, name)
    run = Started(["gpu-report", "--dry-run", "--out", str(out)])
    _wait_for_children(run)
    code, seconds = run.stop(signum)
    assert code == 128 + signum and seconds < 10, run.err()
    said = f"jaxformer gpu-report: stopped by {name}; finished parts are kept: rerun "
    assert run.err()[-1].startswith(said), run.err()
    assert run.survivors() == []
    assert not (out / "dry_run.json").exists()  # no result of a dry run cut short


def _wait_for_children(run: Started, timeout: float = 120) -> None:
    """Until the command has started its parts' processes."""
    import time

    from jaxformer_lab.stops import descendants

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(descendants(run.proc.pid)) >= 2:
            return
        assert run.proc.poll() is None, run.err()
        time.sleep(0.1)
    raise AssertionError("the dry run started no processes")
