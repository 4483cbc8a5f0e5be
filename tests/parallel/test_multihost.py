"""`jaxformer train` across processes and layouts: two processes on 127.0.0.1 (CPU
collectives over gloo) must train exactly like one process with the same four devices;
bad multi-host arguments are clear errors, never a hang."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from jaxformer.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = [
    *"-m jaxformer train --task copy --steps 5 --batch-size 8 --eval-every 5".split(),
    *"--log-every 1 --checkpoint-every 5 --eval-examples 16 --mesh".split(),
    "data=2,fsdp=2",
]


def env(devices: int) -> dict:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "lab")]),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(out: pathlib.Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.slow  # two processes compiling from scratch: 80 s on 2 cores
def test_two_processes_train_like_one_process_with_four_devices(tmp_path):
    config = tmp_path / "model.json"
    fields = dict(num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
    config.write_text(json.dumps(fields | {"max_len": 64}))
    base = [sys.executable, *TRAIN, "--config", str(config)]
    coordinator = f"127.0.0.1:{free_port()}"
    two = [
        subprocess.Popen(
            [*base, "--out", str(tmp_path / "two"), "--coordinator", coordinator]
            + ["--num-processes", "2", "--process-id", str(i), "--coordinator-timeout", "60"],
            env=env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    one = subprocess.run(
        [*base, "--out", str(tmp_path / "one")],
        env=env(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    outputs = []
    for p in two:
        try:
            outputs.append(p.communicate(timeout=600)[0])
        finally:
            p.kill()
    assert one.returncode == 0, one.stderr[-3000:]
    assert [p.returncode for p in two] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    expected = losses(tmp_path / "one")
    assert len(expected) == 5
    assert losses(tmp_path / "two") == pytest.approx(expected, rel=1e-5)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert "over 4 devices in 2 process(es)" in summary["layout"]
    # Only process 0 reports; the checkpoint is one, written together.
    assert "held-out" in outputs[0] and "held-out" not in outputs[1]
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["5"]


@pytest.mark.devices(8)
@pytest.mark.slow  # tens of seconds of cold compiling in CI; make test-all runs it
def test_cli_pmap_run_with_scan_layers_and_remat(tmp_path):
    """The loop end to end on the pmap layout, with a scanned, rematerialised model
    (checkpoint, evaluation by greedy decoding, attention plot of stacked layers)."""
    config = tmp_path / "model.json"
    sizes = dict(num_encoder_layers=1, num_decoder_layers=2, d_model=32, num_heads=2, d_ff=64)
    config.write_text(json.dumps(sizes | dict(max_len=64)))
    args = [
        *"train --task copy --steps 2 --batch-size 8 --eval-examples 8".split(),
        *"--checkpoint-every 2".split(),
        "--config",
        str(config),
        *"--no-progress --pmap --scan-layers --remat dots".split(),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(args) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["layout"] == "pmap over 8 devices" and summary["steps"] == 2
    assert summary["model_config"]["scan_layers"] and summary["model_config"]["remat"] == "dots"
    assert (tmp_path / "run" / "checkpoints" / "2").is_dir()
    assert (tmp_path / "run" / "attention.png").stat().st_size > 0


@pytest.mark.devices(8)
def test_bad_multihost_arguments_are_clear_errors(tmp_path, capsys):
    base = ["train", "--task", "copy", "--steps", "10", "--out", str(tmp_path)]
    cases = [
        (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "2"],
         "--process-id must be in [0, 1] for --num-processes=2, got 2"),
        (["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "-1"],
         "got -1"),
        (["--coordinator", "127.0.0.1", "--num-processes", "2", "--process-id", "0"],
         "coordinator must be HOST:PORT"),
        (["--num-processes", "2", "--process-id", "1"], "need --coordinator"),
        (["--coordinator", "127.0.0.1:1234"], "a coordinator HOST:PORT needs --num-processes too"),
        (["--mesh", "data=3"], "mesh data=3,fsdp=1,tensor=1 needs 3 devices, but there are 8"),
        (["--mesh", "data=2,pipeline=4"], "AXIS in ('data', 'fsdp', 'tensor')"),
        (["--mesh", "data=8", "--batch-size", "12"], "12 / 1 = 12 is not divisible by data*fsdp = 8"),
    ]  # fmt: skip
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        assert message in capsys.readouterr().err, extra


def test_unreachable_coordinator_times_out_with_a_message(tmp_path, capsys):
    """Process 1 of 2, nobody listening: a clear error after the time-out, not a hang."""
    args = ["train", "--task", "copy", "--steps", "1", "--out", str(tmp_path)]
    args += ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    assert main(args + ["--process-id", "1", "--coordinator-timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert "process 1 of 2 could not reach the coordinator" in err and "within 2 s" in err
