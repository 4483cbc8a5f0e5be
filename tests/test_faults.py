"""A training process stopped by SIGTERM, or killed with SIGKILL five times (at random
moments and once inside a checkpoint write), and restarted with --resume, ends exactly
where an uninterrupted run ends; a resume from a checkpoint cut short is one error line."""

import json
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest

from jaxformer.checkpoints import Checkpointer
from tests.train.test_loop import KILLER, cli_env, config_file, losses

STEPS = 120
# The summary's fields that time the run (they differ between any two runs).
TIMES = (
    "wall_seconds",
    "eval_seconds",
    "train_seconds",
    "seconds_to_first_step",
    "train_tokens_per_second",
    "steps_run",
)


def _logged_step(out) -> int:
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in lines), default=0)


def _train(args, out, *extra):
    """`jaxformer train ARGS --out OUT EXTRA` to its end: the summary without its times."""
    command = [sys.executable, "-m", "jaxformer", *args, "--out", str(out), *extra]
    done = subprocess.run(command, env=cli_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    summary["run"].pop("out")
    return {k: v for k, v in summary.items() if k not in TIMES}


@pytest.mark.slow  # three trainings in processes: 35 s of the quick suite (Ctrl-C: test_loop)
def test_sigterm_saves_the_step_in_flight_and_the_resumed_run_ends_as_an_unstopped_one(tmp_path):
    """What `kill`, `timeout`, `docker stop` or a scheduler's preemption sends: the process
    saves the step it was running, says so in one line and exits with 143 (128 + 15); the
    resumed run's summary and losses equal an uninterrupted run's."""
    steps = 200  # each a few ms: the signal lands a few steps in, far from the end
    args = [
        *f"train --task copy --steps {steps} --checkpoint-every 1000".split(),
        *"--log-every 1 --eval-every 1000 --batch-size 8 --eval-examples 8".split(),
        *"--schedule constant --lr 0.003 --no-progress --config".split(),
        config_file(tmp_path),
    ]
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxformer", *args, "--out", str(stopped)],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while _logged_step(stopped) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    saved = Checkpointer(stopped).latest_step()
    assert 3 <= saved < steps and not (stopped / "summary.json").exists()
    where = stopped.resolve() / "checkpoints"
    said = f"terminated by SIGTERM: saved step {saved} in {where}; continue with "
    said += shlex.join(["jaxformer", *args, "--out", str(stopped), "--resume"])
    assert stdout == "" and [line for line in stderr.splitlines() if "saved" in line] == [said]
    assert _train(args, stopped, "--resume") == _train(args, tmp_path / "straight")
    assert losses(stopped) == losses(tmp_path / "straight")


@pytest.mark.slow  # five killed processes: about a minute; test_loop's kill-during-write test covers one kill in make test
def test_five_sigkills_then_the_same_final_loss(tmp_path):
    args = [
        *"train --task copy".split(),
        "--steps",
        str(STEPS),
        *"--checkpoint-every 7 --log-every 1 --eval-every 1000".split(),
        "--config",
        config_file(tmp_path),
        *"--batch-size 8 --eval-examples 8 --schedule constant --lr 0.003".split(),
        *"--no-progress --resume".split(),
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run = subprocess.run(
        [sys.executable, "-m", "jaxformer", *args, "--out", str(straight)],
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr

    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    rng = random.Random(1234)
    for kill in range(5):
        if kill == 2:
            # Inside a checkpoint write: the 3rd finalize is in this process's 2nd save.
            proc = subprocess.Popen(
                [sys.executable, str(script), *args, "--out", str(killed)],
                env=cli_env() | {"KILL_AT_FINALIZE": "3"},
            )
            assert proc.wait(timeout=300) == -signal.SIGKILL
            continue
        target = 20 * (kill + 1) + rng.randint(0, 9)
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxformer", *args, "--out", str(killed)],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 300
        while _logged_step(killed) < target and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.2))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read().decode()
        assert _logged_step(killed) < STEPS
    final = subprocess.run(
        [sys.executable, "-m", "jaxformer", *args, "--out", str(killed)],
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert final.returncode == 0, final.stderr
    want, got = losses(straight), losses(killed)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == want
    assert got[STEPS] == want[STEPS]


@pytest.mark.slow  # three trainings in processes: 40 s of a quiet 2-core CPU
def test_sigterm_to_seeds_trained_as_one_program_saves_every_seed_and_resumes_exactly(tmp_path):
    """`train --seeds`: SIGTERM saves each seed's step in flight in its own folder, and the
    resumed seeds end with the losses and evaluation of an unstopped group."""
    args = [
        *"train --task copy --steps 200 --checkpoint-every 1000 --seeds 0 1".split(),
        *"--log-every 1 --eval-every 1000 --batch-size 8 --eval-examples 8".split(),
        *"--schedule constant --lr 0.003 --no-progress --config".split(),
        config_file(tmp_path),
    ]
    stopped = tmp_path / "stopped"
    command = [sys.executable, "-m", "jaxformer", *args, "--out", str(stopped)]
    proc = subprocess.Popen(command, env=cli_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while _logged_step(stopped / "seed1") < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    saved = [Checkpointer(stopped / f"seed{s}").latest_step() for s in (0, 1)]
    assert saved[0] == saved[1] and 3 <= saved[0] < 200
    assert len([line for line in stderr.splitlines() if "terminated by SIGTERM" in line]) == 2
    for extra, out in (("--resume", stopped), (None, tmp_path / "straight")):
        run = [*command[:-1], str(out), *([extra] if extra else [])]
        assert subprocess.run(run, env=cli_env(), capture_output=True).returncode == 0
    for seed in ("seed0", "seed1"):
        assert losses(stopped / seed) == losses(tmp_path / "straight" / seed)
        summaries = [
            json.loads((o / seed / "summary.json").read_text())
            for o in (stopped, tmp_path / "straight")
        ]
        assert summaries[0]["eval_nll"] == summaries[1]["eval_nll"]


@pytest.mark.slow  # four processes; test_bad_input's truncated checkpoints check in-process
def test_a_resume_from_truncated_checkpoint_shards_prints_one_line(tmp_path):
    """The latest checkpoint's data files cut to half their size (a full disk, a partial
    copy): the resume exits with 2 and stderr is the one line naming the checkpoint, with
    no traceback of the reads orbax left unfinished when the first one failed."""
    args = [
        *"train --task copy --steps 2 --checkpoint-every 1 --eval-every 1000".split(),
        *"--batch-size 2 --eval-examples 2 --schedule constant --no-progress --config".split(),
        config_file(tmp_path),
        "--out",
        str(tmp_path / "run"),
    ]
    command = [sys.executable, "-m", "jaxformer", *args]
    assert subprocess.run(command, env=cli_env(), capture_output=True).returncode == 0
    step = tmp_path / "run" / "checkpoints" / "2"
    shards = sorted(step.glob("*/d/*"))  # the params' and the optimizer state's
    assert len(shards) >= 2
    for shard in shards:
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    for _ in range(3):  # each try leaves reads unfinished only when one fails before the rest
        done = subprocess.run([*command, "--resume"], env=cli_env(), capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(
            f"jaxformer train: error: checkpoint {step.resolve()} cannot be read"
        )
