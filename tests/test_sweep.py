"""Sweeps: the spec's checks, the statistics on known values, and a 2-variant x 2-seed
sweep of a few steps that writes its table and, run again after losing a run, reruns only
that one."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from jaxformer import sweep
from jaxformer.cli import main
from jaxformer.sweep import stats

BASE = dict(
    task="copy", steps=4, batch_size=8, eval_every=2, log_every=2, checkpoint_every=2,
    eval_examples=8, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
    num_decoder_layers=1, max_len=48,
)  # fmt: skip


VARIANT = pathlib.Path(__file__).resolve().parents[1] / "experiments/variants/squared_relu.py"


def write_spec(tmp_path, **fields):
    """Baseline and a registered variant of our own (squared ReLU), two seeds."""
    spec = dict(
        base=BASE,
        variants={"baseline": {}, "sq": {"activation": "squared_relu"}},
        seeds=2,
        variant_files=[str(VARIANT)],
    )
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec | {"out": str(tmp_path / "sweep")} | fields))
    return path


def test_mean_ci_is_the_t_interval():
    mean, half = stats.mean_ci([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303
    assert mean == 2.0 and half == pytest.approx(4.303 / 3**0.5)
    assert stats.mean_ci([5.0]) == (5.0, None)
    assert stats.mean_ci([1.0] * 40)[1] == 0.0
    with pytest.raises(ValueError, match="at least one value"):
        stats.mean_ci([])


def test_paired_bootstrap_p_values():
    refs = [f"the {w} sat on the mat near {v}" for w in ("cat", "dog", "cow") for v in range(20)]
    worse = [r.replace("sat on", "on").replace("near", "by") for r in refs]
    assert stats.paired_bleu_chrf(refs, list(refs), refs) == {"bleu": 1.0, "chrf": 1.0}
    assert all(p < 0.01 for p in stats.paired_bleu_chrf(worse, refs, refs).values())
    one_changed = refs[:-1] + [worse[-1]]
    assert all(p > 0.2 for p in stats.paired_bleu_chrf(refs, one_changed, refs).values())
    right = [True] * 30 + [False] * 30
    assert stats.paired_exact_match(right, list(right)) == 1.0
    assert stats.paired_exact_match([False] * 60, right) < 0.01
    one_more = right[:30] + [True] + right[31:]  # one sentence of 60 differs: not significant
    assert stats.paired_exact_match(right, one_more) > 0.05


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"variant": {}}, "unknown key 'variant'"),
        ({"variants": {}}, "variants must be a non-empty mapping"),
        (
            {"variants": {"a": {"d_modle": 32}}},
            "variant 'a': unknown field 'd_modle' .*did you mean 'd_model'",
        ),
        ({"variants": {"a": {"activation": "swishy"}}}, "variant 'a': activation must be one of"),
        ({"variants": {"a": {"seed": 3}}}, "'seed' is set by the sweep"),
        ({"seeds": 0}, "seeds must be a count >= 1"),
        ({"seeds": [1, 1]}, "seeds must be a count >= 1 or a list of distinct ints"),
        ({"baseline": "b"}, "baseline 'b' is not one of the variants"),
    ],
)
def test_bad_specs_are_one_clear_error(tmp_path, capsys, fields, message):
    path = write_spec(tmp_path, **fields)
    with pytest.raises(ValueError, match=message):
        sweep.Spec.load(path)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxformer sweep: error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()  # nothing ran


def test_predictions_with_any_character_pair_up(tmp_path):
    """A prediction may hold characters that str.splitlines() splits at ("\x1c", "\x85")."""
    from jaxformer.train.report import write_predictions

    (tmp_path / "summary.json").write_text("{}")
    pairs = [("abc", "abc"), ("de", "ed")]
    write_predictions(pairs, ["a\x1cb\x85", "e\td"], tmp_path / "predictions.tsv")
    rows = sweep.report._predictions(tmp_path)
    assert rows == [("abc", "abc", "a\x1cb\x85"), ("de", "ed", "e d")]


def test_p_values_compare_the_sentences_both_runs_translated(tmp_path):
    """A variant with another tokenizer may drop other overlong sources: the paired test
    then runs on the (source, reference) rows both runs hold, a repeated row as often as
    both hold it, and says how many."""
    from jaxformer.train.report import write_predictions

    refs = [(f"src {i}", f"the {i} cat sat") for i in range(40)] + [("same", "again")] * 2
    spec = write_spec(tmp_path, variants={"base": {}, "other": {}}, seeds=1)
    spec = sweep.Spec.load(spec)
    for name, rows in (("base", refs), ("other", refs[3:-1])):
        folder = spec.folder(name, 0)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"bleu": 1.0}))
        write_predictions(rows, [t for _, t in rows], folder / "predictions.tsv")
    p = sweep.report.p_values(spec, "other")
    assert p["sentences"] == 40 - 3 + 1 and p["bleu"] == 1.0 and p["exact_match"] == 1.0
    assert sweep.report._common([("a", "r", "x")], [("b", "r", "y")]) == []


def test_each_run_is_an_ordinary_train_command(tmp_path):
    spec = sweep.Spec.load(write_spec(tmp_path))
    args = sweep.train_command(spec, "sq", 1)
    assert args[:2] == ["train", "--config"] and "--resume" in args
    assert args[args.index("--seed") + 1] == "1"
    assert args[args.index("--out") + 1] == str(tmp_path / "sweep" / "sq" / "seed1")
    assert args[-2:] == ["--variants", str(VARIANT)]
    model = json.loads((tmp_path / "sweep" / "sq" / "seed1" / "model.json").read_text())
    assert model["activation"] == "squared_relu" and model["d_model"] == 16


@pytest.mark.slow  # five CLI runs: 70 s of a cold quick suite
def test_sweep_writes_its_table_and_reruns_only_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # the runs: one CPU device, not conftest's eight
    spec = sweep.Spec.load(write_spec(tmp_path))
    lines = []
    results = sweep.run(spec, jobs=2, say=lines.append)
    assert lines[0].endswith("4 runs, 0 already ended") and len(lines) == 5
    for name in ("baseline", "sq"):
        r = results["variants"][name]
        assert r["runs"] == {0: "done", 1: "done"}
        assert len(r["figures"]["eval_perplexity"]["values"]) == 2
    table = (spec.out / "results.md").read_text()
    assert "| baseline | 2/2 |" in table and "| sq | 2/2 |" in table
    assert (spec.out / "curves.png").stat().st_size > 0
    assert json.loads((spec.out / "results.json").read_text()) == json.loads(json.dumps(results))

    # A run that did not finish (its summary gone, its checkpoints kept) is the only one rerun.
    kept = {p: p.stat().st_mtime_ns for p in spec.out.glob("*/seed*/summary.json")}
    lost = spec.folder("sq", 1) / "summary.json"
    lost.unlink()
    lines = []
    sweep.run(spec, say=lines.append)
    assert lines[0].endswith("4 runs, 3 already ended") and len(lines) == 2
    assert "sq seed 1: done" in lines[1]
    assert "resumed from step 4" in (spec.folder("sq", 1) / "train.log").read_text()
    for path, mtime in kept.items():
        assert path.stat().st_mtime_ns == mtime or path == lost


@pytest.mark.slow
def test_killed_sweep_continues_where_it_stopped(tmp_path):
    """SIGKILL to the whole sweep (runner and run) mid-run; the same command finishes it."""
    path = write_spec(tmp_path, base=BASE | {"steps": 40, "checkpoint_every": 5, "eval_every": 20})
    command = [sys.executable, "-m", "jaxformer", "sweep", str(path), "--jobs", "1"]
    env = dict(os.environ, XLA_FLAGS="")
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    second = tmp_path / "sweep" / "baseline" / "seed1" / "checkpoints"
    deadline = time.time() + 300
    while not (second.is_dir() and any(p.name.isdigit() for p in second.iterdir())):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = tmp_path / "sweep" / "baseline" / "seed0" / "summary.json"
    finished = first.stat().st_mtime_ns
    assert subprocess.run(command, env=env, capture_output=True, text=True).returncode == 0
    assert first.stat().st_mtime_ns == finished
    assert "resumed from step" in (second.parent / "train.log").read_text()
    assert (tmp_path / "sweep" / "results.md").exists()
