"""--tracker: every number of metrics.jsonl also goes to TensorBoard (read back from the
event file itself: TFRecord framing around tensorboardX's Event protos) and to a W&B run
(offline, read back with wandb's own reader of its .wandb log: `wandb leet inspect`), with
the run's config, code version, group and job type; a tracker that cannot start is one
line and no folder, one that fails mid-run is one warning and the run goes on."""

import json
import struct
import subprocess
import sys

import pytest

from jaxformer import trackers
from jaxformer.files import code_version, read_json
from jaxformer.train import loop
from tests.train.test_loop import run_config, small_config


def scalars(folder) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every event file in `folder`."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4  # length, its CRC, the record, its CRC
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, every file it writes under tmp_path."""
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    for hooked in ("exit", "excepthook"):  # wandb's service wraps them for the process
        monkeypatch.setattr(sys, hooked, getattr(sys, hooked))


def wandb_logs(folder) -> list[list[dict]]:
    """The records of each offline W&B run of the run `folder` (its .wandb transaction logs,
    in the order made), as wandb's own reader prints them."""
    return [wandb_log(path) for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))]


def wandb_log(path) -> list[dict]:
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_logged_metrics_are_tensorboard_scalars(tmp_path):
    run = run_config(
        tmp_path / "run", steps=4, log_every=2, eval_every=4, tracker="jsonl,tensorboard"
    )
    loop.train(small_config(), run, progress=False)
    events = scalars(tmp_path / "run" / "tensorboard")
    assert {"loss", "lr", "grad_norm", "eval_loss", "exact_match"} <= set(events)
    for record in metrics(tmp_path / "run"):
        for name, value in record.items():
            if name != "step":
                assert events[name][record["step"]] == pytest.approx(value, rel=1e-6)


def test_a_wandb_run_holds_every_number_the_config_and_the_summary(tmp_path, offline):
    out = tmp_path / "run"
    run = run_config(
        out, steps=4, log_every=2, eval_every=2, log_internals=2, seed=3, tracker="wandb",
        tracker_group="my-sweep", tracker_job="base",
    )  # fmt: skip
    summary = loop.train(small_config(), run, progress=False)
    (log,) = wandb_logs(out)
    (started,) = [r["run"] for r in log if r["type"] == "run"]
    assert (started["run_group"], started["job_type"], started["project"]) == (
        "my-sweep",
        "base",
        "jaxformer",
    )
    config = started["config"]["update"]
    assert config["run"]["seed"] == 3 and config["run"]["tracker"] == "wandb"
    assert config["code"] == code_version() and config["model"]["d_model"] == 32
    assert "jax" in config["versions"]
    history = {r["history"]["step"]["num"]: r["history"]["item"] for r in log if "history" in r}
    records = metrics(out)
    assert {"loss", "eval_loss", "internals/grad_norm"} <= {k for r in records for k in r}
    for record in records:
        for name, value in record.items():
            if name != "step":
                assert history[record["step"]][name] == pytest.approx(value, rel=1e-12)
    final = {}
    for r in log:
        final |= r.get("summary", {}).get("update", {})
    assert final["eval_loss"] == pytest.approx(summary["eval_loss"], rel=1e-12)
    assert final["train_seconds"] == pytest.approx(summary["train_seconds"], rel=1e-12)
    assert summary == read_json(out / "summary.json")
    assert [r["exit"].get("exit_code", 0) for r in log if r["type"] == "exit"] == [0]


def test_a_tracker_that_fails_mid_run_warns_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    calls = []

    def broken(self, record):
        calls.append(record["step"])
        raise OSError("No space left on device")

    monkeypatch.setattr(trackers.TensorBoard, "log", broken)
    out = tmp_path / "run"
    loop.train(small_config(), run_config(out, steps=4, tracker="tensorboard"), progress=False)
    warned = [line for line in capsys.readouterr().err.splitlines() if "tracker" in line]
    assert warned == [
        "warning: the tensorboard tracker failed at step 1 (OSError: No space left on device); "
        "it is stopped, and metrics.jsonl keeps every number"
    ]
    assert calls == [1]
    assert [r["step"] for r in metrics(out) if "loss" in r] == [1, 2, 3, 4]
    assert (out / "summary.json").exists()


def _train(capsys, *argv):
    """`jaxformer train --task copy ARGV --no-progress` in this process: (exit code,
    stderr lines)."""
    from jaxformer.cli import main

    code = main(["train", "--task", "copy", "--steps", "2", *map(str, argv), "--no-progress"])
    return code, capsys.readouterr().err.strip().splitlines()


def _raises(error):
    def init(**_):
        raise error

    return init


@pytest.mark.parametrize(
    "tracker, broken, words",
    [
        ("wandbb", None, "--tracker: no tracker 'wandbb'; did you mean 'wandb'?"),
        ("jsonl,tensorboard", "tensorboardX", "pip install 'jaxformer[tensorboard]'"),
        ("wandb", "wandb", "the wandb tracker writes with wandb: pip install wandb==0.31.0"),
        ("wandb", ConnectionError("api.wandb.ai unreachable"), "(ConnectionError: api.wandb.ai"),
        ("wandb", PermissionError("API key refused\nmore"), "(PermissionError: API key refused)"),
    ],
)
def test_a_tracker_that_cannot_start_is_one_line_and_no_folder(
    tmp_path, capsys, monkeypatch, offline, tracker, broken, words
):
    if isinstance(broken, str):
        monkeypatch.setitem(sys.modules, broken, None)  # not installed
    elif broken is not None:
        import wandb

        monkeypatch.setattr(wandb, "init", _raises(broken))
    code, lines = _train(capsys, "--tracker", tracker, "--out", tmp_path / "run")
    assert code == 2 and len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_tracker_names_are_checked_and_jsonl_is_always_first():
    assert trackers.names("wandb, tensorboard") == ("jsonl", "wandb", "tensorboard")
    assert trackers.names("jsonl") == trackers.names("") == ("jsonl",)
    with pytest.raises(ValueError, match=r"no tracker 'tensorbord'; did you mean 'tensorboard'"):
        run_config("unused", tracker="jsonl,tensorbord")


def test_a_resumed_run_continues_its_wandb_run_from_the_checkpoint(tmp_path, offline):
    out, options = tmp_path / "run", dict(schedule="constant", checkpoint_every=2, log_every=1)
    loop.train(small_config(), run_config(out, steps=2, tracker="wandb", **options), progress=False)
    run = run_config(out, steps=4, tracker="wandb", **options)
    loop.train(small_config(), run, resume=True, progress=False)
    logs = wandb_logs(out)
    ids = [r["run"]["run_id"] for log in logs for r in log if r["type"] == "run"]
    steps = [sorted(r["history"]["step"]["num"] for r in log if "history" in r) for log in logs]
    assert len(ids) == 2 and ids[0] == ids[1] == (out / "wandb" / "run_id").read_text()
    assert sorted(steps) == [[1, 2], [3, 4]]
