"""tensorboard=True: every logged number is also a TensorBoard scalar, read back here from
the event file itself (TFRecord framing around tensorboardX's Event protos)."""

import json
import struct
import sys

import pytest

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


def test_logged_metrics_are_tensorboard_scalars(tmp_path):
    run = run_config(tmp_path / "run", steps=4, log_every=2, eval_every=4, tensorboard=True)
    loop.train(small_config(), run, progress=False)
    events = scalars(tmp_path / "run" / "tensorboard")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "lr", "grad_norm", "eval_loss", "exact_match"} <= set(events)
    for record in records:
        for name, value in record.items():
            if name != "step":
                assert events[name][record["step"]] == pytest.approx(value, rel=1e-6)


def test_tensorboard_without_tensorboardx_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxformer\[tensorboard\]'"):
        loop.train(small_config(), run_config(tmp_path / "run", tensorboard=True), progress=False)
    assert not (tmp_path / "run").exists()
