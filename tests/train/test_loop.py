"""The training loop, checkpoints, resume, faults and the `jaxformer train` command."""

import dataclasses
import gc
import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import checkpoints
from jaxformer.cli import main
from jaxformer.files import code_version, describe_device
from jaxformer.train import evaluate, loop, run_folder, setup

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = dict(
    num_encoder_layers=1, num_decoder_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=64
)


def small_config(**overrides):
    return jf.TransformerConfig.tiny(259, **SMALL).replace(**overrides)


def run_config(out, **overrides):
    fields = dict(
        task="copy",
        steps=20,
        batch_size=8,
        eval_every=1000,
        log_every=1,
        checkpoint_every=10,
        eval_examples=16,
        out=str(out),
    )
    return jf.RunConfig.from_options(**(fields | overrides))


def losses(out):
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def cli_env():
    """The test process's platform, precision and XLA flags (conftest: CPU, or the GPU with
    deterministic reductions), but one device: runs are compared to the bit."""
    flags = [f for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "lab")]),
        XLA_FLAGS=" ".join(flags),
    )


def config_file(tmp_path, **overrides):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(SMALL | overrides))
    return str(path)


def test_resume_is_bit_exact(tmp_path):
    """20 steps, and 10 steps resumed to 20, give the same losses bit for bit."""
    paper = dict(schedule="paper", lr=0.5)  # no horizon: the run may be extended
    straight = tmp_path / "straight"
    loop.train(small_config(dropout_rate=0.1), run_config(straight, **paper), progress=False)
    split = tmp_path / "split"
    loop.train(small_config(dropout_rate=0.1), run_config(split, steps=10, **paper), progress=False)
    summary = loop.train(
        small_config(dropout_rate=0.1), run_config(split, **paper), resume=True, progress=False
    )
    a, b = losses(straight), losses(split)
    assert sorted(b) == list(range(1, 21))
    assert [a[s] for s in range(11, 21)] == [b[s] for s in range(11, 21)]
    assert summary["steps"] == 20 and summary["steps_run"] == 10
    saved = json.loads((split / "summary.json").read_text())
    for key in (
        "exact_match",
        "token_accuracy",
        "eval_loss",
        "eval_nll",
        "eval_perplexity",
        "steps",
        "wall_seconds",
        "params",
        "model_config",
    ):
        assert key in saved
    assert saved["eval_perplexity"] == pytest.approx(math.exp(saved["eval_nll"]), rel=1e-5)
    assert saved["eval_loss"] > saved["eval_nll"]  # label smoothing 0.1 adds to the NLL
    assert (split / "loss.png").stat().st_size > 0 and (split / "attention.png").stat().st_size > 0


@pytest.mark.slow  # 13 s of the quick suite; test_resume_is_bit_exact resumes there
def test_a_resumed_run_adds_its_time_to_the_kept_steps_time(tmp_path):
    """wall_seconds and eval_seconds are the whole run's: a resume continues the running
    totals of the records it keeps (here edited to 2,000 s and 1,000 s), so train_seconds
    (the difference) is not inflated by an earlier process's evaluations."""
    paper = dict(schedule="paper", lr=0.5, eval_every=5)  # no horizon: may be extended
    loop.train(small_config(), run_config(tmp_path, steps=10, **paper), progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_seconds" in r] == [5]  # 10: the final one
    for r in records:
        if r["step"] == 10 and "wall_seconds" in r:
            r["wall_seconds"] = 2000.0
        if "eval_seconds" in r:
            r["eval_seconds"] = 1000.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = loop.train(small_config(), run_config(tmp_path, **paper), resume=True, progress=False)
    assert 2000 < summary["wall_seconds"] < 2000 + 120
    assert 1000 < summary["eval_seconds"] < 1000 + 60
    assert 0 < summary["train_seconds"] < 1000 + 120


def test_existing_checkpoints_need_resume_and_matching_config(tmp_path, capsys):
    loop.train(small_config(), run_config(tmp_path, steps=3, checkpoint_every=3), progress=False)
    assert capsys.readouterr().out == ""  # progress=False prints nothing
    with pytest.raises(ValueError, match=r"already holds checkpoints .*; pass resume=True to"):
        loop.train(small_config(), run_config(tmp_path, steps=6), progress=False)
    with pytest.raises(
        ValueError, match=r"different configuration: d_model=32 \(checkpoint\) vs 48 \(now\)"
    ):
        loop.train(
            small_config(d_model=48), run_config(tmp_path, steps=6), resume=True, progress=False
        )
    with pytest.raises(ValueError, match=r"batch_size=8 \(checkpoint\) vs 16 \(now\)"):
        loop.train(
            small_config(),
            run_config(tmp_path, steps=3, batch_size=16),
            resume=True,
            progress=False,
        )
    with pytest.raises(ValueError, match=r"cosine_total_steps=3 \(checkpoint\) vs 6 \(now\)"):
        loop.train(small_config(), run_config(tmp_path, steps=6), resume=True, progress=False)
    summary = loop.train(small_config(), run_config(tmp_path, steps=3), resume=True)
    out = capsys.readouterr().out
    assert summary["steps"] == 3 and summary["steps_run"] == 0
    assert "the run was already complete (3 of 3 steps done): nothing left to train" in out
    assert "3 steps in" in out and "no steps in this process" in out and "4-3" not in out


def test_nan_loss_stops_with_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = setup.make_train_step

    def poisoned(*args, **kwargs):
        step = real(*args, **kwargs)

        def wrapped(state, batch):
            new_state, m = step(state, batch)
            return new_state, m | {"loss": jnp.where(new_state.step >= 7, jnp.nan, m["loss"])}

        return wrapped

    monkeypatch.setattr(setup, "make_train_step", poisoned)
    with pytest.raises(
        loop.TrainingDiverged, match=r"became nan at step 7; the last good checkpoint \(step 5\)"
    ):
        loop.train(small_config(), run_config(tmp_path, checkpoint_every=5), progress=False)
    assert checkpoints.Checkpointer(tmp_path).latest_step() == 5


def test_restore_model_for_inference(tmp_path, capsys):
    loop.train(small_config(vocab_size=320), run_config(tmp_path, steps=2))
    model, tokenizer = checkpoints.restore_model(tmp_path)
    assert isinstance(model, jf.Transformer) and tokenizer.vocab_size == 259
    assert model.config.vocab_size == 259  # the tokenizer's, and the run says so:
    assert (
        "vocabulary of 259 ids (the tokenizer's; the model config said 320)"
        in capsys.readouterr().out
    )
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        checkpoints.restore_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a `jaxformer train --out` folder"):
        checkpoints.restore_model(tmp_path / "empty")


def test_a_run_fine_tunes_another_runs_model_on_its_own_data(tmp_path):
    """init_from a jaxformer run folder (a pre-training stage): the new run starts from that
    run's last parameters, architecture and BPE tokenizer (the model options given are not
    used) with a fresh optimizer and step, and trains on its own pairs in its own folder."""
    words = "the cat sat on a red mat and ran to the big dog".split()
    for name, turn in (("pre.tsv", 3), ("tuned.tsv", 5)):
        pairs = [" ".join(words[i % 12 :][:turn]) for i in range(60)]
        (tmp_path / name).write_text("".join(f"{p}\t{p[::-1]}\n" for p in pairs))
    data = dict(task=None, seq_len=32, steps=2)
    first = tmp_path / "pretrained"
    pre = run_config(first, data_tsv=str(tmp_path / "pre.tsv"), tokenizer="bpe", **data)
    loop.train(small_config(), pre, progress=False)
    pretrained, _ = checkpoints.restore_model(first)
    run = run_config(
        tmp_path / "tuned", data_tsv=str(tmp_path / "tuned.tsv"), init_from=str(first), **data
    )
    tuned = setup.set_up(small_config(d_model=64), run)
    assert tuned.config == pretrained.config and tuned.config.d_model == 32
    flat = jax.tree.leaves(nnx.split(pretrained)[1])
    assert all(
        (a == b).all() for a, b in zip(jax.tree.leaves(tuned.state.params), flat, strict=True)
    )
    assert int(tuned.state.step) == 0
    summary = loop.train(small_config(d_model=64), run, progress=False)
    assert summary["steps_run"] == 2 and summary["params"] == tuned.param_count
    tokenizer = (first / "tokenizer.json").read_text()
    assert '"BPE"' in tokenizer and (tmp_path / "tuned" / "tokenizer.json").read_text() == tokenizer


KILLER = """
import os, signal, sys
import orbax.checkpoint as ocp
from jaxformer.cli import main

finalize = ocp.StandardCheckpointHandler.finalize
calls = 0

def finalize_then_die(self, directory):
    global calls
    calls += 1
    if calls == int(os.environ["KILL_AT_FINALIZE"]):
        os.kill(os.getpid(), signal.SIGKILL)  # files written, folder not yet renamed
    return finalize(self, directory)

ocp.StandardCheckpointHandler.finalize = finalize_then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # three CLI runs, 31 s; test_resume_is_bit_exact stays in the quick suite
def test_kill_during_checkpoint_write_then_resume(tmp_path):
    args = [
        *"train --task copy --steps 12 --checkpoint-every 4 --log-every 1".split(),
        *"--eval-every 100".split(),
        "--config",
        config_file(tmp_path),
        *"--batch-size 8 --eval-examples 8".split(),
    ]
    killed_out, straight_out = tmp_path / "killed", tmp_path / "straight"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    # Each save finalizes two items (params, train state): the 3rd call is inside step 8's save.
    env = cli_env() | {"KILL_AT_FINALIZE": "3"}
    run = subprocess.run(
        [sys.executable, str(script), *args, "--out", str(killed_out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    ckpt = killed_out / "checkpoints"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["4"]
    assert any("tmp" in p.name for p in ckpt.iterdir())  # the unfinished write
    resumed = subprocess.run(
        [sys.executable, "-m", "jaxformer", *args, "--out", str(killed_out), "--resume"],
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 4" in resumed.stdout
    # The same one-device environment as the killed run (this process has 8 CPU devices).
    straight = subprocess.run(
        [sys.executable, "-m", "jaxformer", *args, "--out", str(straight_out)],
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert straight.returncode == 0, straight.stderr
    assert losses(killed_out) == losses(straight_out)


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_saves_and_exits_with_its_code(tmp_path, name):
    """Ctrl-C (130), SIGTERM (143) or a closed terminal's SIGHUP (129) while steps run:
    the step in flight is saved, one line says so with the command that continues, and
    the command leaves no process behind (test_faults: the resumed run ends as an
    unstopped one)."""
    from tests.stopping import Started

    out, signum = tmp_path / "run", getattr(signal, name)
    args = [
        *"train --task copy --steps 100000 --checkpoint-every 100000 --log-every 1".split(),
        "--config",
        config_file(tmp_path),
        *"--batch-size 8 --eval-examples 8 --no-progress".split(),
        "--out",
        str(out),
    ]
    run = Started(args, env={"XLA_FLAGS": cli_env()["XLA_FLAGS"]})
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (
        metrics.exists() and metrics.read_text().count("\n") >= 3
    ):
        time.sleep(0.2)
    code, seconds = run.stop(signum)
    assert code == 128 + signum and seconds < 10, run.err()
    assert run.lines["out"] == []  # --no-progress; the stop is one line on stderr
    said = [line for line in run.err() if "saved step" in line]
    why = "interrupted" if name == "SIGINT" else f"terminated by {name}"
    assert len(said) == 1 and said[0].startswith(f"{why}: saved step"), run.err()
    assert said[0].endswith(f" --out {out} --resume")  # the command as run, to paste
    step = checkpoints.Checkpointer(out).latest_step()
    assert step is not None and step >= 3
    assert run.survivors() == []


NEEDS_SIGHUP = pytest.mark.skipif(
    not hasattr(signal, "SIGHUP")
    or threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL,
    reason="needs POSIX signals in the main thread, SIGHUP not taken by the test runner",
)


@NEEDS_SIGHUP
def test_a_hang_up_during_a_step_lets_it_finish_saves_it_and_raises_terminated(
    tmp_path, capsys, monkeypatch
):
    """SIGHUP (as SIGTERM) arriving while step 3 runs: step 3 completes, is saved, one line
    on stderr says so, and train raises Terminated; the handler is put back."""
    real = setup.Setup.step_for

    def step_for(self, done):
        step = real(self, done)
        if done != 3:
            return step

        def hang_up_during(state, batch):
            os.kill(os.getpid(), signal.SIGHUP)  # its handler runs here, inside the step
            return step(state, batch)

        return hang_up_during

    monkeypatch.setattr(setup.Setup, "step_for", step_for)
    with pytest.raises(loop.Terminated) as stopped:
        loop.train(small_config(), run_config(tmp_path, steps=6), progress=False)
    assert stopped.value.signum == signal.SIGHUP and isinstance(stopped.value, KeyboardInterrupt)
    assert checkpoints.Checkpointer(tmp_path).latest_step() == 3
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    out, err = capsys.readouterr()
    where = tmp_path.resolve() / "checkpoints"
    assert out == ""
    assert err == f"terminated by SIGHUP: saved step 3 in {where}; continue with resume=True\n"


@NEEDS_SIGHUP
def test_a_stop_repeated_while_the_step_is_saved_is_dropped(tmp_path, capsys, monkeypatch):
    """A second SIGHUP while the first's save runs (a stop that reaches a sweep's run from
    the terminal and again from the sweep): the save completes and the first stop is raised."""
    real_step, real_save = setup.Setup.step_for, run_folder.RunFolder.save
    sent = []

    def step_for(self, done):
        step = real_step(self, done)
        if done != 3:
            return step

        def hang_up_during(state, batch):
            sent.append(os.kill(os.getpid(), signal.SIGHUP))
            return step(state, batch)

        return hang_up_during

    def save(self, state):
        if len(sent) == 1:  # the stop's save: the stop comes again
            sent.append(os.kill(os.getpid(), signal.SIGHUP))
        return real_save(self, state)

    monkeypatch.setattr(setup.Setup, "step_for", step_for)
    monkeypatch.setattr(run_folder.RunFolder, "save", save)
    with pytest.raises(loop.Terminated) as stopped:
        loop.train(small_config(), run_config(tmp_path, steps=6), progress=False)
    assert checkpoints.Checkpointer(tmp_path).latest_step() == 3
    assert len(sent) == 2 and stopped.value.signum == signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    where = tmp_path.resolve() / "checkpoints"
    assert capsys.readouterr().err == (
        f"terminated by SIGHUP: saved step 3 in {where}; continue with resume=True\n"
    )


@NEEDS_SIGHUP
def test_a_stop_before_the_first_step_leaves_no_folder_and_says_so(tmp_path, capsys, monkeypatch):
    """SIGHUP once the run folder is started, before its first step: nothing to save, the
    folder goes (as on bad input), and one line says so with how to continue."""
    real = loop._start

    def start(*args, **kwargs):
        started = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGHUP)  # its handler raises here
        return started

    monkeypatch.setattr(loop, "_start", start)
    with pytest.raises(loop.Terminated):
        loop.train(small_config(), run_config(tmp_path / "run", steps=6), progress=False)
    assert not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (
        "terminated by SIGHUP before the first step: nothing to save; continue with resume=True\n"
    )


def test_a_stop_while_the_first_step_compiles_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """SIGTERM while the first step traces and compiles stops at once (not after the
    step): nothing to save, the folder goes, one line says so."""
    real_step = setup.Setup.step_for

    def step_for(self, done):
        step = real_step(self, done)

        def terminated_while_tracing(state, batch):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler raises here
            return step(state, batch)

        return terminated_while_tracing if done == 1 else step

    monkeypatch.setattr(setup.Setup, "step_for", step_for)
    with pytest.raises(loop.Terminated):
        loop.train(small_config(), run_config(tmp_path / "run", steps=6), progress=False)
    assert not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (
        "terminated by SIGTERM before the first step: nothing to save; continue with resume=True\n"
    )


@NEEDS_SIGHUP
def test_a_stop_dropped_in_a_garbage_collector_callback_is_sent_again():
    """A stop whose handler runs inside a gc callback (JAX has one) raises there, where
    Python prints and drops the exception: it is sent again, and stops the job."""
    from jaxformer.signals import stop_signals_raise

    def callback(phase, info):
        gc.callbacks.remove(callback)
        raise loop.Terminated(signal.SIGHUP)  # as the handler would, inside the callback

    with pytest.raises(loop.Terminated) as stopped, stop_signals_raise():
        gc.callbacks.append(callback)
        gc.collect()
        time.sleep(10)  # the stop comes again meanwhile
    assert stopped.value.signum == signal.SIGHUP


@NEEDS_SIGHUP
@pytest.mark.slow  # 13 s of the quick suite; test_a_stop_saves_and_exits_with_its_code stops a run there
def test_a_stop_during_the_final_evaluation_says_the_last_step_is_saved(
    tmp_path, capsys, monkeypatch
):
    real = evaluate.Evaluation.final

    def hang_up_first(self, *args):
        os.kill(os.getpid(), signal.SIGHUP)
        return real(self, *args)

    monkeypatch.setattr(evaluate.Evaluation, "final", hang_up_first)
    with pytest.raises(loop.Terminated):
        loop.train(small_config(), run_config(tmp_path, steps=4), progress=False)
    assert checkpoints.Checkpointer(tmp_path).latest_step() == 4
    assert not (tmp_path / "summary.json").exists()
    where = tmp_path.resolve() / "checkpoints"
    assert capsys.readouterr().err == (
        f"terminated by SIGHUP during the final evaluation: saved step 4 in {where}; "
        "continue with resume=True\n"
    )


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--data-tsv", "/no/such/file.tsv"], "no such file"),
        (["--steps", "0"], "steps must be >= 1, got 0"),
        (["--steps", "-5"], "steps must be >= 1, got -5"),
        (["--batch-size", "ten"], "argument --batch-size: invalid int value: 'ten'"),
        (["--config", "BADKEY"], r"unknown model key\(s\) \['d_modle'\] \(did you mean 'd_model'"),
        (["--config", "BADJSON"], "not valid JSON"),
        (["--data-tsv", "MALFORMED"], r"pairs.tsv:2: expected 'source<TAB>target'"),
        (
            ["--task", "copy", "--data-tsv", "x.tsv"],
            "give one of --task, --data-tsv, --data-text, --dataset or --data-shards",
        ),
        (["--accum-steps", "3"], "--batch-size=64 is not divisible by --accum-steps=3"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, match):
    (tmp_path / "bad.json").write_text(json.dumps({"d_modle": 8}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "pairs.tsv").write_text("a\tb\nno tab\n")
    subst = {
        "BADKEY": str(tmp_path / "bad.json"),
        "BADJSON": str(tmp_path / "broken.json"),
        "MALFORMED": str(tmp_path / "pairs.tsv"),
    }
    argv = [subst.get(a, a) for a in argv]
    try:
        code = main(["train", *argv, "--out", str(tmp_path / "out"), "--no-progress"])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("jaxformer train: error:"), err
    assert re.search(match, err[0]), err


def test_cli_trains_a_language_model_on_text(tmp_path):
    text = tmp_path / "book.txt"
    text.write_text("\n\n".join(f"paragraph {i}: the quick brown fox jumps" for i in range(80)))
    code = main(
        [
            "train",
            "--data-text",
            str(text),
            *"--seq-len 32 --steps 4 --batch-size 4".split(),
            "--config",
            config_file(tmp_path),
            "--out",
            str(tmp_path / "lm"),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "lm" / "summary.json").read_text())
    assert summary["model_kind"] == "DecoderLM" and "exact_match" not in summary
    assert math.isfinite(summary["eval_perplexity"])


def test_yaml_config_file(tmp_path):
    from jaxformer.config import load_config_file

    path = tmp_path / "model.yaml"
    path.write_text("d_model: 48\nnum_heads: 4\nnorm_placement: pre\n")
    assert load_config_file(str(path)) == {"d_model": 48, "num_heads": 4, "norm_placement": "pre"}
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="expected a mapping of config fields"):
        load_config_file(str(path))


def test_train_help_lists_every_config_field_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    names = [*jf.RunConfig.options(), *(f.name for f in dataclasses.fields(jf.TransformerConfig))]
    for name in names:
        assert f"--{name.replace('_', '-')}" in text, name
    for group in ("data", "optim", "eval", "runtime"):  # one argument group each
        assert f"{group} (RunConfig.{group}):" in text, group
    assert "optimizer steps (default: 1500)" in text
    assert "examples (rows) per step (default: 64)" in text
    assert "model dimension (tiny: 128)" in text


SUMMARY_KEYS = [
    *"steps steps_run wall_seconds seconds_to_first_step train_tokens_per_second".split(),
    *"eval_loss eval_nll eval_perplexity token_accuracy exact_match".split(),
    *"eval_beam final_eval averaged_eval averaged_steps".split(),
    *"params device machine code versions layout model_kind model_config run".split(),
    *"final_test test_exact_match test_pairs eval_seconds test_seconds train_seconds".split(),
]
TRAIN = "step grad_norm loss lr nll perplexity token_accuracy tokens_per_second wall_seconds"
EVAL = "eval_loss eval_nll eval_perplexity eval_token_accuracy exact_match eval_pairs eval_beam"
RECORDS = [
    (2, TRAIN),
    (2, f"step {EVAL} eval_seconds"),  # the in-run evaluation
    (3, "step hook"),
    (4, TRAIN),
    (4, "step hook"),  # the caller's at_end hook, before the final evaluation
    (4, f"step {EVAL}"),  # the last step's parameters, every dev pair
    (4, f"step averaged_steps {EVAL}"),  # the mean of the last 2 checkpoints
    (4, "step test_exact_match test_pairs"),  # the final model on the test pairs
]
SHOWN = [
    "training on one device (cpu), vocabulary of # ids (the tokenizer's)",
    "step #/#: loss #, lr #, # tokens/s",
    "step #: held-out NLL # (perplexity #), token accuracy #%, exact match #%",
    "step #/#: loss #, lr #, # tokens/s",
    "step #: held-out NLL # (perplexity #), token accuracy #%, exact match #%",
    "mean of the checkpoints of steps #, #: held-out NLL # (perplexity #), token accuracy #%, "
    "exact match #%",
]


def test_a_finished_runs_summary_records_and_report(tmp_path, capsys, monkeypatch):
    """The summary's keys in order, metrics.jsonl's records in order, the files and the
    lines shown, of a 4-step run with an in-run evaluation, a caller's at_end hook,
    checkpoint averaging and a test set (attached to the task's data)."""
    build = setup.build_data

    def with_test_pairs(run, tokenizer=None, **kw):
        tokenizer, data = build(run, tokenizer, **kw)
        data.test_pairs = data.dev_pairs[:3]
        return tokenizer, data

    def mark(context):
        context.folder.log({"step": context.step, "hook": "mark"})

    monkeypatch.setattr(setup, "build_data", with_test_pairs)
    run = run_config(
        tmp_path, steps=4, log_every=2, eval_every=2, checkpoint_every=1, keep_checkpoints=3,
        average_checkpoints=2, final_test=True, eval_examples=8, eval_sample=4,
    )  # fmt: skip
    summary = loop.train(small_config(), run, hooks=[jf.train.Hook(3, mark, "mark", at_end=True)])
    assert list(summary) == SUMMARY_KEYS
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], " ".join(r)) for r in records] == RECORDS
    in_run, final, averaged, tested = records[1], records[5], records[6], records[7]
    assert (in_run["eval_pairs"], final["eval_pairs"], final["eval_beam"]) == (4, 8, 1)
    assert summary["final_eval"] == {k: v for k, v in final.items() if k != "step"}
    assert averaged["averaged_steps"] == summary["averaged_steps"] == [3, 4]
    assert summary["averaged_eval"] == {k: averaged[k] for k in EVAL.split()}
    assert summary["eval_nll"] == averaged["eval_nll"]  # the delivered model: the average
    assert summary["token_accuracy"] == averaged["eval_token_accuracy"]
    assert summary["test_pairs"] == tested["test_pairs"] == 3 and summary["final_test"] is True
    assert summary["test_exact_match"] == tested["test_exact_match"]
    assert in_run["eval_seconds"] < summary["eval_seconds"] and summary["test_seconds"] > 0
    spent = summary["eval_seconds"] + summary["test_seconds"]
    assert summary["train_seconds"] == pytest.approx(summary["wall_seconds"] - spent, abs=0.025)
    assert (summary["steps"], summary["steps_run"]) == (4, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        *"attention.png averaged checkpoints config.json loss.png metrics.jsonl".split(),
        *"predictions.tsv summary.json test_predictions.tsv tokenizer.json".split(),
    ]
    assert (tmp_path / "predictions.tsv").read_text().count("\n") == 8
    assert (tmp_path / "test_predictions.tsv").read_text().count("\n") == 3
    lines = capsys.readouterr().out.splitlines()
    numbers = r"\d+([.,]\d+)*(e[+-]\d+)?"
    assert lines[0] == f"code: {summary['code']}" and summary["code"] == code_version()
    assert summary["versions"]["jax"] == jax.__version__
    assert summary["machine"] == describe_device()
    assert [re.sub(numbers, "#", line) for line in lines[1 : len(SHOWN) + 1]] == SHOWN
    assert lines[-4].startswith("mean of the checkpoints of steps 3, 4: held-out NLL")
    assert lines[-3] == "test (3 pairs, final model): exact match " + lines[-3].split()[-1]
    assert lines[-2] == f"results in {tmp_path}/: summary.json metrics.jsonl attention.png loss.png"
    assert lines[-1].startswith(f"next: jaxformer generate --checkpoint {tmp_path} --input ")
