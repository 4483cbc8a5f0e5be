"""One training run over two processes launched on Ray (a local head for the module): each
process gets its id and the coordinator on the first task's node, a stop passes its
signal to every process, which saves, a failed process stops the others, and the losses equal a
one-process run's; bad input is one line, exit 2, before any folder is made."""

import json
import subprocess
import sys

import pytest

from jaxformer.cli import main
from jaxformer_lab import ray_cluster, train_ray
from tests.lab.sweep.test_ray import free_port, main_stopped
from tests.parallel.test_multihost import env, losses

ray = pytest.importorskip("ray")

# A stand-in for `python -m jaxformer train`: it writes its arguments to argv<I>.json in
# the run folder, and the JAXFORMER_PROBE it sees to env<I>.json; with a file `hold`
# there it waits (to be stopped), saving on a stop signal, whose name it writes to
# saved<I>; with a file `fail<I>` it exits with the code that file holds.
FAKE = """
import json, os, pathlib, signal, sys, time
argv = sys.argv[1:]  # -m jaxformer train ...
out, i = pathlib.Path(argv[argv.index("--out") + 1]), argv[argv.index("--process-id") + 1]
(out / f"argv{i}.json").write_text(json.dumps(argv))
(out / f"env{i}.json").write_text(json.dumps(os.environ.get("JAXFORMER_PROBE")))
if (out / f"fail{i}").exists():
    sys.exit(int((out / f"fail{i}").read_text()))
if (out / "hold").exists():
    def save(signum, _):
        (out / f"saved{i}").write_text(signal.Signals(signum).name)
        sys.exit(128 + signum)
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, save)
    (out / f"holding{i}").write_text("x")
    time.sleep(120)
print("fake process", i, "done")
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "fake_python"
    path.write_text(f"#!{sys.executable}\n{FAKE}")
    path.chmod(0o755)
    monkeypatch.setattr(train_ray, "WORKER_PYTHON", str(path))
    return path


def train(address, out, *extra, hosts=2):
    return ["train", "ray", "--ray", address, "--hosts", str(hosts), *extra]


def command(address, out, hosts=2):
    return train(address, out, hosts=hosts) + ["--", "--task", "copy", "--out", str(out)]


def test_each_process_gets_its_id_and_the_first_nodes_coordinator(
    head, fake, tmp_path, monkeypatch
):
    monkeypatch.setenv("JAXFORMER_PROBE", "the driver's")  # the head's workers lack it
    out = tmp_path / "run"
    assert main(command(head, out)) == 0
    argvs = [json.loads((out / f"argv{i}.json").read_text()) for i in range(2)]
    for i, argv in enumerate(argvs):
        assert argv[:7] == ["-m", "jaxformer", "train", "--task", "copy", "--out", str(out)]
        assert argv[9:] == ["--num-processes", "2", "--process-id", str(i)]
    assert argvs[0][7:9] == argvs[1][7:9] and argvs[0][7] == "--coordinator"
    assert argvs[0][8].rpartition(":")[2].isdigit()  # the head's node: its address, a port
    assert "fake process 1 done" in (out / "train.process1.log").read_text()
    seen = [json.loads((out / f"env{i}.json").read_text()) for i in range(2)]
    assert seen == ["the driver's"] * 2


def test_a_stop_passes_its_signal_to_every_process(head, fake, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "hold").write_text("x")
    monkeypatch.setattr(sys, "argv", ["jaxformer", *command(head, out)])
    assert main_stopped(sys.argv[1:], out / "holding0", out / "holding1") == 143
    assert [(out / f"saved{i}").read_text() for i in range(2)] == ["SIGTERM"] * 2
    assert not (out / ray_cluster.STOP_FILE).exists()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "terminated by SIGTERM: every process was stopped, saving its step" in last
    assert last.endswith(f"continue with jaxformer {' '.join(command(head, out))} --resume")


def test_a_failed_process_stops_the_others(head, fake, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "hold").write_text("x")
    (out / "fail1").write_text("3")
    assert main(command(head, out)) == 3
    assert (out / "saved0").read_text() == "SIGINT"
    said = f"process 1 exited with 3 (the others were stopped): see {out}/train.process1.log"
    assert said in capsys.readouterr().err


def refused(capsys, tmp_path, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "run").exists()


def test_bad_input_is_one_line_before_any_folder(head, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    refused(capsys, tmp_path, command(head, out, hosts=0), "--hosts must be >= 1, got 0")
    refused(capsys, tmp_path, command(head, out, hosts=3), "--hosts 3: the Ray cluster at")
    refused(capsys, tmp_path, train(head, out) + ["--", "--task", "copy"], "give the run folder")
    coordinator = command(head, out) + ["--coordinator", "127.0.0.1:1234"]
    refused(capsys, tmp_path, coordinator, "--coordinator is set for each process")
    address = f"127.0.0.1:{free_port()}"
    refused(capsys, tmp_path, command(address, out), f"--ray {address}: no Ray cluster answers")
    monkeypatch.setitem(sys.modules, "ray", None)
    refused(capsys, tmp_path, command(head, out), "pip install 'jaxformer-lab[ray]'")


def test_the_placement_spreads_over_nodes_where_there_are_enough():
    cpu = {"CPU": 1.0}
    assert train_ray.strategy([{"CPU": 4}, {"CPU": 4}], 2, cpu, "a") == "STRICT_SPREAD"
    assert train_ray.strategy([{"CPU": 4}], 2, cpu, "a") == "PACK"
    assert train_ray.strategy([{"CPU": 4}, {"CPU": 1}], 1, cpu, "a") == "PACK"
    gpu = {"CPU": 1.0, "GPU": 1.0}
    with pytest.raises(ValueError, match="room for 1 process\\(es\\) of 1 CPU, 1 GPU"):
        train_ray.strategy([{"CPU": 8, "GPU": 1}, {"CPU": 8}], 2, gpu, "a")


@pytest.mark.slow  # three processes compiling from scratch
def test_two_processes_on_ray_train_like_one_process(head, tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # forwarded: each process on Ray has one device
    config = tmp_path / "model.json"
    fields = dict(num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
    config.write_text(json.dumps(fields | {"max_len": 64}))
    options = [
        *"--task copy --steps 3 --batch-size 8 --eval-every 3 --log-every 1".split(),
        *"--checkpoint-every 3 --eval-examples 8 --no-progress --mesh data=2".split(),
        *["--config", str(config), "--coordinator-timeout", "60"],
    ]
    one = subprocess.Popen(
        [sys.executable, "-m", "jaxformer", "train", *options, "--out", str(tmp_path / "one")],
        env=env(2),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        two = main(train(head, None) + ["--", *options, "--out", str(tmp_path / "two")])
        output = one.communicate(timeout=600)[0]
    finally:
        one.kill()
    logs = [(tmp_path / "two" / f"train.process{i}.log").read_text() for i in range(2)]
    assert two == 0, logs[0][-3000:] + logs[1][-3000:]
    assert one.returncode == 0, output[-3000:]
    expected = losses(tmp_path / "one")
    assert len(expected) == 3
    assert losses(tmp_path / "two") == pytest.approx(expected, rel=1e-5)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert "over 2 devices in 2 process(es)" in summary["layout"]
