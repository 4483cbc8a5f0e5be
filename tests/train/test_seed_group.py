"""k seeds of one run in one process (jaxformer.train.seeds), vmapped or stepped in
turn: each seed's folder holds what its separate run's holds, with the same figures to
float rounding."""

import json
import math

import numpy as np
import pytest

from jaxformer import checkpoints, cli
from jaxformer.train import evaluate, loop, seeds
from jaxformer.train.seeds import seed_runs, train_seeds
from tests.train.test_loop import losses, run_config, small_config

SEEDS = (0, 1)
# Per-seed losses and evaluation against separate runs: the vmapped step sums in another
# order, so they agree to float32 rounding carried through 20 Adam steps, not to the bit.
RTOL = 1e-4


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _clock(key: str) -> bool:
    return "seconds" in key or "per_second" in key


@pytest.mark.parametrize(
    "vmapped",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # vmapped: the slow test below too
)
def test_seeds_together_leave_the_folders_and_figures_of_separate_runs(
    tmp_path, monkeypatch, vmapped
):
    """Vmapped, each seed's figures are its separate run's to RTOL; stepped in turn (the
    CPU's default), its losses are its separate run's to the bit."""
    alone = evaluate.translate
    runs = seed_runs(run_config(tmp_path / "group"), SEEDS)
    with monkeypatch.context() as patch:  # the group decodes its seeds' dev pairs together
        patch.setattr(evaluate, "translate", lambda *a, **k: pytest.fail("a seed decoded alone"))
        config = small_config(dropout_rate=0.1)
        summaries = train_seeds(config, runs, progress=False, vmapped=vmapped)
    assert evaluate.translate is alone
    for seed, summary in zip(SEEDS, summaries, strict=True):
        mine, alone = tmp_path / "group" / f"seed{seed}", tmp_path / f"alone{seed}"
        expected = loop.train(
            small_config(dropout_rate=0.1), run_config(alone, seed=seed), progress=False
        )
        assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in alone.iterdir())
        assert checkpoints.Checkpointer(mine).latest_step() == 20
        got, want = losses(mine), losses(alone)
        assert list(got) == list(want)
        rtol = RTOL if vmapped else 0
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=rtol)
        assert list(summary) == list(expected) and summary["steps"] == 20
        figures = [k for k, v in expected.items() if isinstance(v, float) and not _clock(k)]
        assert "eval_nll" in figures and "exact_match" in figures
        for key in figures:
            np.testing.assert_allclose(summary[key], expected[key], rtol=RTOL, err_msg=key)
        assert [r["step"] for r in _records(mine)] == [r["step"] for r in _records(alone)]
    assert len({s["eval_nll"] for s in summaries}) == len(SEEDS)  # the seeds differ


@pytest.mark.slow  # 15 s: the first test decodes together too; tests/test_decode.py the beam
def test_in_run_and_beam_evaluations_decode_together_as_separate_runs(tmp_path, monkeypatch):
    options = dict(steps=12, eval_every=6, eval_sample=8, eval_beam=3, schedule="constant")
    runs = seed_runs(run_config(tmp_path / "group", **options), SEEDS)
    with monkeypatch.context() as patch:
        patch.setattr(evaluate, "translate", lambda *a, **k: pytest.fail("a seed decoded alone"))
        train_seeds(small_config(), runs, progress=False, vmapped=True)
    for seed in SEEDS:
        loop.train(small_config(), run_config(tmp_path / f"alone{seed}", seed=seed, **options))
        group = [r for r in _records(tmp_path / "group" / f"seed{seed}") if "exact_match" in r]
        alone = [r for r in _records(tmp_path / f"alone{seed}") if "exact_match" in r]
        assert [r["step"] for r in group] == [6, 12] == [r["step"] for r in alone]
        for mine, theirs in zip(group, alone, strict=True):  # greedy at 6, beam 3 at 12
            assert mine["exact_match"] == theirs["exact_match"]
            np.testing.assert_allclose(mine["eval_nll"], theirs["eval_nll"], rtol=RTOL)
        predictions = "predictions.tsv"
        assert (tmp_path / "group" / f"seed{seed}" / predictions).read_text() == (
            tmp_path / f"alone{seed}" / predictions
        ).read_text()


@pytest.mark.slow  # 15 s; tests/test_faults.py resumes stopped seeds too
def test_resumed_seeds_continue_together_and_must_be_at_one_step(tmp_path):
    runs = seed_runs(run_config(tmp_path, steps=10, schedule="constant"), (0, 1))
    train_seeds(small_config(), runs, progress=False)
    longer = seed_runs(run_config(tmp_path, steps=20, schedule="constant"), (0, 1))
    summaries = train_seeds(small_config(), longer, resume=True, progress=False)
    assert [s["steps_run"] for s in summaries] == [10, 10]
    assert [r["step"] for r in _records(tmp_path / "seed1") if "loss" in r] == list(range(1, 21))
    more = seed_runs(
        run_config(tmp_path, steps=30, schedule="constant"), (0, 1, 2)
    )  # seed 2 has not started
    with pytest.raises(ValueError, match="resumed seeds must be at one step"):
        train_seeds(small_config(), more, resume=True, progress=False)


def test_runs_that_are_not_one_configuration_are_refused(tmp_path):
    a, b = seed_runs(run_config(tmp_path), (0, 1))
    other = run_config(tmp_path / "seed1", seed=1, lr=1e-3)
    with pytest.raises(ValueError, match=r"only in seed and out; these differ: \[.lr.\]"):
        train_seeds(small_config(), [a, other])
    with pytest.raises(ValueError, match="each seed needs its own out"):
        train_seeds(small_config(), [a, run_config(a.runtime.out, seed=1)])
    with pytest.raises(ValueError, match="seeds must be distinct"):
        seed_runs(a, (1, 1))
    profiled = seed_runs(run_config(tmp_path, profile="2:3"), (0, 1))
    with pytest.raises(ValueError, match=r"this run sets \['profile'\]"):
        train_seeds(small_config(), profiled)
    assert not (tmp_path / "seed0").exists()  # refused before any folder


def token_runs(tmp_path, out, seeds):
    """Runs of `seeds` in `out` on a small TSV file, batches of at most 96 tokens a side."""
    path = tmp_path / "pairs.tsv"
    words = "the cat sat on a red mat and ran to the big dog".split()
    lines = [f"{' '.join(words[: 1 + i % 12])}\t{' '.join(words[i % 12 :])}\n" for i in range(120)]
    path.write_text("".join(lines))
    fields = dict(task=None, data_tsv=str(path), batch_tokens=96, seq_len=32, steps=4)
    return seed_runs(run_config(out, **fields), seeds)


def test_token_batches_refuse_one_vmapped_step_for_seeds(tmp_path):
    """batch_tokens: each batch holds the rows its lengths allow, so seeds differ in rows."""
    runs = token_runs(tmp_path, tmp_path / "g", (0, 1))
    with pytest.raises(ValueError, match="batch_tokens=96: the seeds' batches differ in rows"):
        train_seeds(small_config(), runs, progress=False, vmapped=True)
    assert not (tmp_path / "g").exists()  # refused before anything started


@pytest.mark.slow  # 25 s: three token-batch runs
def test_token_batch_seeds_stepped_in_turn_train_as_separate_runs(tmp_path):
    summaries = train_seeds(
        small_config(), token_runs(tmp_path, tmp_path / "g", (0, 1)), progress=False
    )
    assert all(math.isfinite(s["final_eval"]["eval_loss"]) for s in summaries)
    (alone,) = token_runs(tmp_path, tmp_path / "alone", (1,))
    loop.train(small_config(), alone, progress=False)
    assert losses(tmp_path / "alone" / "seed1") == losses(tmp_path / "g" / "seed1")  # to the bit


@pytest.mark.parametrize("flag, vmapped", [("auto", None), ("on", True), ("off", False)])
def test_the_command_hands_vmap_seeds_to_train_seeds(tmp_path, monkeypatch, flag, vmapped):
    got = {}
    monkeypatch.setattr(seeds, "train_seeds", lambda *a, **k: got.update(k))
    argv = ["train", "--out", str(tmp_path), "--seeds", "0", "1", "--vmap-seeds", flag]
    assert cli.main([*argv, "--no-progress"]) == 0
    assert got["vmapped"] is vmapped
