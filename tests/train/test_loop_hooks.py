"""Hooks: when they run (every N steps before the last; the last only with at_end), what
they see (the state and metrics of their step, after the built-in hooks), the built-in
hooks' steps (log, in-run evaluation, checkpoint), a hook that raises (the run saves the
last step done, stops with the error, and resumes), and bad hooks."""

import json

import jax
import numpy as np
import pytest

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.checks import BadType, BadValue
from jaxformer.train import Hook, loop, set_up

SMALL = dict(
    num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=64
)


def _configs(out, **run):
    fields = dict(
        task="copy", steps=10, batch_size=8, eval_every=1000, log_every=1, checkpoint_every=1000,
        eval_examples=8, out=str(out),
    )  # fmt: skip
    return jf.TransformerConfig.tiny(259, **SMALL), jf.RunConfig.from_options(**(fields | run))


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _checkpoint_steps(out):
    return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


def test_hooks_run_at_their_steps_with_the_state_of_that_step(tmp_path):
    calls = {"every 3": [], "every 5": [], "every 3, at end": []}
    params, losses, models = {}, {}, []

    def recorder(name):
        def action(context):
            state_step = int(context.setup.placement.one_copy(context.state.step))
            latest = context.folder.checkpoints.latest_step()
            calls[name].append((context.step, state_step, context.metrics["step"], latest))
            if name == "every 3, at end":  # the parameters this step left, copied to the host
                params[context.step] = jax.device_get(context.state.params)
                losses[context.step] = context.metrics["loss"]
                models.append(context.model())

        return action

    hooks = [
        Hook(3, recorder("every 3"), "every 3"),
        Hook(5, recorder("every 5"), "every 5"),
        Hook(3, recorder("every 3, at end"), "every 3, at end", at_end=True),
    ]
    model_config, run = _configs(
        tmp_path, log_every=2, eval_every=4, checkpoint_every=3, keep_checkpoints=10
    )
    summary = loop.train(model_config, run, hooks=hooks, progress=False)
    # Each hook after its steps, given the state and metrics of that step, after the
    # built-in checkpoint (every 3 steps and the last) of that step was written.
    assert calls["every 3"] == [(s, s, s, s) for s in (3, 6, 9)]
    assert calls["every 5"] == [(5, 5, 5, 3)]  # not at 10: the last step, without at_end
    assert calls["every 3, at end"] == [(s, s, s, s) for s in (3, 6, 9, 10)]
    # The built-in hooks' steps: log records every 2 steps and the last, the in-run
    # evaluation every 4 steps (the last step's is the final one), checkpoints every 3
    # steps and the last.
    records = _records(tmp_path)
    logged = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(logged) == [2, 4, 6, 8, 10]
    evaluations = [(r["step"], r["eval_pairs"]) for r in records if "eval_nll" in r]
    assert evaluations == [(4, 8), (8, 8), (10, 8)] and summary["steps"] == 10
    assert _checkpoint_steps(tmp_path) == [3, 6, 9, 10]
    assert losses[6] == logged[6] and losses[10] == logged[10]
    # The state a hook saw at the last step is the state the run saved there.
    setup = set_up(model_config, run)
    abstract = checkpoints.abstract_train_state(setup.state)
    saved, _ = checkpoints.Checkpointer(tmp_path).restore(abstract, setup.meta)
    for a, b in zip(jax.tree.leaves(saved.params), jax.tree.leaves(params[10]), strict=True):
        np.testing.assert_array_equal(a, b)
    unchanged = jax.tree.leaves(jax.tree.map(np.array_equal, params[3], params[10]))
    assert not any(unchanged)  # each call saw its own step's state
    assert isinstance(models[-1], jf.Transformer) and models[-1].config.vocab_size == 259


def test_a_hook_that_raises_stops_the_run_after_saving_and_the_run_resumes(tmp_path, capsys):
    def fails_at_4(context):
        if context.step == 4:
            raise RuntimeError("the hook's own bug")

    model_config, run = _configs(tmp_path, steps=6)
    with pytest.raises(RuntimeError, match="the hook's own bug"):
        loop.train(model_config, run, hooks=[Hook(2, fails_at_4, "fragile")], progress=False)
    assert _checkpoint_steps(tmp_path) == [4]  # the step done when the hook raised
    out, err = capsys.readouterr()
    assert out == ""  # progress=False: the stop is one line on stderr, worded for Python
    assert err.startswith("hook 'fragile' raised: saved step 4 in")
    assert err.endswith("; continue with resume=True\n") and err.count("\n") == 1
    assert max(r["step"] for r in _records(tmp_path)) == 4
    summary = loop.train(model_config, run, resume=True, progress=False)
    assert summary["steps"] == 6 and summary["steps_run"] == 2


def test_a_run_resumed_complete_runs_only_its_at_end_hooks_again(tmp_path):
    """No step runs; the at_end hooks do, given the last step's state and no metrics: the
    checkpoint (already saved), the caller's at_end hook, the final evaluation."""
    model_config, run = _configs(tmp_path, steps=3, checkpoint_every=3)
    loop.train(model_config, run, progress=False)
    seen = []
    hooks = [
        Hook(1, lambda context: seen.append("every step"), "every step"),
        Hook(1, lambda context: seen.append((context.step, context.metrics)), "end", at_end=True),
    ]
    summary = loop.train(model_config, run, resume=True, hooks=hooks, progress=False)
    assert seen == [(3, {})] and summary["steps_run"] == 0
    assert _checkpoint_steps(tmp_path) == [3]
    finals = [r for r in _records(tmp_path) if "eval_nll" in r]  # no in-run evaluation
    assert [r["step"] for r in finals] == [3, 3]  # evaluated again
    assert summary["final_eval"] == {k: v for k, v in finals[1].items() if k != "step"}


def _noop(context):
    pass


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: Hook(0, _noop, "h"), BadValue, "hook 'h': every must be >= 1, got 0"),
        (lambda: Hook(-3, _noop, "h"), BadValue, "hook 'h': every must be >= 1, got -3"),
        (lambda: Hook(2.0, _noop, "h"), BadType, "hook 'h': every must be an int, got 2.0"),
        (lambda: Hook(2, "evaluate", "h"), BadType, "hook 'h': action must be callable .* got str"),
        (lambda: Hook(2, _noop, None), BadType, "a hook's name must be a str, got NoneType"),
        (lambda: Hook(2, _noop, "h", at_end=1), BadType, "hook 'h': at_end must be a bool"),
    ],
)
def test_bad_hooks(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(
    "hooks, match",
    [
        (Hook(2, _noop, "h"), "hooks must be a list or tuple, got Hook"),
        ([Hook(2, _noop, "h"), _noop], "hooks\\[1\\] must be a Hook, got function"),
    ],
)
def test_bad_hook_lists_fail_before_the_run_folder_exists(tmp_path, hooks, match):
    with pytest.raises(BadType, match=match):
        loop.train(*_configs(tmp_path / "run"), hooks=hooks, progress=False)
    assert not (tmp_path / "run").exists()


def test_when_a_hook_is_due():
    steps = range(1, 11)
    assert [s for s in steps if Hook(3, _noop, "h").due(s, 10)] == [3, 6, 9]
    assert [s for s in steps if Hook(3, _noop, "h", at_end=True).due(s, 10)] == [3, 6, 9, 10]
    assert [s for s in steps if Hook(5, _noop, "h").due(s, 10)] == [5]
    assert [s for s in steps if Hook(5, _noop, "h", at_end=True).due(s, 10)] == [5, 10]
    assert [s for s in steps if Hook(20, _noop, "h", at_end=True).due(s, 10)] == [10]
