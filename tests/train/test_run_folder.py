"""The pieces of the training loop on their own: the run folder and the report."""

import json

import optax
import pytest
from flax import nnx

import jaxformer as jf
from jaxformer import plots, train
from jaxformer.parallel import make_placement
from jaxformer.train import report
from jaxformer.train.run_folder import RunFolder

META = {"model_kind": "DecoderLM", "model_config": {}, "run": {"seed": 0}}


def open_folder(path, meta=META):
    """A run folder whose states are laid out on one device."""
    return RunFolder(path, placement=make_placement(), meta=meta)


def tiny_state(step: int):
    config = jf.TransformerConfig.tiny(11, num_decoder_layers=1, d_model=8, num_heads=2, d_ff=16)
    _, state = train.create_train_state(
        jf.DecoderLM(config, rngs=nnx.Rngs(0)), optax.adam(1e-3), seed=0
    )
    return state.replace(step=state.step + step)


def test_a_fresh_folder_then_a_refusal_then_a_resume(tmp_path):
    out = tmp_path / "run"
    folder = open_folder(out)
    assert folder.start(resume=False) is False  # nothing to resume: a fresh start
    for step in (1, 2, 3):
        folder.log({"step": step, "loss": 1.0 / step, "wall_seconds": 10.0 * step})
    folder.log({"step": 2, "bleu": 1.0, "eval_seconds": 4.0})
    folder.log({"step": 3, "bleu": 2.0, "eval_seconds": 9.0})
    assert folder.save(tiny_state(2)) == 2
    assert folder.save(tiny_state(2)) == 2  # saved already: skipped (orbax refuses a step twice)
    folder.close()
    with pytest.raises(ValueError, match=r"already holds checkpoints \(latest step 2\)"):
        open_folder(out).start(resume=False)
    again = open_folder(out)
    assert again.start(resume=True) is True
    state = again.restore(tiny_state(0))
    assert int(state.step) == 2
    steps = [json.loads(line)["step"] for line in again.metrics_path.read_text().splitlines()]
    assert steps == [1, 2, 2]  # step 3 will run again: its records are dropped
    assert again.resumed_seconds == {"wall_seconds": 20.0, "eval_seconds": 4.0}
    with pytest.raises(ValueError, match=r"different configuration: seed=0 \(checkpoint\) vs 1"):
        open_folder(out, META | {"run": {"seed": 1}}).restore(tiny_state(0))
    again.close()


def test_resume_without_a_checkpoint_starts_afresh(tmp_path, capsys):
    folder = open_folder(tmp_path / "run")
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 5, "loss": 1.0}\n')
    assert folder.start(resume=True) is False
    assert folder.metrics_path.read_text() == ""
    assert "starting from step 0" in capsys.readouterr().out
    folder.close()


def test_a_file_is_not_a_run_folder(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(ValueError, match="taken exists and is not a folder"):
        open_folder(tmp_path / "taken")


def test_progress_off_a_terminal_prints_plain_lines(capsys):
    progress = report.Progress(True, start=0, total=100)
    assert progress.bar is None  # pytest's stderr is not a terminal
    for step in range(1, 101):
        progress.show({"step": step, "loss": 1.0, "lr": 1e-3, "tokens_per_second": 10.0})
        progress.advance()
    progress.close()
    out = capsys.readouterr()
    assert "\r" not in out.out + out.err
    assert out.out.count("\n") == 10 and out.out.startswith("step 10/100: loss 1.0000")


def test_the_final_report_aligns_long_cells_and_counts_this_runs_steps(tmp_path, capsys):
    summary = {
        "steps": 200,
        "steps_run": 121,
        "wall_seconds": 26.0,
        "train_tokens_per_second": 1e4,
        "params": 1234,
        "eval_nll": 0.5,
        "eval_perplexity": 1.65,
        "token_accuracy": 0.9,
        "exact_match": 0.5,
    }
    examples = [("a short input", "2001-03-03 and then some", "2001-03-03"), ("x", "y", "y")]
    report.print_summary(summary, examples, tmp_path)
    lines = capsys.readouterr().out.splitlines()
    header, first, second = [line for line in lines if line][:3]
    at = {word: header.index(word) for word in ("prediction", "target", "correct")}
    for row, cells in ((first, examples[0][1:] + ("NO",)), (second, ("y", "y", "yes"))):
        for column, cell in zip(at.values(), cells, strict=True):
            assert row[column:].startswith(cell), (row, cell)
    assert "200 steps in 26 s in all, steps 80-200 in this process" in "\n".join(lines)
    report.print_summary(summary | {"steps_run": 0, "train_tokens_per_second": 0.0}, [], tmp_path)
    line = capsys.readouterr().out.splitlines()[1]
    assert line == (
        "200 steps in 26 s in all (the run was already complete: no steps in this process), "
        "1,234 parameters"
    )


def test_loss_png_labels_say_which_metrics_are_teacher_forced_and_which_decoded(
    tmp_path, monkeypatch
):
    """NLL and token accuracy are teacher-forced on all held-out pairs in every evaluation
    (one series each); exact match decodes the first eval_sample pairs during the run and
    all of them at the end (a series per protocol)."""
    train = [{"step": s, "loss": 1.0 / s, "nll": 0.9 / s} for s in (10, 20)]
    scores = dict(eval_loss=1.0, eval_nll=0.5, eval_token_accuracy=0.8, exact_match=0.4)
    in_run = dict(scores, step=10, eval_pairs=200, eval_beam=1)
    final = dict(scores, step=20, eval_pairs=1000, eval_beam=1)
    lines = "".join(json.dumps(r) + "\n" for r in [*train, in_run, final])
    (tmp_path / "metrics.jsonl").write_text(lines)
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, out: figures.append(fig))
    plots.loss_curves(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    loss, accuracy = figures[0].axes[:2]
    labels = [line.get_label() for line in loss.get_lines() + accuracy.get_lines()]
    forced = "(teacher-forced, all 1,000 held-out pairs)"
    assert labels == [
        "train (label-smoothed)",
        "train NLL",
        f"held-out NLL {forced}",
        f"token accuracy {forced}",
        "exact match (200 pairs, greedy)",
        "exact match (1,000 pairs, greedy)",
    ]
    assert list(loss.get_lines()[2].get_xdata()) == [10, 20]  # one series: in-run and final


def test_a_checkpoint_written_with_nnx_variables_resumes_as_plain_arrays(tmp_path):
    """Before the train state was plain arrays, checkpoints held the parameters and Adam's
    moments as nnx Variables (each array under "value"): such a folder still resumes, and
    a checkpoint written now has the same layout on disk."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    config = jf.TransformerConfig.tiny(11, num_decoder_layers=1, d_model=8, num_heads=2, d_ff=16)
    _, variables = nnx.split(jf.DecoderLM(config, rngs=nnx.Rngs(0)))
    old = {"step": jax.numpy.array(7), "opt_state": optax.adam(1e-3).init(variables)}
    old["rng"] = jax.random.PRNGKey(0)
    manager = ocp.CheckpointManager(tmp_path / "checkpoints")
    items = dict(params=variables, train=old, meta=META)
    args = {
        k: ocp.args.JsonSave(v) if k == "meta" else ocp.args.StandardSave(v)
        for k, v in items.items()
    }
    manager.save(7, args=ocp.args.Composite(**args))
    manager.wait_until_finished()
    folder = open_folder(tmp_path)
    assert folder.start(resume=True)
    state = folder.restore(tiny_state(0))
    assert int(state.step) == 7 and isinstance(state.params["inputs"]["embed"]["table"], jax.Array)
    want = jax.tree.leaves(variables)
    for got, expected in zip(jax.tree.leaves(state.params), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    folder.save(state.replace(step=state.step + 1))
    saved = manager.item_metadata(8)["params"]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(saved)[0]]
    assert len(paths) == len(want) and all(p.endswith("['value']") for p in paths)


def test_a_refused_resume_keeps_the_averaged_parameters(tmp_path):
    """A resume whose checkpoint was written for another configuration is refused before
    anything in the folder is removed; a resume that restores removes averaged/ (the
    run's end writes it again)."""
    out = tmp_path / "run"
    folder = open_folder(out)
    folder.start(resume=False)
    folder.save(tiny_state(2))
    folder.close()
    (out / "averaged").mkdir()
    (out / "averaged" / "kept").write_text("the parameters of the run's end")
    other = open_folder(out, META | {"run": {"seed": 1}})
    with pytest.raises(ValueError, match=r"different configuration: seed=0 \(checkpoint\) vs 1"):
        other.start(resume=True)
    other.close()
    assert (out / "averaged" / "kept").is_file()
    same = open_folder(out)
    assert same.start(resume=True) is True
    assert (out / "averaged").is_dir()  # kept until the checkpoint is restored
    same.restore(tiny_state(0))
    assert not (out / "averaged").exists()
    same.close()
