"""The training loop reads each step's metrics one step late: results equal a loop that
reads every step before dispatching the next (the loop's former order), and a NaN loss
still stops the run before its checkpoint or evaluation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.train import loop, setup

SMALL = dict(
    num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=64
)


def _configs(out, **run):
    model = jf.TransformerConfig.tiny(259, **SMALL, dropout_rate=0.1)
    fields = dict(
        task="copy",
        steps=6,
        batch_size=8,
        eval_every=1000,
        log_every=1,
        checkpoint_every=1000,
        eval_examples=8,
        out=str(out),
    )
    return model, jf.RunConfig.from_options(**(fields | run))


def _logged_losses(out):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_losses_and_parameters_equal_a_loop_that_reads_every_step(tmp_path):
    model_config, run = _configs(tmp_path)
    loop.train(model_config, run, progress=False)
    job = setup.set_up(model_config, run)
    state = job.placement.put(job.state, like=job.layout)
    blocking = {}
    for step in range(run.optim.steps):
        state, metrics = job.train_step(state, job.data.train_batch(step, run.optim.batch_size))
        blocking[step + 1] = float(metrics["loss"])  # waits for the step, as the loop did
    assert _logged_losses(tmp_path) == blocking
    saved, _ = checkpoints.Checkpointer(tmp_path).restore(
        checkpoints.abstract_train_state(state), job.meta
    )
    assert int(saved.step) == run.optim.steps
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_steps_metrics_are_read_after_the_next_step_is_dispatched(tmp_path, monkeypatch):
    events = []
    step_for, read = setup.Setup.step_for, loop.Meter.read

    def logged_step_for(self, done):
        fn = step_for(self, done)

        def dispatch(state, batch):
            events.append(f"dispatch {done}")
            return fn(state, batch)

        return dispatch

    def logged_read(self, step, metrics, folder):
        events.append(f"read {step}")
        return read(self, step, metrics, folder)

    monkeypatch.setattr(setup.Setup, "step_for", logged_step_for)
    monkeypatch.setattr(loop.Meter, "read", logged_read)
    loop.train(*_configs(tmp_path, steps=4, checkpoint_every=3), progress=False)
    assert events == [
        "dispatch 1",
        "dispatch 2",
        "read 1",
        "dispatch 3",
        "read 2",
        "read 3",  # before step 3's checkpoint
        "dispatch 4",
        "read 4",  # the last step: evaluated and saved
    ]


def test_a_nan_loss_on_a_checkpoint_step_stops_the_run_before_the_checkpoint(tmp_path, monkeypatch):
    bad_step = 6  # checkpoints every 2 steps
    real = setup.make_train_step

    def poisoned(*args, **kwargs):
        step = real(*args, **kwargs)

        def wrapped(state, batch):
            new_state, m = step(state, batch)
            nan = jnp.where(new_state.step >= bad_step, jnp.nan, m["loss"])
            return new_state, m | {"loss": nan}

        return wrapped

    monkeypatch.setattr(setup, "make_train_step", poisoned)
    with pytest.raises(
        loop.TrainingDiverged, match=rf"became nan at step {bad_step}; the last good checkpoint"
    ):
        loop.train(*_configs(tmp_path, steps=8, checkpoint_every=2), progress=False)
    assert checkpoints.Checkpointer(tmp_path).latest_step() == 4
    assert sorted(_logged_losses(tmp_path)) == list(range(1, bad_step))


@pytest.mark.slow  # 11 s of the quick suite; a NaN on a checkpoint step is checked there
def test_ctrl_c_saves_no_checkpoint_of_a_diverged_step(tmp_path, monkeypatch):
    """An interrupt right after step 3 (NaN) is dispatched: its held metrics are read before
    the interrupted run's checkpoint, so there is none."""
    real, read = setup.make_train_step, loop._read

    def poisoned(*args, **kwargs):
        step = real(*args, **kwargs)

        def wrapped(state, batch):
            new_state, m = step(state, batch)
            return new_state, m | {"loss": jnp.where(new_state.step >= 3, jnp.nan, m["loss"])}

        return wrapped

    def interrupt_once_step_3_is_held(runs, held, steps, keep=0):
        if keep == 1 and held[-1][0] == 3:
            raise KeyboardInterrupt
        return read(runs, held, steps, keep)

    monkeypatch.setattr(setup, "make_train_step", poisoned)
    monkeypatch.setattr(loop, "_read", interrupt_once_step_3_is_held)
    with pytest.raises(loop.TrainingDiverged, match="became nan at step 3"):
        loop.train(*_configs(tmp_path, steps=8), progress=False)
    assert checkpoints.Checkpointer(tmp_path).latest_step() is None
