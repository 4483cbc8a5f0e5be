"""A training process killed with SIGKILL five times, at random moments and once inside a
checkpoint write, and restarted each time with --resume, ends exactly where an
uninterrupted run ends."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.train.test_loop import KILLER, cli_env, config_file, losses

STEPS = 120


def _logged_step(out) -> int:
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in lines), default=0)


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
