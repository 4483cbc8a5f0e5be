"""jaxformer_lab.bench.rounds: a worker answers rounds on its channel whatever it prints,
and a worker that fails says why."""

import os
import pathlib
import sys

import pytest

from jaxformer_lab.bench import rounds, stats

ROOT = pathlib.Path(__file__).resolve().parents[3]
SERVE = (
    "print('printed while importing')\n"
    "from jaxformer_lab.bench import rounds\n"
    "def run(k):\n"
    "    print('a library prints this')\n"
    "    return 0.5 * k\n"
    "rounds.serve(lambda: {build})\n"
)


def start(tmp_path, build: str) -> rounds.Worker:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lab")])}
    command = [sys.executable, "-c", SERVE.format(build=build)]
    return rounds.Worker("fake", command, env, open(tmp_path / "fake.log", "w"))


def test_a_worker_runs_rounds_and_its_prints_go_to_the_log(tmp_path):
    worker = start(tmp_path, "rounds.Program(run, 7, dict(device='fake'))")
    try:
        ready = worker.ready()
        assert ready["ready"] and ready["params"] == 7 and ready["device"] == "fake"
        assert ready["peak_bytes"] is None  # the program does not say
        assert ready["initial_loss"] == 0.5 and ready["ready_s"] >= ready["first_step_s"] >= 0
        assert [worker.run(3), worker.run(4)] == [1.5, 2.0]
    finally:
        worker.close()
    assert worker.process.returncode == 0
    log = (tmp_path / "fake.log").read_text()
    assert log.count("a library prints this") == 3 and "printed while importing" in log


def test_a_failing_worker_says_why(tmp_path):
    worker = start(tmp_path, "1 / 0")
    with pytest.raises(rounds.WorkerError, match="ZeroDivisionError: division by zero"):
        worker.ready()
    worker.close()
    assert worker.process.returncode != 0
    assert "Traceback" in (tmp_path / "fake.log").read_text()


def test_a_worker_not_ready_in_time_is_stopped_and_reported(tmp_path):
    slow = {"slow": start(tmp_path, "__import__('time').sleep(120)")}
    messages = rounds.ready_all(slow, timeout_s=1)
    slow["slow"].close()
    assert messages == {"slow": {"error": "not ready within 1 s (stopped)"}}
    assert slow["slow"].process.returncode is not None


SEVERAL = (
    "import time\n"
    "from jaxformer_lab.bench import rounds\n"
    "def sleeper(seconds):\n"
    "    def run(k):\n"
    "        time.sleep(seconds * k)\n"
    "        return seconds\n"
    "    return run\n"
    "rounds.serve(lambda: {\n"
    "    'short': rounds.Program(sleeper(0.01), 1, {}, asks={'name': lambda: 'short'}),\n"
    "    'long': rounds.Program(sleeper(0.05), 2, dict(what='long')),\n"
    "})\n"
)


def test_a_worker_serves_programs_by_name_times_them_itself_and_answers_asks(tmp_path):
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lab")])}
    command = [sys.executable, "-c", SEVERAL]
    worker = rounds.Worker("several", command, env, open(tmp_path / "several.log", "w"))
    try:
        ready = worker.ready()
        programs = ready["programs"]
        assert programs["long"]["what"] == "long" and programs["short"]["params"] == 1
        assert programs["long"]["first_step_s"] >= 0.05
        assert worker.run(2, "long") == 0.05 and worker.ask("name", "short") == "short"
        timed = worker.timed(3, "short")
        assert isinstance(timed, stats.Elapsed) and 0.03 <= timed < 0.2  # the worker's clock
    finally:
        worker.close()
    assert worker.process.returncode == 0


def test_interleaved_rounds_take_a_calls_own_seconds_where_it_gives_them():
    times = stats.time_interleaved(
        {"itself": lambda: stats.Elapsed(1.5), "clocked": lambda: None}, rounds=3, warmup=0
    )
    assert times["itself"] == [1.5, 1.5, 1.5]
    assert all(0 <= t < 0.1 for t in times["clocked"])
